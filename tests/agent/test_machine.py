"""The execution machine: pure decisions over a live entry."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

import phronomy
from phronomy.agent._machine import (
    ExecutionMachine,
    Ignore,
    RunStep,
    Suspend,
    Terminate,
)
from phronomy.agent._messages import ActiveStep, ExecutionEntry
from phronomy.engine import ResultHandle

MACHINE = ExecutionMachine()


def _entry(steps: int = 2, **changes: Any) -> ExecutionEntry:
    entry = ExecutionEntry(
        execution_id="e1",
        agent_id="a",
        owner=object(),
        steps=tuple(lambda v: v for _ in range(steps)),
        arities=(1,) * steps,
        index=0,
        value="in",
        status="executing",
        caller=ResultHandle(),
    )
    return msgspec.structs.replace(entry, **changes)


def _running(entry: ExecutionEntry, step_id: str = "s0") -> ExecutionEntry:
    return msgspec.structs.replace(
        entry, active=ActiveStep(step_id=step_id, handle=ResultHandle())
    )


def test_steps_run_in_order_and_the_last_value_completes() -> None:
    entry, action = MACHINE.next_step(_entry())
    assert action == RunStep(index=0)
    entry, action = MACHINE.step_finished(_running(entry), "s0", value="v1")
    assert (action, entry.index, entry.value, entry.active) == (
        RunStep(index=1),
        1,
        "v1",
        None,
    )
    entry, action = MACHINE.step_finished(_running(entry, "s1"), "s1", value="v2")
    assert isinstance(action, Terminate)
    assert action.outcome.status == "completed"
    assert action.outcome.value == "v2"


def test_a_stale_or_late_result_changes_nothing() -> None:
    entry = _running(_entry(), "current")
    same, action = MACHINE.step_finished(entry, "old", value="late")
    assert same is entry
    assert isinstance(action, Ignore)
    cancelled, _ = MACHINE.cancelled(entry, phronomy.CancellationError("stop"))
    after, action = MACHINE.step_finished(cancelled, "current", value="late")
    assert after is cancelled
    assert isinstance(action, Ignore)


def test_a_failed_step_terminates_with_its_error() -> None:
    error = OSError("tool broke")
    entry, action = MACHINE.step_finished(_running(_entry()), "s0", error=error)
    assert action == Terminate(outcome=error)
    assert entry.active is None


def test_approval_suspends_then_approve_or_reject() -> None:
    request = phronomy.ApprovalRequest(question="ship?")
    suspended, action = MACHINE.step_finished(_running(_entry()), "s0", value=request)
    assert action == Suspend(request=request)
    assert (suspended.status, suspended.pending_approval) == ("suspended", request)
    approved, action = MACHINE.decided(suspended, approved=True, response="yes")
    assert action == RunStep(index=1)
    assert approved.value == phronomy.Approval(request=request, response="yes")
    assert approved.status == "executing"
    _, action = MACHINE.decided(suspended, approved=False, response="no")
    assert isinstance(action, Terminate)
    assert (action.outcome.status, action.outcome.rejection) == ("rejected", "no")
    _, action = MACHINE.decided(approved, approved=True, response="again")
    assert isinstance(action, Ignore)


@pytest.mark.parametrize("status", ["executing", "suspended"])
def test_cancel_revokes_authority_once(status: str) -> None:
    error = phronomy.CancellationError("stop")
    entry, action = MACHINE.cancelled(_running(_entry(status=status)), error)
    assert action == Terminate(outcome=error)
    assert (entry.status, entry.active, entry.pending_approval) == (
        "cancelling",
        None,
        None,
    )
    _, again = MACHINE.cancelled(entry, error)
    assert isinstance(again, Ignore)
