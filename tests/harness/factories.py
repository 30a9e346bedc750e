"""Builders for input files, so each test says only what matters to it."""

import json
from pathlib import Path


def chat_line(custom_id: str, prompt: str | None = None, model: str = "gpt-4o-mini",
              max_tokens: int = 32, temperature: float | None = None) -> dict:
    """A chat batch line; with `temperature=0` identical lines share one answer."""
    body = {"model": model, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": prompt or f"prompt of {custom_id}"}]}
    if temperature is not None:
        body["temperature"] = temperature
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": body}


def jsonl(lines: list[dict | str]) -> bytes:
    return "".join((line if isinstance(line, str) else json.dumps(line)) + "\n"
                   for line in lines).encode()


def write_jsonl(path: Path, lines: list[dict | str]) -> Path:
    path.write_bytes(jsonl(lines))
    return path


def chat_file(path: Path, count: int, prefix: str = "req") -> Path:
    return write_jsonl(path, [chat_line(f"{prefix}-{i}") for i in range(count)])


def _chat_text(custom_id: str, extra: str = "", content: str = '"hi"') -> str:
    """A chat line written by hand, for what json.dumps will not write."""
    return ('{"custom_id": "' + custom_id + '", "method": "POST", "url": '
            '"/v1/chat/completions", "body": {"model": "gpt-4o-mini", "max_tokens": 8, '
            + extra + '"messages": [{"role": "user", "content": ' + content + "}]}}")


# Lines that once failed a whole upload (a 500, or a traceback from `quotaflow run`) and
# must each be one line's error: name -> (line, words of its reason, custom_id kept).
HOSTILE_LINES: dict[str, tuple[str, str, str | None]] = {
    "nested 100,000 deep": (
        '{"custom_id": "deep", "method": "POST", "url": "/v1/chat/completions", "body": '
        + "[" * 100_000 + "]" * 100_000 + "}", "nested more than 64 levels deep", None),
    "nested 1,000 deep in its body": (
        _chat_text("deep-body", '"extra": ' + "[" * 1000 + "]" * 1000 + ", "),
        "nested more than 64 levels deep", None),
    "a custom_id of 600 characters": (
        _chat_text("x" * 600), "custom_id is longer than 512 characters", None),
    "a lone surrogate": (_chat_text("surrogate", content='"\\ud800"'), "lone surrogate", None),
    "NaN": (_chat_text("nan", '"temperature": NaN, '), "NaN is not allowed", None),
    "-Infinity": (_chat_text("inf", '"temperature": -Infinity, '), "-Infinity is not allowed",
                  None),
    "an integer of 5,000 digits": (
        _chat_text("big", '"seed": ' + "9" * 5000 + ", "),
        "an integer of 5000 digits is out of range", None),
}
