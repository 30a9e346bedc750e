"""Test-only: the request bodies the strict mock received, appended to a JSONL file.

`quotaflow mock-provider --record PATH` (QUOTAFLOW_MOCK_RECORD) writes one line per
model request, `{"path": ..., "query": "", "headers": {...}, "body": {...}, "at": unix s}`,
before the request is judged (the headers that carry a secret as "<redacted>"),
so a test can check field by field what quotaflow sent (tests/cluster/test_conformance_cluster.py
checks the OpenAI <-> Anthropic translations this way). Written from the event loop, one
short write per request: fine for tests, not meant for benchmarks.
"""

import json
import time
from pathlib import Path

from fastapi import Request

# Headers that carry a key or a token: recorded as present, never as written.
SECRET_HEADERS = frozenset({"authorization", "api-key", "x-api-key", "x-identity-header"})


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
        headers = {name: "<redacted>" if name in SECRET_HEADERS else value
                   for name, value in request.headers.items()}
        line = json.dumps({"path": request.url.path, "query": request.url.query,
                           "headers": headers, "body": body, "at": time.time()},
                          ensure_ascii=False)
        with self.path.open("a", encoding="utf-8") as file:
            file.write(line + "\n")
