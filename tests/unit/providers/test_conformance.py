"""The conformance set's translations, in process: every line of tests/harness/conformance/ made
into the body each deployment family receives, compared field by field with the set's
expectations (the same checks run through Celery workers and the strict mock provider
in tests/cluster/test_conformance_cluster.py)."""

from typing import Any

import pytest

from quotaflow.deployments.deployment import Deployment
from quotaflow.errors import Untranslatable
from quotaflow.ingest.formats import to_request
from quotaflow.providers.capabilities import unserved
from quotaflow.providers.translate.body import request_body
from tests.harness import conformance
from tests.harness.conformance import field_diff

DEPLOYMENTS = {
    "openai": Deployment(name="gpt", provider="openai", base_url="http://127.0.0.1:1/v1",
                         model="gpt-conf", rpm=1000, tpm=1000000),
    "anthropic": Deployment(name="claude", provider="anthropic", base_url="http://127.0.0.1:1",
                            model="claude-conf", rpm=1000, tpm=1000000)}
CASES = [(name, entry, family) for name in conformance.names()
         for entry in conformance.lines(name) for family in DEPLOYMENTS]


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
