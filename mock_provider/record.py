"""Test-only: the request bodies the strict mock received, appended to a JSONL file.

`quotaflow mock-provider --record PATH` (QUOTAFLOW_MOCK_RECORD) writes one line per
model request, `{"path": "/v1/messages", "body": {...}}`, before the request is judged,
so a test can check field by field what quotaflow sent (tests/cluster/test_conformance_cluster.py
checks the OpenAI <-> Anthropic translations this way). Written from the event loop, one
short write per request: fine for tests, not meant for benchmarks.
"""

import json
from pathlib import Path

from fastapi import Request


class Recorder:
    """Appends what each model request carried to one file."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    async def record(self, request: Request) -> None:
        raw = await request.body()  # Starlette keeps it: the handler reads it again
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            body = raw.decode(errors="replace")
        line = json.dumps({"path": request.url.path, "body": body}, ensure_ascii=False)
        with self.path.open("a", encoding="utf-8") as file:
            file.write(line + "\n")
