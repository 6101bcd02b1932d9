"""Values the stores exchange with the runtime (all frozen msgspec Structs)."""

from __future__ import annotations

import re
from typing import Literal, final

import msgspec

from phronomy.errors import InvalidInputError

__all__ = [
    "EXECUTION_KEY_PREFIX",
    "EXECUTION_KIND",
    "EXECUTION_PLAN_PREFIX",
    "MAX_DELAY_MS",
    "MAX_INSTANCE_ID_LENGTH",
    "OPEN_STATUSES",
    "Consumption",
    "InboxStatus",
    "InstancePage",
    "InstanceStatus",
    "Lease",
    "SaveLogEntry",
    "SaveOutcome",
    "SaveRequest",
    "StoredRecord",
    "Takeover",
    "TimerKind",
    "TimerSpec",
    "is_execution_plan",
    "saved_workflow",
    "validate_instance_id",
]

EXECUTION_KIND = "phronomy.execution"
"""The ``workflow`` column of supervised executions' per-key records (workflow names
may not start with ``phronomy.``)."""
EXECUTION_PLAN_PREFIX = EXECUTION_KIND + ":"
"""Supervised executions run as generated workflows named ``phronomy.execution:<plan>``."""


def is_execution_plan(workflow: str) -> bool:
    """Whether *workflow* names a supervised execution's plan (not a user workflow)."""
    return workflow == EXECUTION_KIND or workflow.startswith(EXECUTION_PLAN_PREFIX)


def saved_workflow(stored: str, saving: str) -> str:
    """The ``workflow`` of a row after a save by *saving* (*stored*: the row's): a
    row keeps its workflow, except that an execution's key takes its latest plan
    (the SQL stores say the same in their save statements)."""
    if not stored or (is_execution_plan(stored) and is_execution_plan(saving)):
        return saving
    return stored


EXECUTION_KEY_PREFIX = "agent:"
"""Supervised executions' records are stored under ``agent:<agent_id>``."""

InstanceStatus = Literal[
    "running", "halted", "finished", "failed", "cancelled", "recovery_required"
]
"""What operators see for an instance.

``running``: a live segment is waiting for a signal or an effect (a segment that runs
straight to its terminal state goes from its previous status to the next one directly,
without an extra write). ``halted``: waiting at a wait state.
``finished``: reached FINISH. ``failed``: its last segment failed (the last durable
revision is still resumable). ``cancelled``: cancelled by a caller or an operator (a
terminal status, with the reason). ``recovery_required``: the outcome of a save is
unknown; an operator must resolve it before the instance runs again.

``running``, ``halted`` and ``recovery_required`` instances are *open*; ``finished``,
``failed`` and ``cancelled`` ones are *closed*.
"""

OPEN_STATUSES: frozenset[InstanceStatus] = frozenset(
    {"running", "halted", "recovery_required"}
)
"""Statuses of instances that have not ended (see :data:`InstanceStatus`)."""


InboxStatus = Literal[
    "pending", "transitioned", "rejected", "dropped", "refused", "failed"
]
"""What became of an inbox entry.

``pending``: stored, not applied yet. ``transitioned``: it fired a transition (its
``revision`` is the one the consuming save produced). ``rejected``: every guard
rejected it. ``dropped``: the state the instance was in does not declare it.
``refused``: the instance closed (finished or cancelled) before it was applied, or it
no longer fitted (its ``detail`` says why). ``failed``: an action it ran raised (the
instance failed with it; it is never applied again).
"""


@final
class Consumption(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The outcome a write records for one inbox entry it consumes.

    Attributes:
        seq: the entry.
        status: what became of it (not ``pending``).
        detail: why it was refused, dropped or failed.
    """

    seq: int
    status: InboxStatus
    detail: str | None = None


@final
class StoredRecord(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One instance's durable row.

    Attributes:
        workflow_instance_id: the instance id.
        workflow: the workflow name that owns the instance ("" if unknown).
        revision: 0 while nothing was saved yet (a placeholder), then 1, 2, ...
        status: the instance status.
        phase: the phase of the saved snapshot (a wait state, or ``"__end__"``).
        snapshot: the encoded snapshot, or ``None`` at revision 0.
        write_id: the ``write_id`` of the save that produced this revision.
        detail: a diagnostic for ``failed`` / ``recovery_required``.
        updated_at_ms: wall-clock milliseconds of the last change.
        definition_version: the version of the workflow definition that saved it
            (empty before the first save, or when saved by a release without versions).
        lease_owner: the owner token of the runtime that holds the instance's lease
            (``None``: no runtime does).
        lease_epoch: the fencing epoch (each claim and takeover increments it).
        lease_expires_at_ms: when the lease expires, on the store's clock.
        takeovers: how many times in a row its runtime stopped while running it (the
            recovery sweep took it over); a save resets it.
        cancel_requested: a cancellation another runtime asked for (its reason, or
            ``""``); the runtime holding the lease sees it at its next heartbeat.
    """

    workflow_instance_id: str
    workflow: str
    revision: int
    status: InstanceStatus
    phase: str | None = None
    snapshot: bytes | None = None
    write_id: str | None = None
    detail: str | None = None
    updated_at_ms: int = 0
    definition_version: str = ""
    lease_owner: str | None = None
    lease_epoch: int = 0
    lease_expires_at_ms: int | None = None
    takeovers: int = 0
    cancel_requested: str | None = None


@final
class Lease(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A runtime's claim on an instance: the capability every fenced write presents.

    Attributes:
        owner: the runtime's owner token (one per runtime).
        epoch: the fencing epoch its claim returned; a takeover increments it.
    """

    owner: str
    epoch: int


TimerKind = Literal["timeout", "timer", "start", "retry"]
"""``timeout``: a state's timeout transition (armed by the save that halts there);
``timer``: scheduled by an action (``effects.schedule``); ``start``: a delayed start
(``runtime.workflows.start_later``); ``retry``: the next attempt of a failed effect."""

MAX_DELAY_MS = 100 * 366 * 86_400_000
"""The longest delay a timer may have: about 100 years."""


@final
class TimerSpec(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A timer a save arms.

    Attributes:
        name: unique per instance: arming it again replaces the earlier one.
        delay_ms: due this long after the save commits (the store's clock).
        event: the event it stores once due.
        payload: the event's payload, encoded (JSON).
        kind: see :data:`TimerKind`.
        state: the state whose save armed it.
    """

    name: str
    delay_ms: int
    event: str
    payload: bytes = b"null"
    kind: TimerKind = "timer"
    state: str | None = None

    def __post_init__(self) -> None:
        given: object = self.delay_ms  # checked at run time: callers are not typed
        if (
            isinstance(given, bool)
            or not isinstance(given, int)
            or not 0 <= given <= MAX_DELAY_MS
        ):
            raise InvalidInputError(
                f"timer {self.name!r}: delay_ms must be an int from 0 to "
                f"{MAX_DELAY_MS} (100 years), got {self.delay_ms!r}"
            )


@final
class SaveRequest(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A revision-checked save.

    Attributes:
        workflow_instance_id: the instance id.
        expected_revision: the revision the writer read (``None``: no row yet).
        snapshot: the encoded snapshot.
        write_id: unique per save; recorded with the row so an uncertain commit can be
            classified later.
        status: the instance status this save sets (``halted`` or ``finished``).
        phase: the snapshot's phase.
        workflow: the owning workflow's name.
        definition_version: the version of the definition that saves it.
        detail: a note kept with the row (for example why it was cancelled).
        lease: the writer's lease: the save is accepted only while the row holds it
            (``None``: only while no runtime holds one). A save of any status but
            ``running`` releases it.
        consumed: the inbox entries the segment applied, with their outcomes: they are
            consumed in the same transaction, only if the save is accepted. A save of
            ``finished`` or ``cancelled`` also refuses every entry still pending.
        arm: timers this save arms (see :class:`~phronomy.storage.TimerSpec`).
        disarm: names of timers it disarms (``*``: every timer of the instance, as
            a restart does). A save of ``finished`` or ``cancelled`` drops every
            timer of the instance.
    """

    workflow_instance_id: str
    expected_revision: int | None
    snapshot: bytes
    write_id: str
    status: InstanceStatus
    phase: str | None
    workflow: str = ""
    definition_version: str = ""
    detail: str | None = None
    lease: Lease | None = None
    consumed: tuple[Consumption, ...] = ()
    arm: tuple[TimerSpec, ...] = ()
    disarm: tuple[str, ...] = ()


@final
class SaveOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """How a save ended, classified.

    Attributes:
        outcome: ``success`` (the revision is durable), ``known_failure`` (nothing was
            written), or ``outcome_unknown`` (the store cannot tell).
        revision: the durable revision on success.
        error: the error for the two failures.
    """

    outcome: Literal["success", "known_failure", "outcome_unknown"]
    revision: int | None = None
    error: BaseException | None = None


@final
class InstancePage(msgspec.Struct, frozen=True, kw_only=True):
    """One page of :meth:`~phronomy.storage.BaseStore.list_instances`.

    Attributes:
        records: the rows, ordered by instance id (snapshots omitted).
        next_after: pass as ``after`` to get the next page; ``None`` on the last page.
    """

    records: tuple[StoredRecord, ...]
    next_after: str | None = None


MAX_INSTANCE_ID_LENGTH = 255
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def validate_instance_id(
    value: object, *, what: str = "workflow_instance_id", workflow: str | None = None
) -> str:
    """Return *value* if it is a usable instance id.

    A workflow instance id may not start with :data:`EXECUTION_KEY_PREFIX`: those
    keys belong to supervised executions, whose instances (of a *workflow* named
    :data:`EXECUTION_KIND` ``:<plan>``) must use it.

    Raises:
        InvalidInputError: not a string, empty, longer than 255 characters,
            containing control characters, or (for a workflow instance id) starting
            with the reserved prefix.
    """
    if not isinstance(value, str):
        raise InvalidInputError(f"{what} must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidInputError(f"{what} is required and must not be empty")
    if len(value) > MAX_INSTANCE_ID_LENGTH:
        raise InvalidInputError(
            f"{what} is {len(value)} characters long; the limit is {MAX_INSTANCE_ID_LENGTH}"
        )
    if not value.isprintable() and _CONTROL.search(value):  # the regex when unsure
        raise InvalidInputError(f"{what} {value!r} contains control characters")
    if workflow is not None and is_execution_plan(workflow):
        if not value.startswith(EXECUTION_KEY_PREFIX):
            raise InvalidInputError(
                f"{what} {value!r} of execution plan {workflow!r} must start with "
                f"{EXECUTION_KEY_PREFIX!r}: run execution plans with runtime.executions"
            )
    elif what == "workflow_instance_id" and value.startswith(EXECUTION_KEY_PREFIX):
        raise InvalidInputError(
            f"{what} {value!r} starts with {EXECUTION_KEY_PREFIX!r}, which is reserved "
            "for supervised executions' records; choose another id"
        )
    return value


@final
class SaveLogEntry(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One committed save of an instance (its history; the store keeps the last few).

    Attributes:
        revision: the revision the save produced.
        status: the status it set.
        phase: the snapshot's phase.
        write_id: the save's ``write_id``.
        committed_at_ms: wall-clock milliseconds of the commit.
        definition_version: the version of the definition that saved it.
        detail: the note saved with it (for example a cancellation's reason).
    """

    revision: int
    status: InstanceStatus
    phase: str | None
    write_id: str
    committed_at_ms: int
    definition_version: str = ""
    detail: str | None = None


@final
class Takeover(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One takeover of an instance by the recovery sweep (its runtime stopped while
    running it; the store keeps the last few, as many as saves).

    Attributes:
        epoch: the lease epoch the takeover made (a late write of the stopped runtime
            is refused).
        revision: the revision it put the instance back at.
        status: the status it put it back with (``halted``, ``failed``,
            ``recovery_required``, ``cancelled``, ...).
        detail: why, as the row says.
        taken_at_ms: wall-clock milliseconds of the takeover.
    """

    epoch: int
    revision: int
    status: InstanceStatus
    detail: str | None
    taken_at_ms: int


def check_op_limit(limit: int) -> None:
    """Refuse an operation's *limit* that is not an int >= 1.

    Raises:
        InvalidInputError: naming the limit.
    """
    given: object = limit  # checked at run time: callers are not typed
    if isinstance(given, bool) or not isinstance(given, int) or given < 1:
        raise InvalidInputError(f"limit must be an int >= 1, got {limit!r}")
