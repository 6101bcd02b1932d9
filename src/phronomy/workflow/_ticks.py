"""When schedules tick, and what a runtime does with due ticks (pure: no trio, no
store).

Cron expressions are read by cronsim in the schedule's IANA time zone (five fields,
or six with seconds first; ``L``, ``W`` and ``#`` as cronsim reads them). Daylight
saving time: a tick whose wall-clock time does not exist (the hour skipped in spring)
runs once, at the end of the gap (as Debian's cron); a tick at a fixed time that
occurs twice (in the hour repeated in autumn) runs once, at the first occurrence,
while hourly and finer ticks follow real time (they run in both passes of that
hour). Interval schedules tick every ``every_ms`` from their anchor, whatever the
zone.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import msgspec
from cronsim import CronSim, CronSimError

from phronomy.errors import InvalidInputError
from phronomy.storage import ScheduleRecord

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "EDITS",
    "MAX_TICKS",
    "TickPlan",
    "check_cron",
    "check_zone",
    "next_tick",
    "plan_ticks",
    "tick_instance_id",
    "ticks_between",
]

MAX_TICKS = 100
"""Ticks one pass handles per schedule at most (the next pass goes on)."""

LATENESS_MS = 5_000
"""How late a runtime may see a tick (its poll): a tick is missed, and skipped, only
once it is older than the catch-up window and this."""


def check_zone(name: object) -> ZoneInfo:
    """The IANA time zone *name*.

    Raises:
        InvalidInputError: not a string, or no such zone.
    """
    if not isinstance(name, str) or not name:
        raise InvalidInputError(f"timezone must be an IANA zone name, got {name!r}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidInputError(
            f"unknown time zone {name!r} (use an IANA name such as 'Europe/Berlin')"
        ) from None


def check_cron(expression: object, zone: ZoneInfo) -> str:
    """*expression* if cronsim reads it and it fires at some time.

    Raises:
        InvalidInputError: naming the expression and what is wrong with it.
    """
    if not isinstance(expression, str) or not expression.strip():
        raise InvalidInputError(f"cron must be a cron expression, got {expression!r}")
    try:
        sim = CronSim(expression, datetime.now(zone))
        next(sim)
    except CronSimError as exc:
        raise InvalidInputError(
            f"invalid cron expression {expression!r}: {exc}"
        ) from None
    except StopIteration:
        raise InvalidInputError(
            f"cron expression {expression!r} never fires (not within 50 years)"
        ) from None
    return expression


def next_tick(record: ScheduleRecord, after_ms: int) -> int | None:
    """The first tick of *record* strictly after *after_ms* (``None``: none)."""
    if record.every_ms is not None:
        anchor = record.anchor_ms or 0
        if after_ms < anchor:
            return anchor
        return anchor + ((after_ms - anchor) // record.every_ms + 1) * record.every_ms
    assert record.cron is not None
    after = datetime.fromtimestamp(after_ms / 1000, tz=UTC)
    zone = ZoneInfo(record.timezone)
    try:
        for candidate in CronSim(record.cron, after.astimezone(zone)):
            tick = candidate.astimezone(UTC)
            # cronsim may yield a time at or before *after* inside the hour repeated
            # at the end of daylight saving time: those ticks ran already
            if tick > after:
                return int(tick.timestamp() * 1000)
    except (CronSimError, StopIteration):
        return None
    return None


def ticks_between(record: ScheduleRecord, first_ms: int, end_ms: int) -> list[int]:
    """The ticks from *first_ms* (inclusive, if it is one) to *end_ms* (exclusive),
    at most ten times :data:`MAX_TICKS` and one."""
    ticks: list[int] = []
    tick = next_tick(record, first_ms - 1)
    while tick is not None and tick < end_ms and len(ticks) <= MAX_TICKS * 10:
        ticks.append(tick)
        tick = next_tick(record, tick)
    return ticks


def _count(record: ScheduleRecord, first_ms: int, end_ms: int) -> int:
    """How many ticks there are from *first_ms* (one) to *end_ms* (exclusive); for
    a cron expression at most 100,000 are counted."""
    if record.every_ms is not None:
        return max(0, -(-(end_ms - first_ms) // record.every_ms))
    count, tick = 0, first_ms
    while tick < end_ms and count < MAX_TICKS * 1000:
        count += 1
        following = next_tick(record, tick)
        if following is None:
            break
        tick = following
    return count


def tick_instance_id(schedule_id: str, tick_ms: int) -> str:
    """The id of the instance the tick at *tick_ms* starts (the same in every
    runtime: one instance per tick)."""
    at = datetime.fromtimestamp(tick_ms / 1000, tz=UTC)
    return f"{schedule_id}@{at.strftime('%Y-%m-%dT%H:%M:%S')}{_millis(tick_ms)}Z"


def _millis(tick_ms: int) -> str:
    return f".{tick_ms % 1000:03d}" if tick_ms % 1000 else ""


@final
class TickPlan(msgspec.Struct, frozen=True, kw_only=True):
    """What one pass does with a schedule's due ticks.

    Attributes:
        start: the ticks to start instances for, oldest first.
        skipped: how many due ticks it skips (overlap, or older than the catch-up
            window).
        record: the schedule's next state (not written yet: the tick writes it).
    """

    start: tuple[int, ...]
    skipped: int
    record: ScheduleRecord


def plan_ticks(record: ScheduleRecord, now_ms: int, *, previous_open: bool) -> TickPlan:
    """Decide what the due ticks of *record* start at *now_ms*.

    Args:
        record: the schedule as stored.
        now_ms: the store's clock.
        previous_open: whether the instance of the last started tick is still open
            (running, halted, requiring recovery).
    """
    oldest = now_ms - record.catchup_window_ms - LATENESS_MS
    tick: int | None = record.next_tick_ms
    skipped = 0
    if record.next_tick_ms < oldest:  # missed (downtime): on to the window at once
        skipped = _count(record, record.next_tick_ms, oldest)
        tick = next_tick(record, oldest - 1)
    due: list[int] = []
    while tick is not None and tick <= now_ms and len(due) < MAX_TICKS:
        due.append(tick)
        tick = next_tick(record, tick)
    following = tick if tick is not None else 2**62  # none: never again
    recent = due
    buffered: int | None = None
    start: list[int] = []
    match record.overlap:
        case "allow_all":
            start = recent
        case "skip":
            if previous_open:
                skipped += len(recent)
            else:  # the oldest starts; the others would overlap it
                start, skipped = recent[:1], skipped + len(recent[1:])
        case "buffer_one":  # one tick waits for the open instance; later ones skip
            kept = record.buffered_tick_ms
            waiting = ([kept] if kept is not None else []) + recent
            if not previous_open:
                start, waiting = waiting[:1], waiting[1:]
            buffered = waiting[0] if waiting else None
            skipped += len(waiting[1:])
    last = record.last_instance_id
    if start:
        last = tick_instance_id(record.schedule_id, start[-1])
    requested, requests = _requested(record, now_ms)
    nxt = msgspec.structs.replace(
        record,
        next_tick_ms=following,
        buffered_tick_ms=buffered,
        last_instance_id=last,
        started=record.started + len(start) + len(requested),
        skipped=record.skipped + skipped,
        version=record.version + 1,
        **requests,
    )
    ticks = tuple(sorted({*start, *requested}))
    return TickPlan(start=ticks, skipped=skipped, record=nxt)


def _requested(
    record: ScheduleRecord, now_ms: int
) -> tuple[list[int], dict[str, int | None]]:
    """The ticks an operator asked for (a trigger, a backfill) that are due, and the
    requests left (a long backfill goes on at the next pass)."""
    ticks: list[int] = []
    left: dict[str, int | None] = {}
    if record.trigger_ms is not None and record.trigger_ms <= now_ms:
        ticks.append(record.trigger_ms)
        left["trigger_ms"] = None
    first, end = record.backfill_from_ms, record.backfill_to_ms
    if first is not None and end is not None and first <= now_ms:
        found = ticks_between(record, first, min(end, now_ms + 1))[:MAX_TICKS]
        ticks.extend(found)
        more = len(found) == MAX_TICKS
        left["backfill_from_ms"] = found[-1] + 1 if more else None
        left["backfill_to_ms"] = end if more else None
    return ticks, left


def _pause(
    record: ScheduleRecord, now_ms: int, note: str | None = None
) -> dict[str, Any]:
    return {"paused": True, "note": note}


def _resume(record: ScheduleRecord, now_ms: int) -> dict[str, Any]:
    following = next_tick(record, now_ms)  # ticks due while paused are not caught up
    return {"paused": False, "next_tick_ms": 2**62 if following is None else following}


def _active(record: ScheduleRecord, what: str) -> None:
    if record.paused:
        raise InvalidInputError(
            f"schedule {record.schedule_id!r} is paused: resume it to {what}"
        )


def _trigger(record: ScheduleRecord, now_ms: int) -> dict[str, Any]:
    _active(record, "trigger it")
    if record.trigger_ms is not None:
        raise InvalidInputError(
            f"a trigger of {record.schedule_id!r} is pending (for "
            f"{tick_instance_id(record.schedule_id, record.trigger_ms)}); wait for it"
        )
    return {"trigger_ms": now_ms}


def _backfill(
    record: ScheduleRecord, now_ms: int, first: int, end: int
) -> dict[str, Any]:
    _active(record, "backfill it")
    if end < first:
        raise InvalidInputError(
            f"backfill of {record.schedule_id!r}: end is before start"
        )
    if len(ticks_between(record, first, end)) > MAX_TICKS * 10:
        raise InvalidInputError(
            f"backfill of {record.schedule_id!r} spans more than {MAX_TICKS * 10} "
            "ticks: split it"
        )
    if record.backfill_from_ms is not None:
        raise InvalidInputError(
            f"a backfill of {record.schedule_id!r} is in progress; wait for it"
        )
    return {"backfill_from_ms": first, "backfill_to_ms": end}


EDITS: dict[str, Callable[..., dict[str, Any]]] = {
    "pause": _pause,
    "resume": _resume,
    "trigger": _trigger,
    "backfill": _backfill,
}
"""What an operator's edit changes in a schedule: ``(record, now_ms, *args)`` → the
fields to change (the API and the command line make the same edits).

Raises:
    InvalidInputError: a backfill that is reversed, too long, or while another one
        is in progress.
"""
