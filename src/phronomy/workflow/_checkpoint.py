"""Checkpoints: a durable segment's save at a checkpoint wait state, mid-segment.

A wait state declared with ``wait_state(name, checkpoint=event)`` is where a durable
segment makes what it did so far durable without giving the instance up: instead of
halting (a save that releases the lease, then a claim to go on), it submits one save of
the state at that phase with status ``running`` (the store keeps the row's lease and
epoch, and refuses the save once another runtime took the instance over), handles no
event until the save is acknowledged, and then fires *event* from the state in the same
segment. The save arms the state's timers as a halt would, so an instance whose runtime
stops after the acknowledgement is put back at the state by the recovery sweep and
resumed there by its timeout; a crash before it leaves the instance where the
previous save left it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, final

import msgspec

from phronomy.engine import Event
from phronomy.errors import PhronomyError

from ._persistence import TerminalPersistence
from ._timeouts import halt_timers

if TYPE_CHECKING:
    from phronomy.storage import SaveOutcome

    from ._hydration import DurableBase

__all__ = ["CHECKPOINT_RESULT", "Checkpoint", "intercept", "rebase", "try_checkpoint"]

Session = Any
"""A :class:`~phronomy.workflow._session.WorkflowSession` (not imported: it imports
this module)."""

CHECKPOINT_RESULT = "__phronomy.checkpoint_result__"
"""The event that carries a checkpoint save's classified outcome back to its session."""


@final
class Checkpoint:
    """A checkpoint save in flight: the events that arrive meanwhile wait for it."""

    __slots__ = ("deferred", "event", "phase")

    def __init__(self, phase: str, event: str) -> None:
        """A save at *phase*, after which the segment fires *event*."""
        self.phase = phase
        self.event = event
        self.deferred: list[Event] = []


def try_checkpoint(session: Session) -> bool:
    """At a wait state: save there and go on (``True``), or halt as usual (``False``:
    not a checkpoint, no store, cancelling, or inbox entries applied since the last
    save, which a halt consumes and settles).

    Raises:
        SerializationError: the state holds values outside the JSON domain.
    """
    machine = session.machine
    phase = machine.current
    event = session.definition.checkpoints.get(phase)
    policy = session.persistence
    feed = session.feed
    if (
        event is None
        or not isinstance(policy, TerminalPersistence)
        or feed is None
        or session.lease is None
        or session.cancelling
        or feed.current is not None
        or feed.judged
    ):
        return False
    timers = halt_timers(
        session.definition,
        phase=phase,
        resumed_from=None if session.resume is None else session.resume[0],
        moved=machine.entered > 0,
        pending=session.effects.pending_timers(),
        touched=session.effects.touched,
        instance=session.workflow_instance_id,
        restart=session.resume is None and bool(session.revision),
    )
    pending = Checkpoint(phase, event)
    post = session.sink.post

    def deliver(saved: SaveOutcome) -> None:
        post(CHECKPOINT_RESULT, (pending, saved))

    policy.checkpoint(machine.state, phase, timers, deliver)
    session.checkpoint = pending
    return True


def intercept(session: Session, event: Event) -> bool:
    """While a checkpoint save is in flight: keep *event* for later, or act on the
    save's outcome (``False``: no save in flight).

    Raises:
        PhronomyError: the save failed (a lost lease, a conflict) or its outcome is
            unknown: the segment fails with it and runs nothing more.
    """
    pending = session.checkpoint
    if pending is None:
        return False
    if event.type != CHECKPOINT_RESULT or event.payload[0] is not pending:
        pending.deferred.append(event)
        return True
    session.checkpoint = None
    saved: SaveOutcome = event.payload[1]
    if saved.outcome != "success" or saved.revision is None:
        raise saved.error or PhronomyError(
            f"the checkpoint save of workflow instance "
            f"{session.workflow_instance_id!r} at {pending.phase!r} failed"
        )
    _saved(session, pending, saved.revision)
    return True


def _saved(session: Session, pending: Checkpoint, revision: int) -> None:
    assert isinstance(session.persistence, TerminalPersistence)
    session.persistence.saved(revision)
    session.revision = revision
    # the next save leaves the checkpoint's visit: it disarms the timers armed here
    session.resume = (pending.phase, pending.event, None)
    session.steps.publish(session)
    for index, deferred in enumerate(pending.deferred):
        if session.checkpoint is not None:  # a deferred event reached another one
            session.checkpoint.deferred.extend(pending.deferred[index:])
            return
        session.handle(deferred)
    if (
        session.lifecycle == "running"
        and not session.done
        and not session.cancelling
        and session.checkpoint is None
        and session.machine.current == pending.phase
    ):
        session.handle(Event(type=pending.event, target_id=session.id))


def rebase(base: DurableBase | None, session: Session) -> DurableBase | None:
    """What a durable segment's end writes against: the revision its last checkpoint
    saved (halted at that state), else *base*."""
    if base is None or session.revision == base.expected:
        return base
    return msgspec.structs.replace(base, expected=session.revision, status="halted")
