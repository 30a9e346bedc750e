"""Ingest's pass over a file's lines: each line checked, routed, counted and stored.

The hot loop of ingest (quotaflow/ingest/pipeline.py holds the job around it). A good line
becomes one pending item row with its route (decided here, once), its body's
digest for in-job dedup and its tokens counted for the tenant's quota; a bad line
becomes a failed item and an error row naming the line and the reason, and never
fails the file. Batches (BatchRef) are cut as the lines go by, growing as the job does
(quotaflow/dispatch/batch_sizes.py).
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

import orjson

from quotaflow.budget.tokens import estimate_tokens, max_output_tokens, prompt_parts
from quotaflow.config import Settings
from quotaflow.constants import (
    ANTHROPIC_PARAMS,
    INPUT_ONLY_ENDPOINTS,
    OUTPUT_ANTHROPIC,
    OUTPUT_OPENAI,
)
from quotaflow.deployments.catalog import Deployments
from quotaflow.deployments.pricing import TokenTally, count_above
from quotaflow.dispatch.batch_sizes import sizes_for
from quotaflow.dispatch.queues import BatchRef
from quotaflow.errors import InputFileError, LineProblem
from quotaflow.ingest.bulkwrite import RowWriter
from quotaflow.ingest.dedup import SeenFilter, shares
from quotaflow.ingest.formats import LineRejected, body_digest, canonical_body, line_custom_id
from quotaflow.ingest.formats import to_request as _to_request
from quotaflow.ingest.jsonlines import load_object, read_screened_lines
from quotaflow.jobs.service import new_request_id
from quotaflow.providers.outcomes import FailureCode
from quotaflow.tenants import quotas
from quotaflow.tenants.grants import Allowlist

# A line asking for cache writes (Anthropic's cache_control, on a block or the request)
# names this key; a line that merely quotes it is counted as asking, which only raises
# the estimate's high bound.
CACHE_CONTROL = b'"cache_control"'
MAX_PROBLEMS = 1000  # line problems kept for the refusal message (as many as the API shows)
MAX_SUSPECTS = 100_000  # past this many possibly-repeated bodies, dedup scans the whole job
_MAX_MODELS = 1000  # models whose routing is remembered during one file


@dataclass(slots=True)
class RouteTally:
    """The valid lines of one route: how many, their prompt tokens (about characters / 4,
    as providers count at admission) and the most completion tokens they may use."""

    route: str
    default_max_tokens: int  # the ceiling of a request that sets none
    requests: int = 0
    prompt_tokens: int = 0
    max_completion_tokens: int = 0
    # What its cost estimate tells apart (pricing.Tallied): the prompt tokens of lines
    # asking for cache writes, and the lines over each long-context threshold; counted
    # only where the route's prices differ for them (Deployments.route_price_marks).
    cache_write_tokens: int = 0
    above: dict[int, TokenTally] = field(default_factory=dict)
    thresholds: tuple[int, ...] = ()
    writes_priced: bool = False


class LineScan:
    """The pass over the file: what it found, and the rows it wrote on the way."""

    def __init__(self, job_id: str, settings: Settings, deployments: Deployments,
                 room: quotas.Headroom | None, max_lines: int | None = None,
                 batch_endpoint: str | None = None, dedup: bool | None = None,
                 allow: Allowlist | None = None, refuse_disallowed: bool = False) -> None:
        self.job_id = job_id
        # The models and deployments the job's key may use; a line outside them fails
        # `model_not_allowed`, or, for a batch validated as a whole, refuses the file.
        self.allow = allow if allow is not None and allow.limits else None
        self.refuse_disallowed = refuse_disallowed
        self.not_allowed: list[LineProblem] = []
        # The job's choice on sharing identical lines (None: dedup.answer_is_fixed's rule).
        self.dedup = dedup
        self.settings = settings
        self.deployments = deployments
        self.room = room
        self.max_lines = max_lines or settings.max_lines
        # A batch names its endpoint up front: a line for another refuses the file.
        self.batch_endpoint = batch_endpoint
        self.endpoint = batch_endpoint
        # The format of the file's first request line (OpenAI's, or Anthropic's): a job's
        # output lines are in it unless the job asks for the other.
        self.input_format = OUTPUT_OPENAI
        self._first = True
        self.total = self.valid = self.tokens = 0
        self.problems: list[LineProblem] = []
        self.wrong_endpoint: list[LineProblem] = []
        self.batches: list[BatchRef] = []
        # Each batch's (requests, admission tokens): the order it is queued in (mixing.py).
        self.batch_loads: list[tuple[int, int]] = []
        in_job = dedup if dedup is not None else settings.dedup
        self.seen = SeenFilter(self.max_lines) if in_job else None
        self.suspects: set[bytes] | None = set()
        self._routed: dict[str | None, str | None] = {}
        # Per route: what a cost or time estimate needs (spend limits, `quotaflow estimate`).
        self.routes: dict[str, RouteTally] = {}
        # Called with (line number, route, custom_id, prompt text, its images' and files'
        # tokens, its completion ceiling, whether it asks for priced cache writes) of each
        # valid line: what `quotaflow estimate` (quotaflow/ingest/estimate.py) counts
        # beside the tallies.
        self.on_valid: Callable[[int, str, str, str, int, int, bool], None] | None = None

    def run(self, stream: IO[bytes], writer: RowWriter) -> None:  # noqa: C901 (the hot loop)
        max_lines, seen, job_id, dedup = self.max_lines, self.seen, self.job_id, self.dedup
        sizes = sizes_for(self.settings)
        size = next(sizes)
        budget = (self.room.limit - self.room.held
                  if self.room is not None and self.room.limit is not None else None)
        first = last = count = batch_tokens = 0
        for line_no, raw, screened in read_screened_lines(stream, self.settings.max_line_bytes,
                                                          self.settings.max_file_bytes):
            if raw is not None and (not raw or raw.isspace()):
                continue
            self.total += 1
            if self.total > max_lines:
                raise InputFileError(f"the file has more than {max_lines} requests "
                                     f"({self._lines_setting}); split it into several jobs")
            if raw is None:
                self._bad(writer, line_no, None, "line is longer than the limit of "
                                                 f"{self.settings.max_line_bytes} bytes")
                continue
            obj = load_object(raw, screened)
            if isinstance(obj, str):
                self._bad(writer, line_no, None, obj)
                continue
            try:
                request = _to_request(line_no, obj)
            except LineRejected as exc:
                self._bad(writer, line_no, line_custom_id(obj), str(exc))
                continue
            route, reason = self._route(line_no, request.url, request.body)
            if route is None:
                self._bad(writer, line_no, request.custom_id, reason)
                continue
            if self.allow is not None and (refused := self.allow.refusal(
                    request.body.get("model"), route, self.deployments)) is not None:
                if self.refuse_disallowed and len(self.not_allowed) < MAX_PROBLEMS:
                    self.not_allowed.append(LineProblem(line_no, refused))
                self._bad(writer, line_no, request.custom_id, refused,
                          FailureCode.MODEL_NOT_ALLOWED)
                continue
            body = canonical_body(request.body)
            # Hashed only where an identical line may share its answer (in this job, or a
            # later one's with QUOTAFLOW_DEDUP_ACROSS_JOBS): a sampled line is always sent.
            digest = (body_digest(request.url, body)
                      if shares(dedup, True, request.url, request.body) else None)
            text, fixed = prompt_parts(request.url, request.body)
            prompt = estimate_tokens(text) + fixed
            self.tokens += prompt
            tally = self.routes.get(route)
            if tally is None:
                tally = self.routes[route] = self._tally(route)
            tally.requests += 1
            tally.prompt_tokens += prompt
            completion = (0 if request.url in INPUT_ONLY_ENDPOINTS
                          else max_output_tokens(request.body, tally.default_max_tokens))
            tally.max_completion_tokens += completion
            writes = tally.writes_priced and CACHE_CONTROL in raw
            if writes:
                tally.cache_write_tokens += prompt
            if tally.thresholds:
                count_above(tally.above, tally.thresholds, prompt, completion, writes)
            batch_tokens += prompt + completion
            if self.on_valid is not None:
                self.on_valid(line_no, route, request.custom_id, text, fixed, completion,
                              writes)
            if budget is not None and self.tokens > budget:
                assert self.room is not None
                self.room.refuse_if_over(self.tokens)
            writer.pending(line_no, request.custom_id, body, digest, route)
            self.valid += 1
            if (seen is not None and digest is not None and seen.add(digest)
                    and self.suspects is not None):
                self.suspects.add(digest)
                if len(self.suspects) > MAX_SUSPECTS:
                    self.suspects = None
            if count == 0:
                first = line_no
            last = line_no
            count += 1
            if count == size:
                self.batches.append(BatchRef(job_id, first, last))
                self.batch_loads.append((count, batch_tokens))
                count = batch_tokens = 0
                size = next(sizes)
        if count:
            self.batches.append(BatchRef(job_id, first, last))
            self.batch_loads.append((count, batch_tokens))

    def _tally(self, route: str) -> RouteTally:
        thresholds, writes_priced = self.deployments.route_price_marks(route)
        return RouteTally(route, self.deployments.route_max_tokens(route),
                          thresholds=thresholds, writes_priced=writes_priced)

    @property
    def _lines_setting(self) -> str:
        return "QUOTAFLOW_MAX_BATCH_LINES" if self.batch_endpoint else "QUOTAFLOW_MAX_LINES"

    def _route(self, line_no: int, url: str, body: dict[str, Any]) -> tuple[str | None, str]:
        """A well-formed request's route name, decided here once and stored with it; or
        None and why it cannot run in this job."""
        if self._first:
            self._first = False
            self.input_format = OUTPUT_ANTHROPIC if ANTHROPIC_PARAMS in body else OUTPUT_OPENAI
        if self.endpoint is None:
            self.endpoint = url
        elif url != self.endpoint:
            if self.batch_endpoint is not None:  # the file is refused
                self.wrong_endpoint.append(LineProblem(
                    line_no, f"url {url} differs from the batch's endpoint {self.endpoint}"))
            return None, (f"url {url} differs from the job's endpoint {self.endpoint}; "
                          "all lines of one file must use the same endpoint")
        model = body.get("model")
        if model in self._routed:
            route = self._routed[model]
        else:
            route = self.deployments.route_name_for(model)
            if len(self._routed) < _MAX_MODELS:
                self._routed[model] = route
        if route is None:
            return None, (f"no deployment serves model {model!r}; "
                          "add a route for it to the deployments file")
        return route, ""

    def _bad(self, writer: RowWriter, line_no: int, custom_id: str | None, reason: str,
             code: FailureCode = FailureCode.INVALID_REQUEST) -> None:
        """A refused line: a failed item and its error row, never a lost line."""
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(LineProblem(line_no, reason))
        error = orjson.dumps({"code": str(code), "line": line_no,
                              "message": f"line {line_no}: {reason}"})
        writer.invalid(line_no, custom_id, new_request_id(), error)
