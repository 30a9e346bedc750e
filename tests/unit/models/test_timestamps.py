"""UtcDateTime (quotaflow/models.py): SQLite's naive stamps come back aware, in UTC, as
PostgreSQL's do, so no reader patches them (tests/cluster covers PostgreSQL)."""

from datetime import UTC, datetime, timedelta, timezone

from sqlalchemy import Column, MetaData, String, Table, create_engine, func, select

from quotaflow.models import Base, UtcDateTime

EAST = timezone(timedelta(hours=5))
STAMPS = Table("stamps", MetaData(), Column("id", String, primary_key=True),
               Column("at", UtcDateTime()))


def test_sqlite_stamps_come_back_aware_in_utc() -> None:
    engine = create_engine("sqlite://")
    STAMPS.create(engine)
    moment = datetime(2026, 3, 1, 12, 30, tzinfo=UTC)
    with engine.begin() as connection:
        connection.execute(STAMPS.insert(), [
            {"id": "utc", "at": moment},
            {"id": "east", "at": moment.astimezone(EAST)},  # the same moment, stored in UTC
            {"id": "naive", "at": moment.replace(tzinfo=None)},  # taken as UTC
            {"id": "none", "at": None}])
        read = {id_: at for id_, at in connection.execute(select(STAMPS.c.id, STAMPS.c.at))}
        latest = connection.scalar(select(func.max(STAMPS.c.at)))
    assert read == {"utc": moment, "east": moment, "naive": moment, "none": None}
    assert all(value.tzinfo is UTC for value in read.values() if value is not None)
    assert latest == moment and latest.tzinfo is UTC


def test_every_model_stamp_is_utc() -> None:
    stamps = [f"{table.name}.{column.name}" for table in Base.metadata.tables.values()
              for column in table.columns if column.type.python_type is datetime
              and not isinstance(column.type, UtcDateTime)]
    assert not stamps, stamps
