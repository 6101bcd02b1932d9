"""Timers of durable segments (pure): what a halting save arms and disarms, and
whether a fired timer still applies.

A wait state's timeout transitions are armed by the save that halts there, named
``after:<ms>:<state>``; the save that leaves the state disarms them. An action's
timers (``effects.schedule``) still pending when the segment halts are stored by the
same save (``key:<key>``, or a unique name without a key). A segment that halts at a
state that is no wait state (waiting for an effect's next attempt: ``retry:<state>``)
stores the time its timeouts have left. A fired timer is an inbox entry; one armed for
an earlier visit of its state, or whose key this segment scheduled anew or cancelled,
is stale: it is dropped, never applied.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from phronomy.engine import random_hex
from phronomy.storage import ALL_TIMERS, TimerSpec, fired_timer

from ._definition import after_event
from ._inbox import encode_payload
from ._retries import RETRY_EVENT

if TYPE_CHECKING:
    from collections.abc import Collection

    from phronomy.storage import InboxEntry

    from ._definition import WorkflowDefinition
    from ._effects import PendingTimer

__all__ = [
    "TimerChanges",
    "halt_timers",
    "retry_of",
    "stale_timer",
    "timeout_named",
    "timeout_of",
    "timeout_timer",
]

TimerChanges = tuple[tuple[TimerSpec, ...], tuple[str, ...]]
"""What a save arms and what it disarms (timer names)."""

_KEY = "key:"
_AFTER = "after:"
_RETRY = "retry:"


def halt_timers(
    definition: WorkflowDefinition[Any],
    *,
    phase: str,
    resumed_from: str | None,
    moved: bool,
    pending: list[PendingTimer],
    touched: Collection[str],
    instance: str,
    timeouts_left: dict[int, float] | None = None,
    retry: tuple[bytes, float] | None = None,
    restart: bool = False,
) -> TimerChanges:
    """The timers of the save that halts a durable segment at *phase*.

    Args:
        definition: the workflow.
        phase: the wait state it halts at.
        resumed_from: the phase the segment resumed from (``None``: a fresh start).
        moved: whether the segment entered a state (else it is still the visit it
            resumed: its timers stay as they are).
        pending: the segment's timers still pending.
        touched: keys the segment scheduled or cancelled.
        instance: the instance id (for messages).
        timeouts_left: the seconds the timeouts of *phase* have left (a state that
            is no wait state: they ran in the segment).
        retry: an effect's next attempt (its stored form) and the seconds before it.
        restart: the segment restarted a stored instance (``if_exists="restart"``):
            every timer of its earlier run is disarmed.

    Raises:
        SerializationError: a pending timer's payload cannot be stored as JSON.
    """
    arm: list[TimerSpec] = []
    if timeouts_left is not None or moved:
        left = timeouts_left or {}
        arm.extend(
            timeout_timer(ms, phase, math.ceil(left[ms] * 1000) if ms in left else None)
            for ms in definition.timeouts.get(phase, ())
            if timeouts_left is None or ms in left
        )
    if retry is not None:
        arm.append(
            TimerSpec(
                name=f"{_RETRY}{phase}",
                delay_ms=math.ceil(retry[1] * 1000),
                event=RETRY_EVENT,
                payload=retry[0],
                kind="retry",
                state=phase,
            )
        )
    for key, intent, seconds in pending:
        arm.append(
            TimerSpec(
                name=_KEY + key if key is not None else f"~{random_hex()}",
                delay_ms=math.ceil(seconds * 1000),
                event=intent.event,
                payload=encode_payload(
                    intent.payload, event=intent.event, instance=instance
                ),
                state=phase,
            )
        )
    armed = {spec.name for spec in arm}
    if restart:  # a new run of a stored instance: the old run's timers go
        return tuple(arm), (ALL_TIMERS,)
    disarm = [_KEY + key for key in sorted(touched) if _KEY + key not in armed]
    if moved and resumed_from is not None:
        gone = (*definition.timeout_names(resumed_from), f"{_RETRY}{resumed_from}")
        disarm.extend(name for name in gone if name not in armed)
    return tuple(arm), tuple(disarm)


def retry_of(entry: InboxEntry) -> str | None:
    """The state whose effect the fired retry timer *entry* runs again (``None``: it
    is no retry timer)."""
    fired = fired_timer(entry.event_id)
    if fired is None or not fired[0].startswith(_RETRY):
        return None
    return fired[0][len(_RETRY) :] or None


def timeout_of(entry: InboxEntry) -> tuple[int, str] | None:
    """The delay and state of the timeout transition whose fired timer *entry* is
    (``None``: it is no timeout)."""
    fired = fired_timer(entry.event_id)
    return None if fired is None else timeout_named(fired[0])


def timeout_timer(ms: int, state: str, delay_ms: int | None = None) -> TimerSpec:
    """The timer of *state*'s timeout transition of *ms* milliseconds, armed for
    *delay_ms* (default: the whole delay, as when the state is entered)."""
    return TimerSpec(
        name=f"{_AFTER}{ms}:{state}",
        delay_ms=ms if delay_ms is None else delay_ms,
        event=after_event(ms),
        kind="timeout",
        state=state,
    )


def timeout_named(name: str) -> tuple[int, str] | None:
    """The delay and state of the timeout transition whose timer is *name*
    (``None``: it is no timeout's)."""
    if not name.startswith(_AFTER):
        return None
    ms, _, state = name[len(_AFTER) :].partition(":")
    return (int(ms), state) if ms.isdigit() and state else None


def stale_timer(
    entry: InboxEntry,
    *,
    phase: str,
    revision: int | None,
    moved: bool,
    touched: Collection[str] = frozenset(),
) -> str | None:
    """Why the fired timer *entry* no longer applies to a segment at *phase*, which
    resumed from *revision* and *moved* on since or not (``None``: it applies, or it
    is no timer)."""
    fired = fired_timer(entry.event_id)
    if fired is None:
        return None
    name, armed = fired
    if name.startswith(_KEY) and name[len(_KEY) :] in touched:
        return f"timer {name!r} was scheduled again or cancelled before it was applied"
    timeout = timeout_of(entry)
    state = retry_of(entry) if timeout is None else timeout[1]
    if state is None:
        return None
    what = "timeout" if timeout is not None else "retry"
    # a save that leaves the state disarms its timers and refuses their fired
    # entries; one armed at an earlier revision of the same visit (a segment halted
    # at the state again, waiting for an effect's next attempt) still applies
    if moved or state != phase or revision is None or armed > revision:
        return (
            f"the {what} of state {state!r} was armed at revision {armed}; the "
            f"instance has left that visit (it is at {phase!r}"
            + (", moved on)" if moved else f", revision {revision})")
        )
    return None
