"""One execution, carried by the runtime that started it from its start to its end.

The execution itself is an instance of its plan's generated workflow (see
:mod:`phronomy.agent._plan`); the driver only chains its segments: at a checkpoint where
a segment halted (a live one goes on by itself) it sends ``continue``, at an approval
it waits for a decision, and it turns how the
instance ended into the caller's :class:`~phronomy.ExecutionResult` or error. When
the instance moves on elsewhere (a runtime that serves the plan applied an approval
sent from another process), the driver follows it: updates published here, and a
read of the row now and then.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol, final

import trio

from phronomy.durability import mark_op
from phronomy.errors import (
    BusyError,
    CancellationError,
    DeadlineExceededError,
    InstanceExistsError,
    NotFoundError,
    PhronomyError,
    RuntimeShutdownError,
    WorkflowCancelledError,
)

from ._follow import RowFollower
from ._messages import ExecutionOwner, ExecutionResult
from ._plan import ExecutionState, is_local, step_at
from ._records import answer
from ._segment import SegmentCaller

if TYPE_CHECKING:
    from phronomy.engine import Host, ResultHandle, Timer
    from phronomy.workflow import (
        Step,
        WorkflowClient,
        WorkflowCoordinator,
        WorkflowResult,
    )

    from ._messages import ApprovalRequest, ExecutionStatus
    from ._plan import Plan

__all__ = ["Driver"]

logger = logging.getLogger(__name__)


class _Table(Protocol):
    @property
    def engine(self) -> Host: ...

    workflows: WorkflowClient
    coordinator: WorkflowCoordinator

    def ended(self, driver: Driver) -> None: ...

    def suspended(self, driver: Driver, *, now: bool) -> None: ...


@final
class Driver:
    """Chains the segments of one execution and settles its caller (trio thread)."""

    __slots__ = (
        "_cancel_reason",
        "_cancelled",
        "_changed",
        "_deadline",
        "_deadline_hit",
        "_durable",
        "_follower",
        "_halted",
        "_table",
        "agent_id",
        "caller",
        "execution_id",
        "key",
        "pending",
        "plan",
        "status",
        "step_index",
    )

    def __init__(
        self,
        table: _Table,
        plan: Plan,
        *,
        agent_id: str,
        key: str,
        execution_id: str,
        caller: ResultHandle[ExecutionResult],
    ) -> None:
        """Internal: made by :meth:`~phronomy.agent.Executions.start`."""
        self._table = table
        self.plan = plan
        self.agent_id = agent_id
        self.key = key
        self.execution_id = execution_id
        self.caller = caller
        self.status: ExecutionStatus = "starting"
        self.step_index = 0
        self.pending: ApprovalRequest | None = None
        self._changed: trio.Event | None = None  # made when someone waits for a change
        self._durable = table.coordinator.gateway is not None
        self._halted: WorkflowResult[ExecutionState] | None = None
        self._follower: RowFollower | None = None  # suspended, or moved on elsewhere
        self._cancelled = False
        self._cancel_reason: str | None = None
        self._deadline_hit = False
        self._deadline: Timer | None = None

    # --- what callers see ----------------------------------------------------------

    @property
    def done(self) -> bool:
        """Whether the caller has settled."""
        return self.caller.done

    def changed(self) -> trio.Event:
        """An event set at the execution's next change (status, step or end); set
        already once the caller settled."""
        if self._changed is None:
            self._changed = trio.Event()
            if self.done:
                self._changed.set()
        return self._changed

    def owner(self) -> ExecutionOwner:
        """The read-only view of the execution."""
        status = self.status
        segment = self._table.coordinator.live_segment(self.key)
        if segment is not None and status != "cancelling":
            status = {
                "admitting": "starting",
                "executing": "executing",
                "persisting_terminal": "terminalizing",
                "recovery_required": "recovery_required",
            }.get(segment.status, status)  # type: ignore[assignment]
        return ExecutionOwner(
            execution_id=self.execution_id,
            agent_id=self.agent_id,
            status=status,
            step_index=self.step_index,
            pending_approval=self.pending if status == "suspended" else None,
        )

    # --- driving -------------------------------------------------------------------

    def begin(self, value: Any, deadline: float | None) -> None:
        """Start the execution's first segment (*deadline*: a trio time)."""
        timeout = None
        if deadline is not None:
            timeout = max(deadline - trio.current_time(), 0.001)
            self._deadline = self._table.engine.timers.schedule(
                timeout, self._deadline_passed
            )
        state = ExecutionState(
            execution_id=self.execution_id,
            agent_id=self.agent_id,
            value=value,
            timeout=timeout,
        )
        self._table.workflows.start_as(
            self.plan,
            state,
            workflow_instance_id=self.key,
            caller=SegmentCaller(self),
            on_step=self._stepped,
            if_exists="restart_closed",
        )

    def decide(self, *, approved: bool, response: Any) -> None:
        """Answer the approval the execution waits for (checked by the caller)."""
        self._send("approve" if approved else "reject", response)
        self._set(status="executing")

    def cancel(self, reason: str | None) -> bool:
        """Revoke the execution's result authority; its caller settles once nothing
        it started runs any more.

        Returns:
            Whether it was asked (``False``: it ended, or was asked already).
        """
        if self.done or self._cancelled:
            return False
        self._cancelled = True
        self._cancel_reason = reason
        suspended = self.status == "suspended"
        self._set(status="cancelling")
        if suspended and not self._durable:
            self._settle(error=self._cancel_error(reason))
            return True
        self._table.engine.start_task(self._cancel_instance, reason)
        return True

    def shutdown(self, error: BaseException | None) -> None:
        """The runtime shuts down: settle the caller, saying what the store keeps."""
        if self.done:
            return
        if error is not None:
            self._settle(error=error)
            return
        what = f"execution {self.execution_id!r} of agent {self.agent_id!r}"
        cut = "it was cut off when the runtime shut down"
        if self.status != "suspended":
            note = cut
        elif not self._durable:
            note = f"{cut} (it waited for an approval)"
        elif is_local(self.plan):
            self._close_cut_off()
            note = (
                f"{cut} (it waited for an approval); its steps cannot be imported by "
                "another process, so its record is closed as cancelled and the key can "
                "start again"
            )
        else:
            note = (
                "it stays suspended in the store: answer it from any process "
                f"(runtime.executions.decide({self.agent_id!r}, approve=True) or "
                f"`python -m phronomy executions approve --db ... {self.agent_id}`) "
                "and a runtime that serves its plan resumes it"
            )
        self._settle(
            error=RuntimeShutdownError(
                f"the runtime shut down before {what} ended: {note}"
            )
        )

    def _stepped(self, step: Step[ExecutionState]) -> None:
        if self.status != "cancelling":
            self._set(status="executing", index=step_at(step.phase))

    def _send(self, event: str, response: Any = None) -> None:
        payload = answer(self.execution_id, response)
        workflows = self._table.workflows
        if self._durable:
            handle = workflows.start_event(
                self.plan,
                event,
                workflow_instance_id=self.key,
                payload=payload,
                on_step=self._stepped,
            )
        else:
            handle = workflows.start_event(
                self.plan,
                event,
                halted=self._halted,
                payload=payload,
                on_step=self._stepped,
            )
        self._unfollow()  # the answer was taken (a bad one raised above)
        handle.on_complete(SegmentCaller(self).settle_like)

    def segment_done(
        self,
        result: WorkflowResult[ExecutionState] | None,
        error: BaseException | None,
    ) -> None:
        """A segment of the execution ended with *result*, or failed with *error*."""
        if self.caller.done:
            return
        if result is None:
            assert error is not None
            if self._waiting:
                return  # an answer another segment overtook: the follower decides
            self._settle(error=self._error(error))
            return
        self._halted = result
        self._reached(result.status, result.phase, result.state, None)

    def _reached(
        self,
        status: str,
        phase: str | None,
        state: ExecutionState | None,
        detail: str | None,
    ) -> None:
        """Act on where the instance is (after a segment, here or elsewhere)."""
        if state is not None and not state.execution_id:
            state = None  # the row of a key that never saved
        if state is not None and state.execution_id != self.execution_id:
            self._settle(
                error=PhronomyError(
                    f"agent {self.agent_id!r} runs another execution "
                    f"({state.execution_id!r}) now; execution {self.execution_id!r} "
                    "was replaced"
                )
            )
            return
        if status == "halted" and (phase or "").startswith("after_"):
            if not self._cancelled:
                self._send("continue")
            return
        if status == "halted" and state is not None:
            self.pending = state.approval_request
            self._set(status="suspended", index=step_at(phase))
            self._follow()
            return
        if status in ("running", "halted"):
            self._follow()  # moved on elsewhere: follow it
            return
        if status == "purged":
            self._settle(
                error=NotFoundError(f"execution {self.execution_id!r}: {detail}")
            )
            return
        if status == "finished" and state is not None:
            if state.outcome == "deadline":
                self._settle(error=self._deadline_error())
            elif state.outcome == "rejected":
                self._settle(result=self._result("rejected", None, state.rejection))
            else:
                self._settle(result=self._result("completed", state.value, None))
            return
        if status == "cancelled":
            self._settle(error=self._cancel_error(detail))
            return
        if status == "recovery_required":
            self._set(status="recovery_required")
            return  # the caller stays pending until an operator resolves it
        self._settle(
            error=PhronomyError(
                f"execution {self.execution_id!r} of agent {self.agent_id!r} {status}"
                + (f": {detail}" if detail else "")
            )
        )

    @property
    def _waiting(self) -> bool:
        return self._follower is not None

    def _follow(self) -> None:
        if self._follower is None and self._durable:
            self._follower = RowFollower(self._table, self.key, self._moved)
        elif self._follower is None:
            self._follower = RowFollower(None, self.key, self._moved)

    def _unfollow(self) -> None:
        follower, self._follower = self._follower, None
        if follower is not None:
            follower.stop()

    def _moved(
        self, status: str, phase: str | None, state: Any, detail: str | None
    ) -> None:
        """The instance moved on (a segment here, or the row says so)."""
        if self._follower is None or self.done:
            return
        halted_at = None if self._halted is None else self._halted.phase
        if status == "halted" and phase == halted_at:
            return  # still where it waited
        self._unfollow()
        self._reached(status, phase, state, detail)

    # --- ending --------------------------------------------------------------------

    async def _cancel_instance(self, reason: str | None) -> None:
        try:
            await self._table.workflows.cancel(self.plan, self.key, reason=reason)
        except Exception as exc:  # noqa: BLE001 - the segment settles the caller
            if not self.done and self.status == "cancelling" and self._waiting:
                self._settle(error=self._error(exc))
            return
        # A live segment settled the caller already (its end comes first); a halted
        # one (suspended, or between two steps) was saved cancelled.
        if not self.done:
            self._settle(error=self._cancel_error(reason))

    def _deadline_passed(self) -> None:
        self._deadline = None
        if not self.done:
            self._deadline_hit = True
            self.cancel("its deadline passed")

    def _close_cut_off(self) -> None:
        """A suspended execution of a plan only this process has: close its row."""
        gateway = self._table.coordinator.gateway
        halted = self._halted
        if gateway is None or halted is None:
            return
        gateway.submit_quietly(
            mark_op(
                self.key,
                "cancelled",
                expected_revision=halted.revision,
                detail="cancelled: cut off when its runtime shut down (its steps exist "
                "only in that process)",
            ),
            f"close execution {self.execution_id!r} of agent {self.agent_id!r}",
        )

    def _settle(
        self,
        *,
        result: ExecutionResult | None = None,
        error: BaseException | None = None,
    ) -> None:
        if self.caller.done:
            return
        if self._follower is not None:
            self._unfollow()
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._table.ended(self)
        if isinstance(error, CancellationError):
            self.caller.cancel(error)
        elif error is not None:
            self.caller.fail(error)
        else:
            assert result is not None
            self.caller.complete(result)
        if self._changed is not None:
            self._changed.set()  # stays set: changed() of a settled driver is set

    def _set(self, *, status: ExecutionStatus, index: int | None = None) -> None:
        if (status == "suspended") != (self.status == "suspended"):
            self._table.suspended(self, now=status == "suspended")
        self.status = status
        if index is not None:
            self.step_index = index
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    def _result(self, status: Any, value: Any, rejection: Any) -> ExecutionResult:
        return ExecutionResult(
            execution_id=self.execution_id,
            agent_id=self.agent_id,
            status=status,
            value=value,
            rejection=rejection,
        )

    def _error(self, error: BaseException) -> BaseException:
        """What the caller gets for a segment's *error*."""
        if isinstance(error, WorkflowCancelledError):
            return self._cancel_error(error.reason)
        if (
            isinstance(error, InstanceExistsError | BusyError)
            and self.status == "starting"
        ):
            return BusyError(
                f"Agent {self.agent_id!r} already has a nonterminal top-level execution "
                "(in another runtime, or suspended in the store): "
                f"runtime.executions.record({self.agent_id!r}) says where it is; "
                f"cancel it with runtime.executions.cancel_agent({self.agent_id!r}) or "
                f"`python -m phronomy executions cancel --db ... {self.agent_id}`"
            )
        return error

    def _cancel_error(self, reason: str | None) -> CancellationError:
        if self._deadline_hit:
            return self._deadline_error()
        reason = reason or self._cancel_reason
        if reason and reason.startswith("cancelled: "):
            reason = reason.removeprefix("cancelled: ")
        return CancellationError(
            f"execution {self.execution_id!r} cancelled"
            + (f": {reason}" if reason else "")
        )

    def _deadline_error(self) -> DeadlineExceededError:
        return DeadlineExceededError(
            f"execution {self.execution_id!r} of agent {self.agent_id!r} passed its deadline"
        )
