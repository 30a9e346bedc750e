"""The conformance set's translations, in process: every line of tests/conformance/ made
into the body each deployment family receives, compared field by field with the set's
expectations (the same checks run through Celery workers and the strict mock provider
in tests/test_conformance_cluster.py)."""

import json
from typing import Any

import pytest

from quotaflow.capabilities import unserved
from quotaflow.deployments import Deployment
from quotaflow.errors import Untranslatable
from quotaflow.formats import to_request
from quotaflow.translate.body import request_body
from tests import conformance

DEPLOYMENTS = {
    "openai": Deployment(name="gpt", provider="openai", base_url="http://127.0.0.1:1/v1",
                         model="gpt-conf", rpm=1000, tpm=1000000),
    "anthropic": Deployment(name="claude", provider="anthropic", base_url="http://127.0.0.1:1",
                            model="claude-conf", rpm=1000, tpm=1000000)}
CASES = [(name, entry, family) for name in conformance.names()
         for entry in conformance.lines(name) for family in DEPLOYMENTS]


def field_diff(want: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """The top-level fields that differ, each with both values."""
    want, got = comparable(want), comparable(got)
    return [f"{key}: expected {want.get(key)!r}, sent {got.get(key)!r}"
            for key in sorted(set(want) | set(got)) if want.get(key) != got.get(key)]


def comparable(body: dict[str, Any]) -> dict[str, Any]:
    """Tool calls' `arguments` (JSON text) as the JSON they hold: the store keeps a line's
    JSON objects, not the order of their keys (PostgreSQL's jsonb), on either side."""
    body = json.loads(json.dumps(body))
    for message in body.get("messages") or ():
        for call in message.get("tool_calls") or () if isinstance(message, dict) else ():
            function = call.get("function") or {}
            if isinstance(function.get("arguments"), str):
                function["arguments"] = json.loads(function["arguments"])
    return body


def test_the_set_is_big_enough_and_its_names_unique() -> None:
    entries = [entry for name in conformance.names() for entry in conformance.lines(name)]
    assert len(entries) >= 30
    assert len({entry["name"] for entry in entries}) == len(entries)


@pytest.mark.parametrize(("name", "entry", "family"), CASES,
                         ids=[f"{entry['name']}->{family}" for _, entry, family in CASES])
def test_translation(name: str, entry: dict[str, Any], family: str) -> None:
    deployment = DEPLOYMENTS[family]
    request = to_request(1, entry["line"])  # ingest accepts every line of the set
    want = conformance.expected(entry, family)
    refused = unserved(deployment, request.url)
    if "unsupported" in want:
        assert refused is not None and refused.code == "unsupported_endpoint"
        assert request.url in refused.message and repr(deployment.name) in refused.message
        return
    assert refused is None, refused
    if "error" in want:
        with pytest.raises(Untranslatable) as caught:
            request_body(request.body, deployment)
        assert caught.value.param == want["error"], str(caught.value)
        assert " equivalent; remove it or route this model to " in str(caught.value)
        return
    got = request_body(request.body, deployment)
    assert got.pop("model") == deployment.model
    assert field_diff(want, got) == []
