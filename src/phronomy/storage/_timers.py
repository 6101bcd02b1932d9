"""Durable timers: events stored with a due time.

A timer belongs to an instance and has a name (arming a name again replaces it). It is
armed by a save, in the same transaction as the state it belongs to, with a delay
counted from that save on the store's clock. Once due, a runtime *fires* it: one
transaction deletes the timer and stores its event in the instance's inbox, under an
event id made of the timer's name and the revision that armed it; from there it is an
inbox entry like any other, consumed exactly once with the state it produces. A save
that disarms a timer (or arms its name again) also refuses its entry if it fired and
was not applied yet, so a disarmed timer never reaches the state; a save that closes
the instance drops its timers.
"""

from __future__ import annotations

from typing import final

import msgspec

from ._inbox import Posting
from ._records import MAX_DELAY_MS, TimerKind, TimerSpec

__all__ = [
    "ALL_TIMERS",
    "MAX_DELAY_MS",
    "TIMER_EVENT_PREFIX",
    "StoredTimer",
    "TimerKind",
    "TimerSpec",
    "disarm_prefix",
    "fired_timer",
]

TIMER_EVENT_PREFIX = "timer:"
"""How the event ids of fired timers begin (``timer:<name>@<revision>``)."""


@final
class StoredTimer(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A pending timer of an instance.

    Attributes:
        workflow_instance_id: the instance.
        name: its name.
        due_at_ms: when it is due (wall-clock milliseconds, the store's clock).
        event: the event it stores once due.
        payload: the event's payload (JSON).
        kind: see :data:`TimerKind`.
        state: the state whose save armed it.
        armed_revision: the revision of the save that armed it.
        armed_at_ms: when that save committed.
        workflow: its instance's workflow when it was armed (runtimes serving it
            fire it).
    """

    workflow_instance_id: str
    name: str
    due_at_ms: int
    event: str
    payload: bytes
    kind: TimerKind
    state: str | None
    armed_revision: int
    armed_at_ms: int
    workflow: str = ""

    @property
    def event_id(self) -> str:
        """The event id of its inbox entry once it fired."""
        return f"{TIMER_EVENT_PREFIX}{self.name}@{self.armed_revision}"

    def posting(self) -> Posting:
        """Its event, as it is stored in the inbox once due."""
        return Posting(
            workflow_instance_id=self.workflow_instance_id,
            event_id=self.event_id,
            event=self.event,
            payload=self.payload,
        )


def fired_timer(event_id: str) -> tuple[str, int] | None:
    """The name and arming revision of the timer whose inbox entry has *event_id*
    (``None``: the entry is not a fired timer)."""
    if not event_id.startswith(TIMER_EVENT_PREFIX):
        return None
    name, _, revision = event_id[len(TIMER_EVENT_PREFIX) :].rpartition("@")
    return (name, int(revision)) if name and revision.isdigit() else None


ALL_TIMERS = "*"
"""The name a save disarms to disarm every timer of its instance (a restart)."""


def disarm_prefix(name: str) -> str:
    """How the event ids of the fired entries of timer *name* begin (of every timer,
    for :data:`ALL_TIMERS`)."""
    if name == ALL_TIMERS:
        return TIMER_EVENT_PREFIX
    return f"{TIMER_EVENT_PREFIX}{name}@"
