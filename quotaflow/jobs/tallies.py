"""A job's request counts and usage, as the database keeps them current.

On PostgreSQL every statement that writes items or results adds its net change to
`job_tallies` in its own transaction (migration 0022's triggers), so a read sums a few
rows whatever the job's size: a status read of a million-line job costs what a ten-line
job's does. SQLite, the embedded single-process store, has no transition tables; there
the items and results are counted, as `recount` does everywhere (the tests compare the
two).
"""

from collections.abc import Sequence

from sqlalchemy import Column, Integer, MetaData, String, Table, func, select
from sqlalchemy.orm import Session
from sqlalchemy.types import BigInteger

from quotaflow import store
from quotaflow.models import Item, Result

# Not a model: only the triggers write it, and nothing reads a single row of it.
job_tallies = Table(
    "job_tallies", MetaData(),
    Column("job_id", String(64), primary_key=True),
    Column("shard", Integer, primary_key=True),
    Column("name", String(32), primary_key=True),
    Column("n", BigInteger),
)
PROMPT, COMPLETION = "prompt_tokens", "completion_tokens"


def _kept(session: Session) -> bool:
    return store.of(session).keeps_tallies


def tallies(session: Session, job_ids: Sequence[str]) -> dict[str, dict[str, int]]:
    """Each job's tallies by name: item statuses, `prompt_tokens`, `completion_tokens`
    (a name never written is absent: zero)."""
    found: dict[str, dict[str, int]] = {job: {} for job in job_ids}
    if not job_ids:
        return found
    if not _kept(session):
        return recount(session, job_ids)
    rows = session.execute(
        select(job_tallies.c.job_id, job_tallies.c.name, func.sum(job_tallies.c.n))
        .where(job_tallies.c.job_id.in_(list(job_ids)))
        .group_by(job_tallies.c.job_id, job_tallies.c.name))
    for job, name, n in rows:
        if n:
            found[job][name] = int(n)
    return found


def recount(session: Session, job_ids: Sequence[str]) -> dict[str, dict[str, int]]:
    """The same figures counted from the items and results themselves: SQLite's reads,
    and the tests' check of the kept tallies."""
    found: dict[str, dict[str, int]] = {job: {} for job in job_ids}
    for job, status, count in session.execute(
            select(Item.job_id, Item.status, func.count())
            .where(Item.job_id.in_(list(job_ids))).group_by(Item.job_id, Item.status)):
        found[job][status] = int(count)
    for job, prompt, completion in session.execute(
            select(Result.job_id, func.sum(Result.prompt_tokens),
                   func.sum(Result.completion_tokens))
            .where(Result.job_id.in_(list(job_ids))).group_by(Result.job_id)):
        for name, n in ((PROMPT, prompt), (COMPLETION, completion)):
            if n:
                found[job][name] = int(n)
    return found


def statuses(kept: dict[str, int]) -> dict[str, int]:
    """The item counts per status among a job's tallies."""
    return {name: n for name, n in kept.items() if name not in (PROMPT, COMPLETION)}


def usage(kept: dict[str, int]) -> tuple[int, int]:
    """The prompt and completion tokens among a job's tallies."""
    return kept.get(PROMPT, 0), kept.get(COMPLETION, 0)


def forget(session: Session, job_id: str) -> None:
    """Drop a purged job's tally rows (all zero once its items and results are gone)."""
    if _kept(session):
        session.execute(job_tallies.delete().where(job_tallies.c.job_id == job_id))
