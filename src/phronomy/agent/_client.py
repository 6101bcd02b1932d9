"""The public API of supervised executions (``runtime.executions``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, final

import trio

from phronomy.engine import ResultHandle, random_uuid
from phronomy.errors import (
    BackpressureError,
    BusyError,
    InstanceStateError,
    InvalidInputError,
    NotFoundError,
)
from phronomy.storage import EXECUTION_PLAN_PREFIX, DeleteOp, LoadOp, PostOp
from phronomy.workflow import RecoveryClient

from ._arguments import agent_id_of, deadline_of
from ._driver import Driver
from ._handle import ExecutionHandle
from ._plan import Plan, PlanCache, Step, execution_plan, plan_of
from ._reading import ExecutionReader
from ._records import (
    agent_key,
    answer,
    answer_posting,
    check_execution_row,
)

if TYPE_CHECKING:
    from ._messages import ExecutionOwner, ExecutionRecord, ExecutionResult
    from ._table import ExecutionTable

__all__ = ["Executions"]


@final
class Executions(ExecutionReader):
    """Supervised executions: at most one live execution per key (``agent_id``).

    Example::

        def plan(task):                      # blocking: runs in a worker thread
            return call_planner(task)

        def ask(plan):
            return phronomy.ApprovalRequest(question="run this plan?", details=plan)

        async def act(approval, ctx):        # async: a supervised trio task
            return await ctx.offload(run_tool, approval.request.details)

        execution = runtime.executions.start("agent-7", [plan, ask, act], "ship the order")
        ...
        execution.approve("go")              # later, from any trio task
        result = await execution.result()

    An execution runs as an instance of its plan's generated workflow (see
    :func:`~phronomy.agent.execution_plan`): with a store it holds a lease, each step's
    result is saved, a suspended approval survives shutdown and crashes and can be
    answered from any process (:meth:`decide`, or the command line), and a runtime
    that serves the plan takes over the executions of a process that died.

    Cancelling (or a deadline) revokes the execution's result authority at once, but
    its caller and its key stay busy until every thread and task it started has
    physically finished; then the caller settles as cancelled. Threads are never
    killed or abandoned.
    """

    def __init__(self, table: ExecutionTable) -> None:
        """Internal: reached as ``runtime.executions``."""
        self._table = table
        self._plans = PlanCache()

    # --- starting ------------------------------------------------------------------

    def start(
        self,
        agent_id: str,
        steps: Sequence[Step] | Plan,
        input: Any = None,  # noqa: A002 - the first step's input
        *,
        timeout: float | None = None,
        deadline: float | None = None,
    ) -> ExecutionHandle:
        """Start an execution of *steps* for *agent_id* without waiting.

        Each step receives the previous step's return value (the first receives
        *input*). A step that returns an :class:`~phronomy.ApprovalRequest` suspends
        the execution until :meth:`approve` (the next step receives an
        :class:`~phronomy.Approval`) or :meth:`reject` (the execution ends
        ``rejected``). With a store, values between steps are saved as JSON.

        Args:
            agent_id: the key; one nonterminal top-level execution per key.
            steps: callables taking ``(value)`` or ``(value, ctx)``, or a plan made by
                :func:`~phronomy.agent.execution_plan`.
            input: the first step's input.
            timeout: seconds from now after which the execution is cancelled with
                :class:`~phronomy.DeadlineExceededError` (as :func:`trio.move_on_after`).
            deadline: the same as an absolute trio time (:func:`trio.current_time`
                based, as :func:`trio.move_on_at`); give one of the two.

        Returns:
            An :class:`ExecutionHandle`. A busy key fails it with
            :class:`~phronomy.BusyError`: at once when the key runs here, after the
            store's answer when it runs (or waits) elsewhere.

        Raises:
            InvalidInputError: an empty or invalid *agent_id*; a *timeout* that is not
                a positive number of seconds; a *deadline* that is not a trio time or
                has passed already; both given.
            DefinitionError: no steps, or a step of the wrong shape.
            ReentrancyError: called from a thread that does not run the runtime.
        """
        return ExecutionHandle(
            self,
            self._start(agent_id, steps, input, timeout=timeout, deadline=deadline),
        )

    def _start(
        self,
        agent_id: str,
        steps: Sequence[Step] | Plan,
        input: Any,  # noqa: A002 - the first step's input
        *,
        timeout: float | None,
        deadline: float | None,
    ) -> Driver:
        table = self._table
        table.engine.check_thread("runtime.executions.start()")
        key = agent_id_of(agent_id)
        plan = self._plan(steps)
        when = deadline_of(timeout, deadline)
        execution_id = random_uuid()
        caller: ResultHandle[ExecutionResult] = ResultHandle(
            f"execution:{key}:{execution_id}"
        )
        driver = Driver(
            table,
            plan,
            agent_id=key,
            key=agent_key(key),
            execution_id=execution_id,
            caller=caller,
        )
        busy = table.by_key(key)
        if busy is not None:
            caller.fail(
                BusyError(
                    f"Agent {key!r} already has a nonterminal top-level execution "
                    f"({busy.status})"
                )
            )
        elif table.running >= table.capacity:
            caller.fail(
                BackpressureError(
                    f"{table.capacity} executions run in this runtime already (its "
                    "pool_size + queue_size): start it again later"
                )
            )
        else:
            table.add(driver)
            driver.begin(input, when)
        return driver

    async def invoke(
        self,
        agent_id: str,
        steps: Sequence[Step] | Plan,
        input: Any = None,  # noqa: A002 - the first step's input
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - the execution's, not the wait's
        deadline: float | None = None,
    ) -> ExecutionResult:
        """``start(...)`` and wait for the result (see :meth:`ExecutionHandle.result`).

        Cancellation:
            Cancelling the caller stops the wait only; the execution goes on (cancel it
            with :meth:`cancel`).
        """
        driver = self._start(agent_id, steps, input, timeout=timeout, deadline=deadline)
        return await driver.caller.result()  # (its handle's wait, without the handle)

    # --- this runtime's executions -------------------------------------------------

    def owner(self, execution_id: str) -> ExecutionOwner | None:
        """A read-only view of an execution live in this runtime, or ``None``."""
        driver = self._table.by_id(execution_id)
        return None if driver is None else driver.owner()

    def is_admitted(self, agent_id: str | None) -> bool:
        """Whether the key has a nonterminal execution in this runtime."""
        return bool(agent_id) and agent_id in self._table

    def approve(self, execution_id: str, response: Any = None) -> None:
        """Approve a suspended execution of this runtime; the next step receives an
        :class:`~phronomy.Approval` (from another process: :meth:`decide`).

        Raises:
            NotFoundError: no live execution has that id.
            InstanceStateError: the execution is not waiting for an approval.
        """
        self._decide_here(execution_id, approved=True, response=response)

    def reject(self, execution_id: str, reason: Any = None) -> None:
        """Reject a suspended execution of this runtime; it ends ``rejected``.

        Raises:
            NotFoundError: no live execution has that id.
            InstanceStateError: the execution is not waiting for an approval.
        """
        self._decide_here(execution_id, approved=False, response=reason)

    def cancel(self, execution_id: str, reason: str | None = None) -> bool:
        """Cancel an execution of this runtime: its result authority is revoked at
        once; its caller settles once nothing it started runs any more.

        Returns:
            ``True`` if a live execution was asked to cancel.

        Raises:
            ReentrancyError: called from a thread that does not run the runtime.
        """
        self._table.engine.check_thread("runtime.executions.cancel()")
        driver = self._table.by_id(execution_id)
        return driver is not None and driver.cancel(reason)

    # --- any execution in the store ------------------------------------------------

    async def decide(
        self,
        agent_id: str,
        *,
        approve: bool,
        response: Any = None,
        execution_id: str | None = None,
    ) -> ExecutionRecord:
        """Answer the approval the key's execution waits for, from any process.

        The answer is stored in the execution's inbox; whichever runtime serves the
        execution's plan applies it (this one, if the execution is live here).

        Args:
            agent_id: the key.
            approve: approve (the next step runs) or reject (it ends ``rejected``).
            response: what the next step receives as ``Approval.response`` (or the
                rejection's reason); JSON.
            execution_id: answer only this execution (default: whichever waits).

        Returns:
            The key's record when the answer was stored.

        Raises:
            NotFoundError: the key has no execution.
            InstanceStateError: its execution is not waiting for an approval (or is
                another one than *execution_id*).

        Cancellation:
            Cancelling the caller stops the wait only; a stored answer is applied.
        """
        key = agent_id_of(agent_id)
        driver = self._table.by_key(key)
        if driver is not None and execution_id in (None, driver.execution_id):
            self._decide_here(driver.execution_id, approved=approve, response=response)
            await trio.lowlevel.checkpoint()
            return await self._record_or_fail(key)
        record = await self._record_or_fail(key)
        if record.status != "suspended" or execution_id not in (
            None,
            record.execution_id,
        ):
            raise InstanceStateError(
                f"agent {key!r}'s execution {record.execution_id!r} is {record.status}, "
                "not waiting for an approval"
                + (f" (and not {execution_id!r})" if execution_id else ""),
                instance_id=agent_key(key),
            )
        plan = self._served(record.plan)
        if plan is not None:  # applied here at once, by the plan this runtime runs
            await self._table.workflows.post(
                plan,
                agent_key(key),
                "approve" if approve else "reject",
                answer(record.execution_id, response),
            )
        else:  # stored for a runtime that serves the plan
            posting = answer_posting(
                key, record.execution_id, approve=approve, response=response
            )
            gateway = self._gateway
            assert gateway is not None  # the record was read from the store
            posted = await gateway.run(PostOp(posting=posting))
            if posted.outcome != "stored":
                raise InstanceStateError(
                    f"agent {key!r}'s execution took no answer ({posted.outcome})",
                    instance_id=posting.workflow_instance_id,
                )
        return record

    async def cancel_agent(
        self, agent_id: str, *, reason: str | None = None
    ) -> ExecutionRecord:
        """Cancel the key's execution wherever it runs or waits.

        An execution live in another runtime is asked through its row (it cancels at
        its next heartbeat, once its threads returned); a suspended one is saved
        ``cancelled`` directly.

        Returns:
            The key's record once it says ``cancelled``.

        Raises:
            NotFoundError: the key has no execution.
            InstanceStateError: its execution has ended already.

        Cancellation:
            Cancelling the caller stops the wait only: the cancellation goes on.
        """
        key = agent_id_of(agent_id)
        driver = self._table.by_key(key)
        if driver is not None:
            driver.cancel(reason)
            await driver.caller.wait()
            return await self._record_or_fail(key)
        record = await self._record_or_fail(key)
        plan = self._served(record.plan) or execution_plan(
            [_unknown_step], name=record.plan
        )  # a cancel reads and writes the row only: any plan of that name does
        await self._table.workflows.cancel(plan, agent_key(key), reason=reason)
        return await self._record_or_fail(key)

    async def purge(self, agent_id: str) -> bool:
        """Delete the key's execution record (one that ended).

        Returns:
            Whether a record was deleted.

        Raises:
            BusyError: an execution of the key is in progress (here, or in the store).
            InstanceStateError: the row under the key is not an execution's.

        Cancellation:
            Cancelling the caller stops the wait only; a delete already submitted runs.
        """
        key = agent_id_of(agent_id)
        if self.is_admitted(key):
            raise BusyError(
                f"Agent {key!r} has an execution in progress; it cannot be purged"
            )
        gateway = self._gateway
        if gateway is None:
            await trio.lowlevel.checkpoint()
            return False
        row = await gateway.run(LoadOp(workflow_instance_id=agent_key(key)))
        if row is None:
            return False
        check_execution_row(row)
        if row.status in ("running", "halted", "recovery_required"):
            raise BusyError(
                f"Agent {key!r}'s execution is {row.status} in the store; cancel it "
                "(runtime.executions.cancel_agent) before purging it"
            )
        await gateway.run(
            DeleteOp(
                workflow_instance_id=agent_key(key), expected_revision=row.revision
            )
        )
        return True

    async def resolve(
        self, agent_id: str, *, action: Literal["adopt", "release"]
    ) -> ExecutionRecord | None:
        """Resolve a ``recovery_required`` execution (a save's outcome was unknown).

        ``adopt``: what the store holds is the truth; ``release``: it becomes
        ``failed`` so the key can start again. A pending caller here fails with a
        :class:`~phronomy.RecoveryRequiredError`.

        Returns:
            The key's record after the resolution (``None`` without a store).

        Raises:
            NotFoundError: the key does not require recovery.
            InvalidInputError: an unknown *action*.

        Cancellation:
            The resolution runs to completion once started (shielded).
        """
        key = agent_id_of(agent_id)
        if action not in ("adopt", "release"):
            raise InvalidInputError(
                f"action must be 'adopt' or 'release', got {action!r}"
            )
        recovery = RecoveryClient(self._table.coordinator)
        with trio.CancelScope(shield=True):
            await recovery._resolve(agent_key(key), action)  # noqa: SLF001 - the key's prefix
        driver = self._table.by_key(key)
        if driver is not None and driver.status == "recovery_required":
            driver.shutdown(None)
        return await self.record(key)

    # --- internals -----------------------------------------------------------------

    def _plan(self, steps: Sequence[Step] | Plan) -> Plan:
        # a list or tuple first: the Sequence ABC's check is a call
        if not isinstance(steps, list | tuple) and not isinstance(steps, Sequence):
            return plan_of(steps)
        return self._plans.plan(
            steps, checkpoints=self._table.coordinator.gateway is not None
        )

    def _served(self, name: str) -> Plan | None:
        """The plan *name* this runtime serves, if it does."""
        plan = self._table.coordinator.served.get(EXECUTION_PLAN_PREFIX + name)
        return None if plan is None else plan_of(plan)

    async def _record_or_fail(self, key: str) -> ExecutionRecord:
        record = await self.record(key)
        if record is None:
            raise NotFoundError(
                f"agent {key!r} has no execution", instance_id=agent_key(key)
            )
        return record

    def _decide_here(self, execution_id: str, *, approved: bool, response: Any) -> None:
        self._table.engine.check_thread(
            f"runtime.executions.{'approve' if approved else 'reject'}()"
        )
        driver = self._table.by_id(execution_id)
        if driver is None:
            raise NotFoundError(f"no live execution {execution_id!r} in this runtime")
        if driver.status != "suspended":
            raise InstanceStateError(
                f"execution {execution_id!r} is {driver.status}, not waiting for an approval"
            )
        driver.decide(approved=approved, response=response)


def _unknown_step(value: Any) -> Any:  # pragma: no cover - never runs
    return value
