"""Schedules as SQL, written once for every SQL backend (SQLite's ``:name`` style;
:func:`~phronomy.storage._sql_inbox.pyformat` makes PostgreSQL's), with the table each
backend's migration adds."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec

from ._schedules import (
    DeleteScheduleOp,
    PutScheduleOp,
    ScheduleOp,
    ScheduleRecord,
    SchedulesOp,
    Ticked,
    TickOp,
    save_starts,
)
from ._sql_inbox import pyformat
from ._sql_terminate import SQL_TERMINATE_ROW
from ._sql_timers import POSTGRES_MIGRATION, postgres_timers

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._dbapi import Connection
    from ._records import SaveRequest

__all__ = [
    "POSTGRES_SCHEDULES",
    "POSTGRES_TIME",
    "SCHEDULE_OPS",
    "SCHEDULE_STATEMENTS",
    "SQLITE_SCHEDULES",
    "ScheduleStatements",
    "delete_schedule",
    "postgres_time",
    "put_schedule",
    "read_schedules",
    "schedule_op",
    "tick",
]

SCHEDULE_OPS = (PutScheduleOp, DeleteScheduleOp, ScheduleOp, SchedulesOp, TickOp)
"""The schedules' operations (:func:`schedule_op` runs them)."""

_FIELDS = tuple(ScheduleRecord.__struct_fields__)
_COLUMNS = ", ".join(_FIELDS)
_CLOCKS = ("created_at_ms", "updated_at_ms")  # the store's clock (:now)
_VALUES = ", ".join(":now" if f in _CLOCKS else f":{f}" for f in _FIELDS)
_SET = ", ".join(
    f"{f} = :now" if f == "updated_at_ms" else f"{f} = :{f}"
    for f in _FIELDS
    if f not in ("schedule_id", "created_at_ms")
)


class ScheduleStatements(NamedTuple):
    """The schedules' statements in one backend's parameter style."""

    now: str
    insert: str
    update: str
    delete: str
    one: str
    page: str
    due: str


SCHEDULE_STATEMENTS = ScheduleStatements(
    now="SELECT :now",
    insert=f"""
        INSERT INTO phronomy_schedules ({_COLUMNS}) VALUES ({_VALUES})
        ON CONFLICT (schedule_id) DO NOTHING
    """,  # noqa: S608 - constant
    update=f"""
        UPDATE phronomy_schedules SET {_SET}
        WHERE schedule_id = :schedule_id AND version = :expected
    """,  # noqa: S608 - constant
    delete="DELETE FROM phronomy_schedules WHERE schedule_id = :id",
    one=f"SELECT {_COLUMNS} FROM phronomy_schedules WHERE schedule_id = :id",  # noqa: S608
    page=f"""
        SELECT {_COLUMNS} FROM phronomy_schedules
        WHERE (:all_workflows OR workflow IN (SELECT value FROM json_each(:workflows)))
          AND (CAST(:after AS TEXT) IS NULL OR schedule_id > :after)
        ORDER BY schedule_id LIMIT :limit
    """,  # noqa: S608 - constant
    # the due index: unpaused schedules by their next (or buffered) tick
    due=f"""
        SELECT {_COLUMNS} FROM phronomy_schedules
        WHERE NOT paused AND least_tick <= :now
          AND workflow IN (SELECT value FROM json_each(:workflows))
        ORDER BY least_tick LIMIT :limit
    """,  # noqa: S608 - constant
)
"""The schedules' statements (SQLite's parameter style)."""

_TABLE = """CREATE TABLE phronomy_schedules (
    schedule_id       {text}  PRIMARY KEY,
    workflow          {text}  NOT NULL,
    next_tick_ms      {int}   NOT NULL,
    cron              {text},
    every_ms          {int},
    anchor_ms         {int},
    timezone          {text}  NOT NULL,
    input             {blob},
    overlap           {text}  NOT NULL CHECK (overlap IN ('skip', 'buffer_one',
                                'allow_all')),
    catchup_window_ms {int}   NOT NULL,
    paused            {bool}  NOT NULL,
    note              {text},
    buffered_tick_ms  {int},
    last_instance_id  {text},
    trigger_ms        {int},
    backfill_from_ms  {int},
    backfill_to_ms    {int},
    started           {int}   NOT NULL,
    skipped           {int}   NOT NULL,
    version           {int}   NOT NULL,
    created_at_ms     {int}   NOT NULL,
    updated_at_ms     {int}   NOT NULL,
    least_tick        {int}   GENERATED ALWAYS AS (min(next_tick_ms,
                          coalesce(buffered_tick_ms, next_tick_ms),
                          coalesce(trigger_ms, next_tick_ms),
                          coalesce(backfill_from_ms, next_tick_ms))) {stored}
){options}"""
_INDEX = """CREATE INDEX phronomy_schedules_due ON phronomy_schedules (least_tick)
    WHERE NOT paused"""

SQLITE_SCHEDULES = (
    _TABLE.format(
        text="TEXT", int="INTEGER", blob="BLOB", bool="INTEGER", stored="STORED",
        options=" STRICT",
    ),
    _INDEX,
)  # fmt: skip
"""The SQLite store's schedules table (part of its version 6)."""

POSTGRES_SCHEDULES = (
    _TABLE.format(
        text="text", int="bigint", blob="bytea", bool="boolean", stored="STORED",
        options="",
    ).replace("min(next_tick_ms", "least(next_tick_ms"),
    _INDEX,
)  # fmt: skip
"""The PostgreSQL store's schedules table (part of its version 5)."""


POSTGRES_TIME = POSTGRES_MIGRATION + POSTGRES_SCHEDULES
"""The PostgreSQL store's version 5: durable timers and schedules."""


def postgres_time(now: str) -> dict[str, Any]:
    """The timers' and the schedules' statements in PostgreSQL's style (*now*: its
    clock), as :class:`~phronomy.storage._sql_ops.Statements` fields."""
    schedules = ScheduleStatements(*(pyformat(q, now=now) for q in SCHEDULE_STATEMENTS))
    return {
        "timers": postgres_timers(now),
        "schedules": schedules._replace(now=f"SELECT {now}"),
        "terminate": pyformat(SQL_TERMINATE_ROW, now=now),
    }


def _params(record: ScheduleRecord) -> dict[str, Any]:
    return {f: getattr(record, f) for f in _FIELDS}


def _record(row: tuple[Any, ...]) -> ScheduleRecord:
    fields = dict(zip(_FIELDS, row, strict=True))
    fields["paused"] = bool(fields["paused"])
    if fields["input"] is not None:
        fields["input"] = bytes(fields["input"])
    return msgspec.convert(fields, ScheduleRecord)


def put_schedule(
    conn: Connection,
    record: ScheduleRecord,
    expected_version: int | None,
    sql: ScheduleStatements,
    now: int,
) -> bool:
    """See :class:`~phronomy.storage.PutScheduleOp`."""
    params = {**_params(record), "now": now}
    if expected_version is None:
        return bool(conn.execute(sql.insert, params).rowcount)
    return bool(
        conn.execute(sql.update, {**params, "expected": expected_version}).rowcount
    )


def delete_schedule(
    conn: Connection, schedule_id: str, sql: ScheduleStatements
) -> bool:
    """See :class:`~phronomy.storage.DeleteScheduleOp`."""
    return bool(conn.execute(sql.delete, {"id": schedule_id}).rowcount)


def read_schedules(
    conn: Connection,
    *,
    schedule_id: str | None,
    workflows: tuple[str, ...] | None,
    due: bool,
    after: str | None,
    limit: int,
    sql: ScheduleStatements,
    now: int,
) -> Any:
    """See :class:`~phronomy.storage.ScheduleOp` (*schedule_id*) and
    :class:`~phronomy.storage.SchedulesOp`."""
    if schedule_id is not None:
        row = conn.execute(sql.one, {"id": schedule_id}).fetchone()
        return None if row is None else _record(row)
    clock = int(conn.execute(sql.now, {"now": now}).fetchone()[0])
    import json

    params = {
        "all_workflows": workflows is None,
        "workflows": json.dumps(list(workflows or ())),
        "after": after,
        "limit": limit,
        "now": now,
    }
    rows = conn.execute(sql.due if due else sql.page, params).fetchall()
    return clock, tuple(_record(row) for row in rows)


def tick(
    conn: Connection,
    record: ScheduleRecord,
    expected_version: int,
    starts: tuple[SaveRequest, ...],
    sql: ScheduleStatements,
    now: int,
    save: Callable[[SaveRequest], object],
) -> Ticked:
    """See :class:`~phronomy.storage.TickOp` (*save* saves one new instance)."""
    if not put_schedule(conn, record, expected_version, sql, now):
        return Ticked(written=False)
    return save_starts(starts, save)


def schedule_op(
    conn: Connection,
    op: PutScheduleOp | DeleteScheduleOp | ScheduleOp | SchedulesOp | TickOp,
    sql: ScheduleStatements,
    now: int,
    save: Callable[[SaveRequest], object],
) -> Any:
    """Run one of :data:`SCHEDULE_OPS` (*save* saves one new instance, for a tick)."""
    match op:
        case PutScheduleOp(record=record, expected_version=expected):
            return put_schedule(conn, record, expected, sql, now)
        case DeleteScheduleOp(schedule_id=schedule_id):
            return delete_schedule(conn, schedule_id, sql)
        case TickOp(record=record, expected_version=expected, starts=starts):
            return tick(conn, record, expected, starts, sql, now, save)
        case ScheduleOp(schedule_id=schedule_id):
            return read_schedules(
                conn,
                schedule_id=schedule_id,
                workflows=None,
                due=False,
                after=None,
                limit=1,
                sql=sql,
                now=now,
            )
    return read_schedules(
        conn,
        schedule_id=None,
        workflows=op.workflows,
        due=op.due,
        after=op.after,
        limit=op.limit,
        sql=sql,
        now=now,
    )
