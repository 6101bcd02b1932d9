"""Values of supervised executions: requests, results, views, commands and records."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, final

import msgspec
import outcome

from phronomy.engine import ResultHandle, Timer
from phronomy.storage import SaveOutcome

__all__ = [
    "ActiveStep",
    "Approval",
    "ApprovalDecision",
    "ApprovalRequest",
    "CancelExecution",
    "DurableStarted",
    "ExecutionEntry",
    "ExecutionOwner",
    "ExecutionRecord",
    "ExecutionResult",
    "ExecutionStatus",
    "PhysicalCompletion",
    "RecordLoaded",
    "ResolveExecution",
    "StartExecution",
    "StepResult",
    "TerminalSaved",
]

ExecutionStatus = Literal[
    "starting",
    "executing",
    "suspended",
    "cancelling",
    "terminalizing",
    "recovery_required",
]


@final
class ApprovalRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Returned by a step to suspend the execution until a person approves or rejects.

    Attributes:
        question: what is asked.
        details: anything the approver needs to decide.
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
    """A read-only view of a live execution (safe from any trio task).

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
class ExecutionRecord(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What the store keeps per agent (as the ``fields`` of its snapshot).

    Attributes:
        execution_id: the latest execution.
        status: ``active`` while it runs, then its terminal status; ``abandoned`` when
            it was cut off without an outcome (its runtime stopped, or an operator
            released a stale record).
        steps_completed: steps that finished.
        error: the failure, for failed and abandoned executions.
    """

    execution_id: str
    status: Literal[
        "active", "completed", "rejected", "cancelled", "failed", "abandoned"
    ]
    steps_completed: int = 0
    error: str | None = None


class ActiveStep(msgspec.Struct, frozen=True, kw_only=True):
    """The step in flight: its semantic id and its supervised handle."""

    step_id: str
    handle: ResultHandle[Any]


class ExecutionEntry(msgspec.Struct, frozen=True, kw_only=True):
    """A live execution (replaced, never mutated; dispatcher only)."""

    execution_id: str
    agent_id: str
    owner: object
    steps: tuple[Callable[..., Any], ...]
    arities: tuple[int, ...]
    index: int
    value: Any
    status: ExecutionStatus
    caller: ResultHandle[Any]
    active: ActiveStep | None = None
    pending_approval: ApprovalRequest | None = None
    terminal: Any = None  # what the caller gets once the execution is quiescent
    durable_revision: int | None = None
    deadline_timer: Timer | None = None


# --- commands (delivered on the dispatcher) --------------------------------------------------


class StartExecution(msgspec.Struct, frozen=True, kw_only=True):
    """Admit and start an execution."""

    agent_id: str
    execution_id: str
    steps: Sequence[Callable[..., Any]]
    arities: tuple[int, ...]
    input: Any
    owner: object
    caller: ResultHandle[Any]
    deadline: float | None


class RecordLoaded(msgspec.Struct, frozen=True, kw_only=True):
    """The key's durable record was read (before writing ``active``)."""

    command: StartExecution
    loaded: outcome.Outcome[Any]


class DurableStarted(msgspec.Struct, frozen=True, kw_only=True):
    """The durable ``active`` record was written (or refused)."""

    command: StartExecution
    saved: SaveOutcome


class StepResult(msgspec.Struct, frozen=True, kw_only=True):
    """A step finished; applied only if *step_id* is still the execution's current step."""

    execution_id: str
    step_id: str
    done: ResultHandle[Any]


class ApprovalDecision(msgspec.Struct, frozen=True, kw_only=True):
    """An approver's answer to a suspended execution."""

    execution_id: str
    approved: bool
    response: Any = None


class CancelExecution(msgspec.Struct, frozen=True, kw_only=True):
    """Revoke an execution's result authority (cancel or deadline)."""

    execution_id: str
    error: BaseException


class PhysicalCompletion(msgspec.Struct, frozen=True, kw_only=True):
    """A supervised operation of an execution has physically finished."""

    execution_id: str
    token: object


class TerminalSaved(msgspec.Struct, frozen=True, kw_only=True):
    """The durable terminal record came back (classified)."""

    execution_id: str
    saved: SaveOutcome


class ResolveExecution(msgspec.Struct, frozen=True, kw_only=True):
    """Clear a recovery-required admission of a key (operator resolution)."""

    agent_id: str
    done: ResultHandle[bool]
