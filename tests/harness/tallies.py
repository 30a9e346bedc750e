"""The check that the database's kept tallies (migration 0022) equal a full recount.

One statement, so both sides are read from one snapshot: it holds while workers are still
writing, not only once they have stopped.
"""

from sqlalchemy import Connection, text

_MISMATCHES = text("""
    WITH kept AS (
        SELECT job_id, name, sum(n) AS n FROM job_tallies
        GROUP BY job_id, name HAVING sum(n) <> 0),
    counted AS (
        SELECT job_id, status AS name, count(*) AS n FROM items GROUP BY job_id, status
        UNION ALL
        SELECT job_id, 'prompt_tokens', sum(prompt_tokens) FROM results
        GROUP BY job_id HAVING sum(prompt_tokens) <> 0
        UNION ALL
        SELECT job_id, 'completion_tokens', sum(completion_tokens) FROM results
        GROUP BY job_id HAVING sum(completion_tokens) <> 0)
    SELECT coalesce(kept.job_id, counted.job_id), coalesce(kept.name, counted.name),
           kept.n, counted.n
    FROM kept FULL JOIN counted
      ON kept.job_id = counted.job_id AND kept.name = counted.name
    WHERE kept.n IS DISTINCT FROM counted.n
    ORDER BY 1, 2""")


def mismatches(connection: Connection) -> list[tuple[str, str, int | None, int | None]]:
    """(job, name, kept, counted) wherever the tallies differ from the rows themselves."""
    return [tuple(row) for row in connection.execute(_MISMATCHES)]
