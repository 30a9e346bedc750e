"""Builders for input files, so each test says only what matters to it."""

import json
from pathlib import Path


def chat_line(custom_id: str, prompt: str | None = None, model: str = "gpt-4o-mini",
              max_tokens: int = 32) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "max_tokens": max_tokens,
                     "messages": [{"role": "user", "content": prompt or f"prompt of {custom_id}"}]}}


def jsonl(lines: list[dict | str]) -> bytes:
    return "".join((line if isinstance(line, str) else json.dumps(line)) + "\n"
                   for line in lines).encode()


def write_jsonl(path: Path, lines: list[dict | str]) -> Path:
    path.write_bytes(jsonl(lines))
    return path


def chat_file(path: Path, count: int, prefix: str = "req") -> Path:
    return write_jsonl(path, [chat_line(f"{prefix}-{i}") for i in range(count)])
