"""Schedules for operators and applications (``runtime.schedules``), and the pass of
the inbox poll that ticks the due ones.

A schedule is stored (:class:`~phronomy.storage.ScheduleRecord`); every runtime that
serves its workflow ticks it: each poll reads the due schedules (one indexed query),
and for each one writes, in one compare-and-set transaction, its next state and the
instances its due ticks start (stored to start at once, each under an id made of the
schedule's and the tick's). Two runtimes that tick the same schedule at once write
once: each tick starts one instance across all runtimes.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, final, get_args

import msgspec

from phronomy.errors import InvalidInputError, NotFoundError
from phronomy.storage import (
    EXECUTION_KEY_PREFIX,
    MAX_DELAY_MS,
    OPEN_STATUSES,
    DeleteScheduleOp,
    LoadOp,
    Overlap,
    PutScheduleOp,
    ScheduleOp,
    ScheduleRecord,
    SchedulesOp,
    TickOp,
    validate_instance_id,
)

from ._inbox import decode_input, encode_input
from ._inputs import input_overlay
from ._ticks import (
    EDITS,
    check_cron,
    check_zone,
    next_tick,
    plan_ticks,
    tick_instance_id,
    ticks_between,
)
from ._timer_client import start_request, store_now

if TYPE_CHECKING:
    from collections.abc import Mapping

    from phronomy.durability import DurabilityService
    from phronomy.storage import SaveRequest

    from ._coordinator import WorkflowCoordinator
    from ._definition import WorkflowDefinition

__all__ = ["ScheduleClient", "tick_schedules"]

logger = logging.getLogger(__name__)

EDIT_ATTEMPTS = 20
"""Times an edit is tried again when a tick changed the schedule meanwhile."""


@final
class ScheduleClient:
    """Stored schedules: each tick starts one instance of a workflow
    (``runtime.schedules``; every runtime serving the workflow ticks them).

    Cancellation (every method): the wait stops; a submitted write still commits or
    not (read the schedule again).
    """

    def __init__(self, coordinator: WorkflowCoordinator) -> None:
        """Internal: the runtime makes one."""
        self._coordinator = coordinator

    async def create(
        self,
        schedule_id: str,
        workflow: WorkflowDefinition[Any],
        *,
        cron: str | None = None,
        every: timedelta | float | None = None,
        timezone: str = "UTC",
        input: Mapping[str, Any] | None = None,  # noqa: A002 - the instances' input
        overlap: Overlap = "skip",
        catchup_window: timedelta | float = 60.0,
        start_at: datetime | None = None,
        paused: bool = False,
        note: str | None = None,
    ) -> ScheduleRecord:
        """Store a schedule that starts an instance of *workflow* at each tick (every
        runtime serving the workflow ticks it; this one serves it from now on).

        Args:
            schedule_id: its id (at most 200 characters); instance ids are
                ``<schedule_id>@<tick time, UTC>``.
            workflow: the workflow its ticks start (runtimes serving it tick it).
            cron: a cron expression read in *timezone* (see the cronsim library; a tick at
                a time skipped by daylight saving runs at the end of the gap, one at
                a time that occurs twice runs once), or
            every: a fixed interval (a timedelta, or seconds) counted from
                *start_at*, or without it from the Unix epoch (``every=3600`` ticks
                on the hour, UTC).
            timezone: an IANA zone name (for *cron*).
            input: the instances' input (field values, validated now).
            overlap: ``skip`` (default), ``buffer_one`` or ``allow_all`` (see
                :data:`~phronomy.storage.Overlap`).
            catchup_window: ticks missed while no runtime ran are started if at
                most this old (default a minute); older ones are skipped.
            start_at: no tick before this (a timezone-aware datetime; default now).
            paused: store it paused.
            note: kept with it (for operators).

        Returns:
            The stored schedule.

        Raises:
            InvalidInputError: a bad id, neither or both of *cron* and *every*, an
                invalid cron expression, an unknown zone, a bad interval, window,
                overlap, start or input (nothing is written), or the id is taken.
        """
        sid = _schedule_id(schedule_id)
        zone = check_zone(timezone)
        if (cron is None) == (every is None):
            raise InvalidInputError(
                f"schedule {sid!r} needs cron= (an expression) or every= (an "
                "interval), not both"
            )
        every_ms = None if every is None else _ms(every, "every", minimum=1)
        if overlap not in get_args(Overlap):
            raise InvalidInputError(
                f"overlap must be one of {list(get_args(Overlap))}, got {overlap!r}"
            )
        gateway = self._gateway()
        self._coordinator.served.setdefault(workflow.name, workflow)  # it ticks here
        now = store_now(gateway)
        start_ms = now if start_at is None else _instant(start_at, "start_at")
        record = ScheduleRecord(
            schedule_id=sid,
            workflow=workflow.name,
            next_tick_ms=0,
            cron=None if cron is None else check_cron(cron, zone),
            every_ms=every_ms,
            # intervals count from *start_at*, else from the epoch (aligned ticks)
            anchor_ms=None
            if every_ms is None
            else (0 if start_at is None else start_ms),
            timezone=timezone,
            input=encode_input(input_overlay(workflow, input), instance=sid),
            overlap=overlap,
            catchup_window_ms=_ms(catchup_window, "catchup_window", minimum=0),
            paused=bool(paused),
            note=note,
        )
        first = next_tick(record, start_ms - 1)
        if first is None:
            raise InvalidInputError(f"schedule {sid!r} never ticks after {start_at}")
        record = msgspec.structs.replace(record, next_tick_ms=first)
        if not await gateway.run(PutScheduleOp(record=record)):
            raise InvalidInputError(f"schedule {sid!r} exists; nothing was written")
        return await self.get(sid)

    async def get(self, schedule_id: str) -> ScheduleRecord:
        """The stored schedule.

        Raises:
            NotFoundError: no such schedule.
        """
        sid = _schedule_id(schedule_id)
        record: ScheduleRecord | None = await self._gateway().run(
            ScheduleOp(schedule_id=sid)
        )
        if record is None:
            raise NotFoundError(f"no schedule {sid!r}")
        return record

    async def list(
        self, *, workflow: str | None = None, after: str | None = None, limit: int = 100
    ) -> list[ScheduleRecord]:
        """Schedules by id (of *workflow*, after the id *after*)."""
        op = SchedulesOp(
            workflows=None if workflow is None else (workflow,),
            after=after,
            limit=limit,
        )
        _, records = await self._gateway().run(op)
        return list(records)

    @staticmethod
    def upcoming(record: ScheduleRecord, count: int = 5) -> tuple[datetime, ...]:
        """The next *count* ticks of *record* (UTC), from its next one."""
        ticks: list[datetime] = []
        tick: int | None = record.next_tick_ms
        while tick is not None and len(ticks) < count:
            ticks.append(datetime.fromtimestamp(tick / 1000, tz=UTC))
            tick = next_tick(record, tick)
        return tuple(ticks)

    async def pause(
        self, schedule_id: str, *, note: str | None = None
    ) -> ScheduleRecord:
        """Stop handling its ticks (those due meanwhile are skipped at resume).

        Raises:
            NotFoundError: no such schedule.
        """
        return await self._edit(schedule_id, "pause", note)

    async def resume(self, schedule_id: str) -> ScheduleRecord:
        """Handle its ticks again, from the first one after now.

        Raises:
            NotFoundError: no such schedule.
        """
        return await self._edit(schedule_id, "resume")

    async def delete(self, schedule_id: str) -> bool:
        """Delete it (the instances it started stay); whether it was there."""
        sid = _schedule_id(schedule_id)
        deleted: bool = await self._gateway().run(DeleteScheduleOp(schedule_id=sid))
        return deleted

    async def trigger(self, schedule_id: str) -> str:
        """Ask for one instance now, whatever the overlap policy: the next poll of a
        runtime serving its workflow starts it (once). Returns the id it gets
        (``<schedule_id>@<now>``).

        Raises:
            NotFoundError: no such schedule.
        """
        record = await self._edit(schedule_id, "trigger")
        assert record.trigger_ms is not None
        return tick_instance_id(record.schedule_id, record.trigger_ms)

    async def backfill(
        self, schedule_id: str, start: datetime, end: datetime
    ) -> tuple[str, ...]:
        """Ask for the instances of its ticks from *start* to *end* (exclusive; at
        most 1,000, up to now), whatever the overlap policy: runtimes serving its
        workflow start them at their next polls, 100 a pass; ticks that started an
        instance before are not started again. Returns the ids the ticks have.

        Raises:
            NotFoundError: no such schedule.
            InvalidInputError: naive or reversed datetimes, more than 1,000 ticks, or
                a backfill of it still in progress.
        """
        first, last = _instant(start, "start"), _instant(end, "end")
        record = await self._edit(schedule_id, "backfill", first, last)
        ticks = ticks_between(record, first, last)
        return tuple(tick_instance_id(record.schedule_id, t) for t in ticks)

    # --- internals ----------------------------------------------------------------

    def _gateway(self) -> DurabilityService:
        gateway = self._coordinator.gateway
        if gateway is None:
            raise InvalidInputError("schedules need a store (open_runtime(store=...))")
        return gateway

    async def _edit(self, schedule_id: str, edit: str, *args: Any) -> ScheduleRecord:
        gateway = self._gateway()
        for _ in range(EDIT_ATTEMPTS):  # a tick may change it meanwhile
            record = await self.get(schedule_id)
            fields = EDITS[edit](record, store_now(gateway), *args)
            changed = msgspec.structs.replace(
                record, **fields, version=record.version + 1
            )
            put = PutScheduleOp(record=changed, expected_version=record.version)
            if await gateway.run(put):
                return await self.get(schedule_id)
        raise InvalidInputError(f"schedule {schedule_id!r} keeps changing")


async def tick_schedules(
    coordinator: WorkflowCoordinator, due: tuple[Any, ...]
) -> None:
    """Handle the due schedules *due* (``(now_ms, records)`` of a due
    :class:`~phronomy.storage.SchedulesOp`): each in one compare-and-set write.

    Cancellation:
        The wait stops; a submitted tick still commits or not (the next pass sees).
    """
    gateway = coordinator.gateway
    assert gateway is not None
    now, records = due
    for record in records:
        previous = record.last_instance_id
        try:
            row = None
            if previous is not None:
                row = await gateway.run(LoadOp(workflow_instance_id=previous))
            open_ = row is not None and row.status in OPEN_STATUSES
            plan = plan_ticks(record, now, previous_open=open_)
            unchanged = msgspec.structs.replace(plan.record, version=record.version)
            if not plan.start and unchanged == record:
                continue  # a tick waits for the open instance: nothing to write
            starts = _starts(coordinator, record, plan.start)
            op = TickOp(
                record=plan.record, expected_version=record.version, starts=starts
            )
            await gateway.run(op)
        except Exception as exc:  # noqa: BLE001 - the other schedules go on
            logger.warning(
                "schedule %r could not tick (the next poll tries again): %r",
                record.schedule_id,
                exc,
            )


def _starts(
    coordinator: WorkflowCoordinator, record: ScheduleRecord, ticks: tuple[int, ...]
) -> tuple[SaveRequest, ...]:
    definition = coordinator.served.get(record.workflow)
    if definition is None:
        raise InvalidInputError(
            f"schedule {record.schedule_id!r} starts workflow {record.workflow!r}, "
            "which this runtime does not serve (open_runtime(workflows=[...]))"
        )
    overlay = decode_input(definition, record.input)
    return tuple(
        start_request(
            definition,
            tick_instance_id(record.schedule_id, tick),
            overlay,
            delay_ms=0,
            max_bytes=coordinator.max_snapshot_bytes,
        )
        for tick in ticks
    )


def _schedule_id(value: object) -> str:
    sid = validate_instance_id(value, what="schedule_id")
    if len(sid) > 200 or "@" in sid or sid.startswith(EXECUTION_KEY_PREFIX):
        raise InvalidInputError(
            f"schedule_id {sid!r} must be at most 200 characters, without '@', and "
            f"not start with {EXECUTION_KEY_PREFIX!r} (its instances' ids begin with it)"
        )
    return sid


def _ms(value: object, what: str, *, minimum: int) -> int:
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise InvalidInputError(
            f"{what}= must be a timedelta or seconds, got {value!r}"
        )
    if not minimum / 1000 <= seconds <= MAX_DELAY_MS / 1000:
        raise InvalidInputError(
            f"{what}= must be from {minimum} ms to 100 years, got {value!r}"
        )
    return round(seconds * 1000)


def _instant(value: object, what: str) -> int:
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise InvalidInputError(
            f"{what} must be a timezone-aware datetime, got {value!r}"
        )
    return round(value.timestamp() * 1000)
