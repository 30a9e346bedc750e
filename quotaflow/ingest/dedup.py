"""Identical requests within a job: stored once as sent, the copies waiting for its answer.

Only where the answer cannot differ (`answer_is_fixed`): five identical lines at
temperature 1 are five samples at OpenAI and Anthropic, so they are five calls here
too; a job may ask otherwise (`dedup=true`: share every identical line; `false`: none).
Ingest (quotaflow/ingest/pipeline.py) hashes every shareable request body as it streams past. A
SeenFilter remembers the hashes in a fixed-size bit array instead of a dict of
every line, so memory does not grow with the file; the few bodies it flags as
possibly repeated are then settled exactly in the database, which marks every
later copy `waiting` on the first one's line (duplicate_of). The workers share
the first answer with its copies (quotaflow/results/leases.py).
"""

import struct
from collections.abc import Iterator
from typing import Any

from sqlalchemy import bindparam, func, select, update
from sqlalchemy.orm import Session

from quotaflow.constants import ANTHROPIC_PARAMS, ENDPOINT_EMBEDDINGS, ENDPOINT_MODERATIONS
from quotaflow.dispatch.batch_sizes import cut
from quotaflow.dispatch.queues import BatchRef
from quotaflow.models import Item, ItemStatus

ITEMS = Item.__table__
# Endpoints whose answer is a function of the request: no sampling to repeat.
_FIXED_ENDPOINTS = frozenset({ENDPOINT_EMBEDDINGS, ENDPOINT_MODERATIONS})


def answer_is_fixed(url: str, body: dict[str, Any]) -> bool:
    """Whether two identical requests must get the same answer, so one call may serve both:
    an embeddings or moderations request, or a generation at temperature 0 that draws no
    samples (`n` at most 1, no `top_p` below 1). Without a temperature the provider's
    default (1 at OpenAI and Anthropic) samples, so such a line is sent every time.
    An Anthropic line's own params decide for it."""
    if url in _FIXED_ENDPOINTS:
        return True
    params = body.get(ANTHROPIC_PARAMS)
    if isinstance(params, dict):
        body = params
    temperature = body.get("temperature")
    if type(temperature) not in (int, float) or temperature != 0:
        return False
    n, top_p = body.get("n"), body.get("top_p")
    return (n is None or n == 1) and (top_p is None or (type(top_p) in (int, float)
                                                        and top_p >= 1))


def shares(job_dedup: bool | None, default_on: bool, url: str, body: dict[str, Any]) -> bool:
    """Whether a line of a job may share an identical line's answer: the job's own choice
    (True every identical line, False none), else the rule where QUOTAFLOW_DEDUP is on."""
    if job_dedup is not None:
        return job_dedup
    return default_on and answer_is_fixed(url, body)

_three_words = struct.Struct("<3Q").unpack_from
MAX_BITS_LOG2 = 27  # 2**27 bits: 16 MiB


class SeenFilter:
    """A Bloom filter of request digests in a fixed bit array (16 to 32 bits for each line
    the file may have: 4 MiB for 2M lines, never more than 16 MiB): it never misses a
    body seen before and rarely (about 0.1%) flags a new one, so only the flagged bodies
    need the database's exact check. Past 8M lines it flags more, which costs time
    (share_identical), never correctness."""

    def __init__(self, capacity: int) -> None:
        size = max(20, min(MAX_BITS_LOG2, (capacity * 16 - 1).bit_length()))
        self._bits = bytearray(1 << (size - 3))
        self._shift = 64 - size  # a position is the top bits of a 64-bit word

    def add(self, digest: bytes) -> bool:
        """Remember the digest (a SHA-256: its bytes are already uniform); True if it
        may have been added before. Three positions, from three words of it."""
        bits, shift = self._bits, self._shift
        a, b, c = _three_words(digest)
        a, b, c = a >> shift, b >> shift, c >> shift
        ia, ib, ic = a >> 3, b >> 3, c >> 3
        ma, mb, mc = 1 << (a & 7), 1 << (b & 7), 1 << (c & 7)
        seen = bool(bits[ia] & ma and bits[ib] & mb and bits[ic] & mc)
        bits[ia] |= ma
        bits[ib] |= mb
        bits[ic] |= mc
        return seen


def share_identical(session: Session, job_id: str, suspects: set[bytes] | None) -> int:
    """Later copies of a request wait for the first one's answer (status `waiting`,
    duplicate_of its line). Only the flagged bodies are looked at (all, when None).

    The copies are found first and then updated by primary key, one statement for all,
    rather than in one UPDATE ... FROM: inside the ingest transaction the planner has no
    statistics for the new job and may join the job's items with themselves. The
    flagged bodies are looked up by digest alone (its index), their job checked here.
    """
    copies: list[dict[str, int]] = []
    if suspects is None:
        first = func.min(ITEMS.c.line_no).over(partition_by=ITEMS.c.body_hash).label("first")
        every = (select(ITEMS.c.line_no, first)
                 .where(ITEMS.c.job_id == job_id, ITEMS.c.body_hash.is_not(None)).subquery())
        copies = [{"line": line, "first": first_line} for line, first_line in session.execute(
            select(every.c.line_no, every.c.first).where(every.c.line_no > every.c.first))]
    else:
        hashes = sorted(digest.hex() for digest in suspects)
        lines: dict[str, list[int]] = {}
        for start in range(0, len(hashes), 1000):
            for owner, line, digest in session.execute(
                    select(ITEMS.c.job_id, ITEMS.c.line_no, ITEMS.c.body_hash)
                    .where(ITEMS.c.body_hash.in_(hashes[start:start + 1000]))):
                if owner == job_id:
                    lines.setdefault(digest, []).append(line)
        for same in lines.values():
            first_line = min(same)
            copies.extend({"line": line, "first": first_line} for line in same
                          if line != first_line)
    if copies:
        session.execute(
            update(ITEMS)
            .where(ITEMS.c.job_id == job_id, ITEMS.c.line_no == bindparam("line"))
            .values(status=ItemStatus.WAITING, duplicate_of=bindparam("first"),
                    lease_expires_at=None), copies)
    return len(copies)


def pending_batches(session: Session, job_id: str, sizes: Iterator[int]) -> list[BatchRef]:
    """The job's pending lines as BatchRefs of the given sizes, read in order."""
    lines = session.scalars(select(Item.line_no)
                            .where(Item.job_id == job_id, Item.status == ItemStatus.PENDING)
                            .order_by(Item.line_no).execution_options(yield_per=10_000))
    return cut(job_id, lines, sizes)
