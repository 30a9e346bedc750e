"""The rule for sharing identical lines (quotaflow/ingest/dedup.py): only where the answer
cannot differ, unless the job says otherwise. Unit tests, no server."""

import pytest

from quotaflow.ingest import dedup
from quotaflow.ingest.formats import to_request

CHAT = "/v1/chat/completions"


@pytest.mark.parametrize(("body", "fixed"), [
    ({}, False),
    ({"temperature": 1}, False),
    ({"temperature": 0.2}, False),
    ({"temperature": "0"}, False),
    ({"temperature": False}, False),
    ({"temperature": 0}, True),
    ({"temperature": 0.0, "n": 1}, True),
    ({"temperature": 0, "n": 2}, False),
    ({"temperature": 0, "top_p": 0.9}, False),
    ({"temperature": 0, "top_p": 1}, True),
])
def test_a_generation_is_fixed_only_at_temperature_zero_without_sampling(
        body: dict, fixed: bool) -> None:
    assert dedup.answer_is_fixed(CHAT, {"model": "m", "messages": [], **body}) is fixed
    assert dedup.answer_is_fixed("/v1/completions", {"prompt": "p", **body}) is fixed


def test_embeddings_and_moderations_are_always_fixed() -> None:
    assert dedup.answer_is_fixed("/v1/embeddings", {"input": "x", "temperature": 1})
    assert dedup.answer_is_fixed("/v1/moderations", {"input": "x"})


def test_an_anthropic_line_is_judged_by_its_own_params() -> None:
    params = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    hot = to_request(1, {"custom_id": "a", "params": params}).body
    cold = to_request(2, {"custom_id": "b", "params": {**params, "temperature": 0}}).body
    assert not dedup.answer_is_fixed(CHAT, hot)
    assert dedup.answer_is_fixed(CHAT, cold)


@pytest.mark.parametrize(("job", "default_on", "body", "shared"), [
    (None, True, {"temperature": 0}, True),
    (None, True, {"temperature": 1}, False),
    (None, False, {"temperature": 0}, False),
    (True, False, {"temperature": 1}, True),
    (False, True, {"temperature": 0}, False),
])
def test_the_jobs_choice_comes_first(job: bool | None, default_on: bool, body: dict,
                                     shared: bool) -> None:
    assert dedup.shares(job, default_on, CHAT, body) is shared
