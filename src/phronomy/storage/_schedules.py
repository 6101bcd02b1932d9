"""Schedules: stored rules that start an instance of a workflow at each tick.

A schedule row says when it ticks (a cron expression in an IANA time zone, or a fixed
interval from an anchor), which workflow it starts with which input, and what it does
when a tick comes while the previous instance still runs (its overlap policy). Its
``next_tick_ms`` is the first tick not handled yet. A runtime that serves the workflow
handles due ticks with one :class:`TickOp`: a compare-and-set of the row's version that
writes the schedule's next state together with the instances its ticks start (each
with an id made of the schedule's and the tick's, stored to start at once); a second
runtime's tick of the same version changes nothing, so each tick starts one instance.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, final

import msgspec

from phronomy.errors import ConflictError

from ._records import SaveRequest, check_op_limit

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "DeleteScheduleOp",
    "Overlap",
    "PutScheduleOp",
    "ScheduleOp",
    "ScheduleRecord",
    "SchedulesOp",
    "TickOp",
    "Ticked",
    "save_starts",
]

Overlap = Literal["skip", "buffer_one", "allow_all"]
"""What a tick does while the instance of the previous one is still open: nothing
(``skip``), start once that one closed (``buffer_one``: one tick is kept), or start
anyway (``allow_all``)."""


@final
class ScheduleRecord(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One stored schedule.

    Attributes:
        schedule_id: its id (the prefix of the ids of the instances it starts).
        workflow: the workflow it starts.
        cron: a cron expression (five fields, or six with seconds), or ``None``.
        every_ms: a fixed interval instead, from *anchor_ms*.
        anchor_ms: the first tick of an interval schedule.
        timezone: the IANA time zone a cron expression is read in.
        input: the started instances' input (JSON fields), or ``None``.
        overlap: see :data:`Overlap`.
        catchup_window_ms: ticks missed (downtime) that are still started once a
            runtime runs again, if at most this old; older ones are skipped.
        paused: ticks are not handled while paused.
        note: why it was paused (or anything an operator wrote).
        next_tick_ms: the first tick not handled yet (wall-clock ms, the store's).
        buffered_tick_ms: a tick kept to start once the previous instance closed.
        last_instance_id: the instance the last started tick started.
        trigger_ms: an operator's request to start one instance for this time
            now, whatever the overlap policy (the next tick of a runtime does it).
        backfill_from_ms: an operator's request to start the instances of the
            ticks from here ...
        backfill_to_ms: ... to here (exclusive), whatever the overlap policy;
            ticks that started an instance before are not started again.
        started: how many ticks started an instance.
        skipped: how many ticks were skipped (overlap, or too old to catch up).
        version: raised by every change (the compare-and-set of ticks and edits).
        created_at_ms: when it was created.
        updated_at_ms: when it last changed.
    """

    schedule_id: str
    workflow: str
    next_tick_ms: int
    cron: str | None = None
    every_ms: int | None = None
    anchor_ms: int | None = None
    timezone: str = "UTC"
    input: bytes | None = None
    overlap: Overlap = "skip"
    catchup_window_ms: int = 60_000
    paused: bool = False
    note: str | None = None
    buffered_tick_ms: int | None = None
    last_instance_id: str | None = None
    trigger_ms: int | None = None
    backfill_from_ms: int | None = None
    backfill_to_ms: int | None = None
    started: int = 0
    skipped: int = 0
    version: int = 1
    created_at_ms: int = 0
    updated_at_ms: int = 0


@final
class PutScheduleOp(
    msgspec.Struct, frozen=True, kw_only=True, gc=False, tag="put_schedule"
):
    """Store *record*: a new schedule (``expected_version=None``: only if its id is
    free), or a change of one still at *expected_version*. The result says whether
    it was written."""

    record: ScheduleRecord
    expected_version: int | None = None


@final
class DeleteScheduleOp(
    msgspec.Struct, frozen=True, kw_only=True, gc=False, tag="delete_schedule"
):
    """Delete a schedule (the instances it started stay); the result says whether
    one was there."""

    schedule_id: str


@final
class ScheduleOp(msgspec.Struct, frozen=True, kw_only=True, gc=False, tag="schedule"):
    """One schedule (a read), or ``None``."""

    schedule_id: str


@final
class SchedulesOp(msgspec.Struct, frozen=True, kw_only=True, gc=False, tag="schedules"):
    """Schedules (a read): those of *workflows* (all: ``None``) after the id *after*,
    by id; with ``due=True`` only those a runtime serving *workflows* must tick now
    (not paused, next tick or buffered tick due: one indexed query). The result is
    ``(now_ms, records)``: the store's clock and the rows."""

    workflows: tuple[str, ...] | None = None
    due: bool = False
    after: str | None = None
    limit: int = 100

    def __post_init__(self) -> None:
        check_op_limit(self.limit)


@final
class Ticked(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What a :class:`TickOp` did.

    Attributes:
        written: whether the schedule was still at the expected version (else
            nothing was written: another runtime handled these ticks).
        started: the ids of the instances it stored (an id stored before is not
            stored again).
    """

    written: bool
    started: tuple[str, ...] = ()


@final
class TickOp(msgspec.Struct, frozen=True, kw_only=True, gc=False, tag="tick"):
    """Handle a schedule's due ticks: if the row is still at *expected_version*, write
    *record* (its next state) and save *starts* (new instances, each created only if
    its id is free), in one transaction."""

    record: ScheduleRecord
    expected_version: int
    starts: tuple[SaveRequest, ...] = ()


def save_starts(
    starts: tuple[SaveRequest, ...], save: Callable[[SaveRequest], object]
) -> Ticked:
    """What a written :class:`TickOp` did: each of *starts* saved, unless its id is
    taken (that tick started it before)."""
    started: list[str] = []
    for request in starts:
        try:
            save(request)
        except ConflictError:
            continue
        started.append(request.workflow_instance_id)
    return Ticked(written=True, started=tuple(started))
