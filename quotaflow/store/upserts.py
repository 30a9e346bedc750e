"""INSERT ... ON CONFLICT, shared by both stores: each makes the insert of its own
dialect (postgresql.insert or sqlite.insert), and the conflict clause is written once."""

from collections.abc import Sequence
from typing import TypeVar

from sqlalchemy import Table, func
from sqlalchemy.dialects import postgresql, sqlite

Upsert = TypeVar("Upsert", postgresql.Insert, sqlite.Insert)


def adding(statement: Upsert, table: Table, keys: Sequence[str], added: Sequence[str],
           keep_null: Sequence[str] = (), keep: Sequence[str] = ()) -> Upsert:
    """ON CONFLICT (keys) DO UPDATE adding the new row's `added` columns to the stored
    ones: a counter row written by many transactions at once. A `keep_null` column stays
    NULL only while every row added to it was NULL; a `keep` column keeps its stored
    value unless that is NULL."""
    new = statement.excluded
    values = {name: table.c[name] + new[name] for name in added}
    for name in keep_null:
        values[name] = func.coalesce(table.c[name] + new[name], table.c[name], new[name])
    for name in keep:
        values[name] = func.coalesce(table.c[name], new[name])
    return statement.on_conflict_do_update(index_elements=list(keys), set_=values)
