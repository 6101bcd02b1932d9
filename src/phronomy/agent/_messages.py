"""Values of supervised executions: requests, results, views and records."""

from __future__ import annotations

from typing import Any, Literal, final

import msgspec

from phronomy.storage import InboxEntry, StoredTimer

__all__ = [
    "Approval",
    "ApprovalRequest",
    "ExecutionLease",
    "ExecutionOwner",
    "ExecutionPage",
    "ExecutionRecord",
    "ExecutionResult",
    "ExecutionStatus",
    "RecordStatus",
]

ExecutionStatus = Literal[
    "starting",
    "executing",
    "suspended",
    "cancelling",
    "terminalizing",
    "recovery_required",
]
"""Where a live execution is, as this runtime sees it."""

RecordStatus = Literal[
    "active",
    "suspended",
    "completed",
    "rejected",
    "cancelled",
    "failed",
    "recovery_required",
]
"""What the store says of a key's latest execution: ``active`` (running, or between
two steps), ``suspended`` (waiting for an approval), a closed outcome, or
``recovery_required`` (the outcome of a save is unknown)."""


@final
class ApprovalRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Returned by a step to suspend the execution until a person approves or rejects.

    Attributes:
        question: what is asked.
        details: anything the approver needs to decide (JSON with a store: the request
            is saved while the execution waits).
    """

    question: str
    details: Any = None


@final
class Approval(msgspec.Struct, frozen=True, kw_only=True):
    """What the step after an approval receives.

    Attributes:
        request: the approved request.
        response: what the approver sent with the approval.
    """

    request: ApprovalRequest
    response: Any = None


@final
class ExecutionResult(msgspec.Struct, frozen=True, kw_only=True):
    """The terminal outcome of an execution that was not cancelled and did not fail.

    Attributes:
        execution_id: the execution.
        agent_id: its key.
        status: ``"completed"`` (every step ran) or ``"rejected"`` (an approval was
            rejected).
        value: the last step's return value (``None`` when rejected).
        rejection: what the rejecter sent (when rejected).
    """

    execution_id: str
    agent_id: str
    status: Literal["completed", "rejected"]
    value: Any = None
    rejection: Any = None


@final
class ExecutionOwner(msgspec.Struct, frozen=True, kw_only=True):
    """A read-only view of an execution live in this runtime (safe from any trio task).

    Attributes:
        execution_id: the execution.
        agent_id: its key.
        status: where it is (``executing``, ``suspended``, ``cancelling``, ...).
        step_index: the step running or next to run.
        pending_approval: the request it waits on, when suspended.
    """

    execution_id: str
    agent_id: str
    status: ExecutionStatus
    step_index: int
    pending_approval: ApprovalRequest | None = None


@final
class ExecutionLease(msgspec.Struct, frozen=True, kw_only=True):
    """Who holds a running execution (its runtime's lease).

    Attributes:
        owner: the holding runtime's lease owner id.
        epoch: the lease's epoch (a takeover makes a new one).
        expires_at_ms: when it expires unless renewed, on the store's lease clock
            (compare with :func:`~phronomy.storage.lease_now_ms`).
        live: whether it had not expired when ``runtime.executions.record`` read it
            (on that clock); ``None`` where it was not judged (a listing).
    """

    owner: str
    epoch: int
    expires_at_ms: int
    live: bool | None = None


@final
class ExecutionRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What the store says of a key's latest execution.

    Attributes:
        agent_id: the key.
        execution_id: the execution.
        status: see :data:`RecordStatus`.
        plan: the execution's plan (see :func:`~phronomy.agent.execution_plan`).
        steps_completed: steps whose result is saved.
        step: the step it runs or waits at (``None`` once it ended).
        pending_approval: the request a suspended execution waits on.
        value: the saved value (the last completed step's result, JSON).
        error: why it failed, was cancelled or requires recovery.
        revision: the row's revision.
        updated_at_ms: when it last changed (wall-clock milliseconds).
        lease: who runs it, while it runs.
    """

    agent_id: str
    execution_id: str
    status: RecordStatus
    plan: str
    steps_completed: int = 0
    step: int | None = None
    pending_approval: ApprovalRequest | None = None
    value: Any = None
    error: str | None = None
    revision: int = 0
    updated_at_ms: int = 0
    lease: ExecutionLease | None = None


@final
class ExecutionPage(msgspec.Struct, frozen=True, kw_only=True):
    """One page of :meth:`~phronomy.agent.Executions.list`.

    Attributes:
        records: the executions, by agent id.
        next_after: pass it as ``after=`` for the next page (``None``: the last page).
    """

    records: tuple[ExecutionRecord, ...]
    next_after: str | None = None


@final
class ExecutionDescription(msgspec.Struct, frozen=True, kw_only=True):
    """A key's latest execution as the store says it is, with what is pending
    (``runtime.executions.get``).

    Attributes:
        record: its record: status, steps completed, the approval request it waits
            on, value, error, and its lease (judged live or expired on the store's
            lease clock).
        pending_events: its inbox entries not applied yet, oldest first, cut at the
            ``limit`` of the read (an approval or a rejection sent from another
            process waits here until a runtime serving its plan applies it); their
            payloads are JSON (``msgspec.json.decode``).
        pending_timers: its pending timers (a deadline, a step's retry), soonest
            first.
        cancel_requested: a cancellation asked of the runtime running it and not
            carried out yet (its reason, or ``""``), else ``None``.
        takeovers: how many times in a row a runtime stopped while running it.
    """

    record: ExecutionRecord
    pending_events: tuple[InboxEntry, ...]
    pending_timers: tuple[StoredTimer, ...]
    cancel_requested: str | None
    takeovers: int
