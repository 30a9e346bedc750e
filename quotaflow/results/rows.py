"""A result's row as the chunk writers store it: one dict per answer, built in one go.

Built for every answer a worker stores, so it is a single dict display: the row made
from keyword arguments and then updated twice for the outcome and its provenance, with
the provenance's three times turned into datetimes, cost several times as much.
The times stay the epoch seconds they were taken as: PostgreSQL's chunk statement turns
them into timestamps (store/postgres.py), and SQLite's writer makes datetimes of them
(store/sqlite.py).
"""

from typing import Any

from quotaflow.jobs.service import new_request_id
from quotaflow.jsoncodec import RawJson
from quotaflow.providers.base import ProviderResponse
from quotaflow.providers.outcomes import Failure, Outcome, Provenance, Shared


def result_row(line_no: int, custom_id: str | None, outcome: Outcome,
               record: Provenance | None) -> dict[str, Any]:
    """The row storing `outcome` for the line, but for what the whole chunk shares (its
    job, its time: the store's store_chunk adds them); every row
    names every column, so a chunk is one statement's shape."""
    error: dict[str, Any] | None
    response: RawJson | dict[str, Any] | None
    if isinstance(outcome, Failure):
        error = failure = {"code": str(outcome.code), "line": line_no,
                           "message": outcome.message}
        if outcome.attempts is not None:
            failure["attempts"] = outcome.attempts
        status, response, shared_from = outcome.status_code, outcome.body, None
        prompt = completion = 0
        provider_id = None
    elif isinstance(outcome, Shared):
        status, response, error, shared_from = (outcome.status_code, outcome.body, None,
                                                outcome.source)
        prompt = completion = 0
        provider_id = None
    else:
        status, response, error, shared_from = (outcome.status_code, _answer(outcome),
                                                None, None)
        prompt, completion, provider_id = (outcome.prompt_tokens, outcome.completion_tokens,
                                           outcome.request_id)
    if record is None:
        deployment = attempts = admitted_at = sent_at = answered_at = None
    else:
        deployment, attempts = record.deployment, record.attempts
        admitted_at, sent_at, answered_at = record.admitted_at, record.sent_at, record.answered_at
    return {"line_no": line_no, "custom_id": custom_id,
            "request_id": new_request_id(), "status_code": status,
            "response": response, "error": error, "prompt_tokens": prompt,
            "completion_tokens": completion, "shared_from": shared_from,
            "provider_request_id": provider_id, "deployment": deployment,
            "attempts": attempts, "admitted_at": admitted_at,
            "sent_at": sent_at, "answered_at": answered_at}


def _answer(outcome: ProviderResponse) -> RawJson | dict[str, Any]:
    """The answer as stored: the provider's own text, unless it holds a line break (a
    pretty-printed body), which the download's one line per result cannot carry; that
    one is written compact from its parsed body (results.response keeps text as written,
    migration 0018)."""
    raw = outcome.raw
    if raw is None or b"\n" in raw or b"\r" in raw:
        return outcome.body
    return RawJson(raw)
