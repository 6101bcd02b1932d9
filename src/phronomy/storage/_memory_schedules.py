"""MemoryStore's schedules: the SQL stores' schedule rules, on a dictionary."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from ._schedules import (
    DeleteScheduleOp,
    PutScheduleOp,
    ScheduleOp,
    SchedulesOp,
    Ticked,
    TickOp,
    save_starts,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._memory_tables import Tables
    from ._records import SaveRequest

__all__ = ["apply_schedule_op"]


def apply_schedule_op(
    conn: Tables,
    op: PutScheduleOp | DeleteScheduleOp | ScheduleOp | SchedulesOp | TickOp,
    save: Callable[[SaveRequest], object],
) -> Any:
    """Run a schedule operation (see :mod:`phronomy.storage._schedules`); *save*
    saves one new instance."""
    now = conn.wall()
    match op:
        case PutScheduleOp(record=record, expected_version=expected):
            return _put(conn, record, expected, now)
        case DeleteScheduleOp(schedule_id=schedule_id):
            there = schedule_id in conn.schedules
            conn.put_schedule(schedule_id, None)
            return there
        case ScheduleOp(schedule_id=schedule_id):
            return conn.schedules.get(schedule_id)
        case TickOp(record=record, expected_version=expected, starts=starts):
            if not _put(conn, record, expected, now):
                return Ticked(written=False)
            return save_starts(starts, save)
        case SchedulesOp():
            found = sorted(conn.schedules.values(), key=lambda r: r.schedule_id)
            if op.workflows is not None:
                found = [r for r in found if r.workflow in op.workflows]
            if op.due:
                found = sorted(
                    (r for r in found if not r.paused and _least(r) <= now),
                    key=_least,
                )
            elif op.after is not None:
                found = [r for r in found if r.schedule_id > op.after]
            return now, tuple(found[: op.limit])
    raise TypeError(f"unknown schedule operation {op!r}")  # pragma: no cover


def _least(record: Any) -> int:
    """The tick due first: the next one, a buffered one, or an operator's request."""
    requested = (
        record.buffered_tick_ms,
        record.trigger_ms,
        record.backfill_from_ms,
    )
    return int(min([record.next_tick_ms, *(t for t in requested if t is not None)]))


def _put(conn: Tables, record: Any, expected: int | None, now: int) -> bool:
    current = conn.schedules.get(record.schedule_id)
    if expected is None:
        if current is not None:
            return False
        record = msgspec.structs.replace(record, created_at_ms=now)
    elif current is None or current.version != expected:
        return False
    conn.put_schedule(
        record.schedule_id, msgspec.structs.replace(record, updated_at_ms=now)
    )
    return True
