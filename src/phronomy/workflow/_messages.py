"""Values of the workflow layer: results, stream steps, commands and admission records."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, Literal, TypeVar, final

import msgspec
import outcome

from phronomy.engine import Caller, ResultHandle
from phronomy.storage import InstanceStatus, Posting, PostOutcome, StoredRecord

from ._definition import WorkflowDefinition
from ._state import State

__all__ = [
    "Barrier",
    "CancelCommand",
    "EventCounters",
    "EventOutcome",
    "EventStatus",
    "IfExists",
    "InputOverlay",
    "InstanceUpdate",
    "LiveSegment",
    "Polled",
    "PostCommand",
    "PostReady",
    "RecoveryEntry",
    "ResolveCommand",
    "ResumeCommand",
    "SegmentStatus",
    "StartCommand",
    "Step",
    "WorkflowResult",
    "WorkflowStatistics",
]

S = TypeVar("S", bound=State)


@final
class WorkflowResult(msgspec.Struct, Generic[S], frozen=True, kw_only=True):
    """The outcome of a segment: the final or halted state and its metadata.

    Attributes:
        state: the workflow state.
        phase: the wait state's name when halted, ``"__end__"`` (:data:`phronomy.FINISH`) when
            finished.
        workflow_instance_id: the instance id (generated when none was given).
        revision: the durable revision, or ``None`` for ephemeral executions.
        halted: whether the segment halted at a wait state.
        workflow: the workflow's name.
        status: the instance's status: ``halted`` or ``finished`` after a segment;
            with ``if_exists="return"``, what the store says (``running``,
            ``failed`` and ``cancelled`` included).
    """

    state: S
    phase: str
    workflow_instance_id: str
    revision: int | None
    halted: bool
    workflow: str
    status: InstanceStatus = "finished"


@final
class Step(msgspec.Struct, Generic[S], frozen=True, kw_only=True):
    """A stable state published to streams and ``on_step`` observers.

    Attributes:
        phase: the state the workflow is in (as ``phase`` of results and watch
            updates).
        state: the state value there.
        workflow_instance_id: the instance id.
    """

    phase: str
    state: S
    workflow_instance_id: str


class InputOverlay(msgspec.Struct, frozen=True, kw_only=True):
    """Validated input: field values that override the starting state.

    Attributes:
        fields: validated field values (a subset of the state's fields).
        state: a complete state given by the caller (overrides every field).
    """

    fields: dict[str, Any] = {}
    state: Any = None


class StartCommand(msgspec.Struct, frozen=True, kw_only=True):
    """Start (or restart) a segment at the entry point."""

    definition: WorkflowDefinition[Any]
    input: InputOverlay
    workflow_instance_id: str
    explicit_id: bool
    owner: object
    recursion_limit: int
    caller: Caller[Any]
    """Settled with the segment's result or error (the executions' driver passes a
    stand-in of its own)."""
    observer: Callable[[Step[Any]], object] | None = None
    if_exists: IfExists = "refuse"
    posting: Posting | None = None
    """An event to store in the new instance's inbox in the same transaction (a post
    that starts its instance); the start runs only if it creates the instance."""
    trace: Any = None
    """The caller's OpenTelemetry context (with telemetry on): the segment's parent."""


class ResumeCommand(msgspec.Struct, frozen=True, kw_only=True):
    """Start a segment by firing *event* from a halted state (or by id, from the store).

    With a store the event goes through the inbox: *posting* stores it (with the
    claim, in one transaction), the segment resumes with the oldest pending entry, and
    the caller waits for what becomes of its own one. Without a *posting*, the segment
    only applies what the inbox holds (a drain).
    """

    definition: WorkflowDefinition[Any]
    halted: WorkflowResult[Any] | None
    event: str
    payload: Any
    input: InputOverlay
    workflow_instance_id: str
    owner: object
    recursion_limit: int
    caller: ResultHandle[Any]
    observer: Callable[[Step[Any]], object] | None = None
    posting: Posting | None = None
    trace: Any = None
    """The caller's OpenTelemetry context (with telemetry on): the segment's parent."""
    wants: Literal["result", "outcome"] = "result"
    """What the caller waits for: the applying segment's result, or what became of
    the event (``deliver``)."""


@final
class PostCommand(msgspec.Struct, frozen=True, kw_only=True):
    """Store an event in an instance's inbox (``runtime.workflows.post``)."""

    definition: WorkflowDefinition[Any]
    posting: Posting
    done: ResultHandle[Any]
    """Settled with the receipt once the event is stored."""
    outcome: ResultHandle[Any] | None = None
    """Settled with what became of the event once it is applied (``deliver``)."""
    starting: bool = False
    """A post that would start the instance, which a segment here is loading: a row
    not there yet is being created (busy, not missing)."""


@final
class PostReady(msgspec.Struct, frozen=True, kw_only=True):
    """The post of a :class:`PostCommand` came back."""

    command: PostCommand
    posted: outcome.Outcome[PostOutcome]


@final
class Polled(msgspec.Struct, frozen=True, kw_only=True):
    """What the inbox poll found: pending entries of instances this runtime holds or
    nobody does, and entries someone here waits for (``(key, entry or None)``)."""

    pending: tuple[Any, ...]
    checked: tuple[tuple[tuple[str, str], Any], ...] = ()
    poll: int = 0
    """The poll's number (the polls begun in this runtime, this one included)."""


@final
class InstanceUpdate(msgspec.Struct, Generic[S], frozen=True, kw_only=True):
    """A stable state of an instance, as ``runtime.workflows.watch`` reports it.

    Attributes:
        workflow_instance_id: the instance.
        status: ``running`` while a segment is live (a stable state it passed or waits
            at), then how the segment ended: ``halted``, ``finished``, ``cancelled`` or
            ``failed``; or what the store says when the watch begins.
        phase: the state it is at (``__end__`` when finished).
        state: the state value (``None`` when unknown, for example after a failure
            before anything was saved).
        revision: the durable revision (``None`` without a store).
        skipped: updates this watcher missed just before this one (it fell more than
            its buffer behind).
    """

    workflow_instance_id: str
    status: InstanceStatus
    phase: str | None
    state: S | None
    revision: int | None
    skipped: int = 0


@final
class CancelCommand(msgspec.Struct, frozen=True, kw_only=True):
    """Cancel an instance: its live segment here, or its stored row."""

    definition: WorkflowDefinition[Any]
    workflow_instance_id: str
    reason: str | None
    force: bool
    owner: object
    done: ResultHandle[Any]


@final
class Barrier(msgspec.Struct, frozen=True, kw_only=True):
    """Completes *done* once every command queued before it was delivered."""

    done: ResultHandle[None]


class ResolveCommand(msgspec.Struct, frozen=True, kw_only=True):
    """Clear a recovery-required admission (operator resolution)."""

    workflow_instance_id: str
    action: Literal["adopt", "release"]
    done: ResultHandle[Any]


IfExists = Literal["refuse", "return", "restart", "restart_closed"]
"""What a start does when its ``workflow_instance_id`` is stored already.

``"refuse"`` (the default): an instance with a durable state (any status) is refused
with :class:`~phronomy.InstanceExistsError`, which says how to continue; nothing runs
twice silently. ``"return"``: return the stored result without running anything (an
idempotent submit). ``"restart"``: run again at the entry point, the stored fields
overridden by the input (hydration), whatever the status (an instance live in another
runtime is busy). ``"restart_closed"``: as ``"restart"`` for a closed instance
(``finished``, ``failed`` or ``cancelled``); an open one (``halted``, ``running``) is
refused with :class:`~phronomy.InstanceExistsError` (Temporal's "allow duplicate"
reuse policy; supervised executions start this way). Under every policy, an instance whose first segment failed before it
saved anything runs (it has nothing durable), and one that requires recovery is refused.
"""

SegmentStatus = Literal[
    "admitting", "executing", "persisting_terminal", "recovery_required"
]
"""Where a live segment is: loading its instance, running, saving its terminal state,
or waiting for an operator (the outcome of its terminal save is unknown)."""


@final
class LiveSegment(msgspec.Struct, frozen=True, kw_only=True):
    """A live execution segment of an instance in this runtime (a snapshot).

    Attributes:
        workflow_instance_id: the instance.
        workflow: its workflow's name.
        status: where the segment is.
        segment_id: the id of the segment's session once it runs (a fresh id per
            segment; events of an old segment never reach a new one).
        error: why it requires recovery, if it does.
    """

    workflow_instance_id: str
    workflow: str
    status: SegmentStatus
    segment_id: str | None = None
    error: str | None = None


EventStatus = Literal["transitioned", "rejected", "dropped", "refused", "not_live"]
"""What happened to a delivered event: it fired a transition; every guard rejected it;
the current state does not declare it (or the state's hook consumed it); the instance
had closed (or moved on) before it could be applied; or (without a store) the instance
had no live segment to take it."""


@final
class EventOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What happened to an event delivered with ``runtime.workflows.deliver``.

    Attributes:
        workflow_instance_id: the instance.
        event: the event's name.
        status: see :data:`EventStatus`.
        phase: the state the segment is in afterwards (``None`` when not live).
    """

    workflow_instance_id: str
    event: str
    status: EventStatus
    phase: str | None = None


@final
class WorkflowStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """Counters of the workflows of one runtime.

    Attributes:
        live_segments: segments loading, running or saving now.
        recovery_required: instances whose terminal save outcome is unknown here.
        events_transitioned: live events that fired a transition.
        events_rejected: live events every guard rejected.
        events_dropped: live events the current state did not declare (dropped with
            a warning) or its hook consumed.
    """

    live_segments: int
    recovery_required: int
    events_transitioned: int
    events_rejected: int
    events_dropped: int


class EventCounters:
    """What sessions count for :class:`WorkflowStatistics` (mutated on the dispatcher)."""

    __slots__ = ("dropped", "rejected", "transitioned")

    def __init__(self) -> None:
        self.transitioned = 0
        self.rejected = 0
        self.dropped = 0


@final
class RecoveryEntry(msgspec.Struct, frozen=True, kw_only=True):
    """An instance that requires recovery.

    Attributes:
        workflow_instance_id: the instance.
        workflow: its workflow's name.
        in_process: this runtime holds its admission (and a pending caller).
        stored: its durable row (without the snapshot), if the store has one.
        error: why its outcome is unknown, if known here.
    """

    workflow_instance_id: str
    workflow: str
    in_process: bool
    stored: StoredRecord | None = None
    error: str | None = None
