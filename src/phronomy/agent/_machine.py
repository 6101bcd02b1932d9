"""The execution machine: what happens to a supervised execution, decided purely.

Each function takes the live :class:`ExecutionEntry` and what just happened, and
returns the new entry with one action for the coordinator to carry out: run the next
step, end (once quiescent) with an outcome, or nothing. It starts no work, touches no
store and imports no trio.
"""

from __future__ import annotations

from typing import Any, final

import msgspec

from phronomy.errors import PhronomyError

from ._messages import (
    Approval,
    ApprovalRequest,
    ExecutionEntry,
    ExecutionResult,
)

__all__ = ["Action", "ExecutionMachine", "Ignore", "RunStep", "Suspend", "Terminate"]


@final
class RunStep(msgspec.Struct, frozen=True, kw_only=True):
    """Run step *index* with the entry's value."""

    index: int


@final
class Suspend(msgspec.Struct, frozen=True, kw_only=True):
    """The execution waits for an approval (nothing runs)."""

    request: ApprovalRequest


@final
class Terminate(msgspec.Struct, frozen=True, kw_only=True):
    """End the execution with *outcome* once its work has physically finished."""

    outcome: Any  # ExecutionResult | BaseException


@final
class Ignore(msgspec.Struct, frozen=True, kw_only=True):
    """Nothing changes (a stale result, a decision for an execution that moved on)."""

    reason: str


Action = RunStep | Suspend | Terminate | Ignore


@final
class ExecutionMachine:
    """The rules of a supervised execution (stateless: the entry carries the state).

    Steps run one after another; each step's result is applied only while it is still
    the execution's current step, so late results after a cancellation never change
    live state. A step returning an :class:`~phronomy.ApprovalRequest` suspends the execution;
    approving runs the next step with an :class:`~phronomy.Approval`, rejecting ends it
    ``rejected``. Cancelling revokes result authority at once.
    """

    __slots__ = ()

    def next_step(self, entry: ExecutionEntry) -> tuple[ExecutionEntry, Action]:
        """Run the step at ``entry.index``, or complete after the last one."""
        if entry.index >= len(entry.steps):
            return entry, Terminate(outcome=_result(entry, "completed", entry.value))
        return entry, RunStep(index=entry.index)

    def step_finished(
        self,
        entry: ExecutionEntry,
        step_id: str,
        *,
        value: Any = None,
        error: BaseException | None = None,
    ) -> tuple[ExecutionEntry, Action]:
        """Apply a step's result (*error* when it failed or was cancelled)."""
        if (
            entry.status != "executing"
            or entry.active is None
            or entry.active.step_id != step_id
        ):
            return entry, Ignore(reason=f"stale step result {step_id}")
        entry = msgspec.structs.replace(entry, active=None)
        if error is not None:
            return entry, Terminate(outcome=error)
        if isinstance(value, ApprovalRequest):
            entry = msgspec.structs.replace(
                entry, status="suspended", pending_approval=value
            )
            return entry, Suspend(request=value)
        entry = msgspec.structs.replace(entry, index=entry.index + 1, value=value)
        return self.next_step(entry)

    def decided(
        self, entry: ExecutionEntry, *, approved: bool, response: Any
    ) -> tuple[ExecutionEntry, Action]:
        """Apply an approver's decision."""
        request = entry.pending_approval
        if entry.status != "suspended" or request is None:
            return entry, Ignore(reason="not waiting for an approval")
        if not approved:
            rejected = _result(entry, "rejected", None, rejection=response)
            return entry, Terminate(outcome=rejected)
        entry = msgspec.structs.replace(
            entry,
            status="executing",
            pending_approval=None,
            index=entry.index + 1,
            value=Approval(request=request, response=response),
        )
        return self.next_step(entry)

    def cancelled(
        self, entry: ExecutionEntry, error: BaseException
    ) -> tuple[ExecutionEntry, Action]:
        """Revoke result authority: the active step's result will be stale."""
        if entry.status not in ("executing", "suspended"):
            return entry, Ignore(reason=f"already {entry.status}")
        entry = msgspec.structs.replace(
            entry, status="cancelling", active=None, pending_approval=None
        )
        return entry, Terminate(outcome=error)

    def terminalizing(self, entry: ExecutionEntry, outcome: Any) -> ExecutionEntry:
        """The entry while it waits for quiescence and its terminal record."""
        if not isinstance(outcome, (ExecutionResult, BaseException)):
            outcome = PhronomyError(f"unknown execution outcome {outcome!r}")
        return msgspec.structs.replace(
            entry, status="terminalizing", terminal=outcome, deadline_timer=None
        )


def _result(
    entry: ExecutionEntry, status: Any, value: Any, *, rejection: Any = None
) -> ExecutionResult:
    return ExecutionResult(
        execution_id=entry.execution_id,
        agent_id=entry.agent_id,
        status=status,
        value=value,
        rejection=rejection,
    )
