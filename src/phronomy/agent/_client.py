"""The public API of supervised executions (``runtime.executions``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, cast, final

import msgspec
import trio

from phronomy.durability import kind_of
from phronomy.engine import ResultHandle, random_uuid
from phronomy.errors import (
    BusyError,
    CancellationError,
    DefinitionError,
    InstanceStateError,
    InvalidInputError,
    NotFoundError,
)
from phronomy.storage import (
    DeleteOp,
    LoadOp,
    quarantined,
    release_quarantine,
    validate_instance_id,
)

from ._handle import ExecutionHandle
from ._messages import (
    ApprovalDecision,
    CancelExecution,
    ExecutionOwner,
    ExecutionRecord,
    ExecutionResult,
    ResolveExecution,
    StartExecution,
)
from ._records import (
    StaleExecution,
    agent_key,
    decode_record,
    record_resolution,
    stale_entry,
    written,
)
from ._steps import arity

if TYPE_CHECKING:
    from ._coordinator import ExecutionCoordinator

__all__ = ["Executions", "Step"]

Step = Callable[..., Any]
"""A step: ``(value)`` or ``(value, ctx)``; ``def`` runs in a worker thread, ``async def``
runs as a supervised trio task."""


def _deadline(timeout: object, deadline: object) -> float | None:
    """The trio-time deadline of an execution given *timeout* or *deadline*.

    Raises:
        InvalidInputError: a bad value, both given, or a deadline that has passed.
    """
    if timeout is not None and deadline is not None:
        raise InvalidInputError(
            "give timeout= (seconds from now) or deadline= (a trio time), not both"
        )
    if timeout is not None:
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or not 0 < timeout < math.inf
        ):
            raise InvalidInputError(
                f"timeout must be a positive number of seconds, got {timeout!r}"
            )
        return trio.current_time() + timeout
    if deadline is None:
        return None
    if isinstance(deadline, bool) or not isinstance(deadline, (int, float)):
        raise InvalidInputError(
            f"deadline must be a trio time (a float, as trio.current_time()), got "
            f"{deadline!r}"
        )
    now = trio.current_time()
    if deadline <= now:
        raise InvalidInputError(
            f"deadline {deadline!r} has passed (trio.current_time() is {now:.3f}): "
            "deadline= is an absolute trio time; for seconds from now, pass timeout="
        )
    return float(deadline)


def _validate_agent_id(agent_id: object) -> str:
    return validate_instance_id(agent_id, what="agent_id")


@final
class Executions:
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

    Cancelling (or a deadline) revokes the execution's result authority at once, but
    its caller, its admission and its key stay busy until every thread and task it
    started has physically finished; then the caller settles as cancelled. Threads are
    never killed or abandoned.
    """

    def __init__(self, coordinator: ExecutionCoordinator) -> None:
        """Internal: reached as ``runtime.executions``."""
        self._coordinator = coordinator

    def start(
        self,
        agent_id: str,
        steps: Sequence[Step],
        input: Any = None,  # noqa: A002 - the first step's input
        *,
        timeout: float | None = None,
        deadline: float | None = None,
    ) -> ExecutionHandle:
        """Start an execution of *steps* for *agent_id* without waiting.

        Each step receives the previous step's return value (the first receives
        *input*). A step that returns an :class:`~phronomy.ApprovalRequest` suspends the execution
        until :meth:`approve` (the next step receives an :class:`~phronomy.Approval`) or
        :meth:`reject` (the execution ends ``rejected``).

        Args:
            agent_id: the key; one nonterminal top-level execution per key.
            steps: callables taking ``(value)`` or ``(value, ctx)``.
            input: the first step's input.
            timeout: seconds from now after which the execution is cancelled with
                :class:`~phronomy.DeadlineExceededError` (as :func:`trio.move_on_after`).
            deadline: the same as an absolute trio time (:func:`trio.current_time`
                based, as :func:`trio.move_on_at`); give one of the two.

        Returns:
            An :class:`ExecutionHandle`. A busy key fails it with
            :class:`~phronomy.BusyError` before any storage is touched.

        Raises:
            InvalidInputError: an empty or invalid *agent_id*; a *timeout* that is not
                a positive number of seconds; a *deadline* that is not a trio time or
                has passed already; both given.
            DefinitionError: no steps, or a step of the wrong shape.
            ReentrancyError: called from a thread that does not run the runtime.
        """
        self._coordinator.engine.check_thread("runtime.executions.start()")
        key = _validate_agent_id(agent_id)
        step_list = list(steps)
        if not step_list:
            raise DefinitionError("an execution needs at least one step")
        arities = tuple(arity(step, i) for i, step in enumerate(step_list))
        deadline = _deadline(timeout, deadline)
        execution_id = random_uuid()
        caller: ResultHandle[ExecutionResult] = ResultHandle(
            f"execution:{key}:{execution_id}"
        )
        command = StartExecution(
            agent_id=key,
            execution_id=execution_id,
            steps=step_list,
            arities=arities,
            input=input,
            owner=object(),
            caller=caller,
            deadline=deadline,
        )
        if not self._coordinator.post_message(
            command, admission=True, completion=caller
        ):
            caller.fail(self._coordinator.engine.refusal("the execution start"))
        caller.on_complete(lambda _: self._coordinator.live.notify(execution_id))
        return ExecutionHandle(self, self._coordinator.live, execution_id, key, caller)

    async def invoke(
        self,
        agent_id: str,
        steps: Sequence[Step],
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
        handle = self.start(agent_id, steps, input, timeout=timeout, deadline=deadline)
        return await handle.result()

    def owner(self, execution_id: str) -> ExecutionOwner | None:
        """A read-only view of a live execution, or ``None``."""
        return self._coordinator.live.owner(execution_id)

    def is_admitted(self, agent_id: str | None) -> bool:
        """Whether the key has a nonterminal execution in this runtime."""
        return bool(agent_id) and agent_id in self._coordinator.admissions

    def approve(self, execution_id: str, response: Any = None) -> None:
        """Approve a suspended execution; the next step receives an :class:`~phronomy.Approval`.

        Raises:
            NotFoundError: no live execution has that id.
            InstanceStateError: the execution is not waiting for an approval.
        """
        self._decide(execution_id, approved=True, response=response)

    def reject(self, execution_id: str, reason: Any = None) -> None:
        """Reject a suspended execution; it ends with status ``rejected``.

        Raises:
            NotFoundError: no live execution has that id.
            InstanceStateError: the execution is not waiting for an approval.
        """
        self._decide(execution_id, approved=False, response=reason)

    def cancel(self, execution_id: str, reason: str | None = None) -> bool:
        """Cancel an execution: result authority is revoked when the request is dispatched.

        Returns:
            ``True`` if a live execution was asked to cancel.

        Raises:
            ReentrancyError: called from a thread that does not run the runtime.
        """
        self._coordinator.engine.check_thread("runtime.executions.cancel()")
        entry = self._coordinator.live.owner(execution_id)
        if entry is None or entry.status not in ("executing", "suspended"):
            return False
        message = f"execution {execution_id!r} cancelled" + (
            f": {reason}" if reason else ""
        )
        return self._coordinator.post_message(
            CancelExecution(execution_id=execution_id, error=CancellationError(message))
        )

    async def record(self, agent_id: str) -> ExecutionRecord | None:
        """The agent's durable execution record (``None`` without a store or a record).

        Raises:
            CorruptRecordError: the stored record does not decode.

        Cancellation:
            Safe: nothing is changed.
        """
        key = _validate_agent_id(agent_id)
        gateway = self._coordinator.gateway
        if gateway is None:
            await trio.lowlevel.checkpoint()
            return None
        _, record = await gateway.run(
            LoadOp(workflow_instance_id=agent_key(key)), finish=decode_record
        )
        return cast("ExecutionRecord | None", record)

    async def purge(self, agent_id: str) -> bool:
        """Delete the agent's durable record.

        Returns:
            Whether a record was deleted.

        Raises:
            BusyError: an execution of the key is in progress in this runtime.
            InstanceStateError: the row under the key is not an execution record
                (nothing is deleted).

        Cancellation:
            Cancelling the caller stops the wait only; a delete already submitted runs.
        """
        key = _validate_agent_id(agent_id)
        if self.is_admitted(key):
            raise BusyError(
                f"Agent {key!r} has an execution in progress; it cannot be purged"
            )
        gateway = self._coordinator.gateway
        if gateway is None:
            await trio.lowlevel.checkpoint()
            return False
        row = await gateway.run(LoadOp(workflow_instance_id=agent_key(key)))
        if row is None:
            return False
        if kind_of(row) != "execution":
            raise InstanceStateError(
                f"{agent_key(key)!r} is a workflow instance of {row.workflow!r} (saved "
                "by a release that did not reserve the prefix), not an execution "
                "record: purge refuses it; delete it as a workflow instance",
                instance_id=agent_key(key),
            )
        await gateway.run(
            DeleteOp(
                workflow_instance_id=agent_key(key), expected_revision=row.revision
            )
        )
        return True

    async def stale(self) -> list[StaleExecution]:
        """Execution records that may have no live owner any more.

        A record is listed when the store says its execution is ``active`` although it
        does not run in this runtime (its runtime stopped while the execution waited
        for an approval, or its process crashed), or when the outcome of its last write
        is unknown (``recovery_required``, here or in the store). Such a record refuses
        new starts of its key until it is resolved with :meth:`resolve`.

        Without leases, an ``active`` record may still belong to an execution running in
        *another* process that shares the store: resolve only what you know is dead.

        Returns:
            The stale records, by agent id.

        Raises:
            CorruptRecordError: a stored record does not decode.

        Cancellation:
            Safe: nothing is changed.
        """
        local = {
            a.key for a in self._coordinator.admissions.in_state("recovery_required")
        }
        service = self._coordinator.gateway
        found: dict[str, StaleExecution] = {}
        if service is not None:
            identity = service.store.identity
            for status in ("running", "recovery_required"):
                for listed in await service.list_all("execution", status):
                    key = listed.workflow_instance_id
                    row, record = await service.run(
                        LoadOp(workflow_instance_id=key), finish=decode_record
                    )
                    entry = stale_entry(
                        row, record, quarantined=quarantined(identity, key) is not None
                    )
                    if entry is not None and (
                        entry.agent_id in local
                        or entry.agent_id not in self._coordinator.admissions
                    ):
                        found[entry.agent_id] = entry
        for key in local:
            found[key] = msgspec.structs.replace(
                found.get(key)
                or StaleExecution(
                    agent_id=key, execution_id=None, status="recovery_required"
                ),
                in_process=True,
            )
        return [found[key] for key in sorted(found)]

    async def resolve(
        self, agent_id: str, *, action: Literal["adopt", "release"]
    ) -> ExecutionRecord | None:
        """Close a stale execution record so the key can start again.

        ``adopt`` keeps what the store recorded (a terminal outcome stays; a record that
        still says ``active`` is closed as ``abandoned``); ``release`` closes the record
        as ``abandoned`` whatever it says. A recovery-required admission of the key in
        this runtime is cleared too, and its pending caller fails with a
        :class:`~phronomy.RecoveryRequiredError` that says it was resolved.

        Returns:
            The record after the resolution (``None`` without a store).

        Raises:
            BusyError: the key has a live execution in this runtime (cancel it).
            NotFoundError: the key has nothing stale, here or in the store.
            ConflictError: the record changed during the resolution (try again).
            ValueError: an unknown *action*.

        Cancellation:
            The resolution runs to completion once started (shielded).
        """
        key = _validate_agent_id(agent_id)
        if action not in ("adopt", "release"):
            raise InvalidInputError(
                f"action must be 'adopt' or 'release', got {action!r}"
            )
        admission = self._coordinator.admissions.get(key)
        if admission is not None and admission.state != "recovery_required":
            raise BusyError(
                f"Agent {key!r} has a live execution in this runtime ({admission.state}); "
                "cancel it instead of resolving it"
            )
        with trio.CancelScope(shield=True):
            resolved = await self._resolve(key, action)
        return resolved

    async def _resolve(
        self, key: str, action: Literal["adopt", "release"]
    ) -> ExecutionRecord | None:
        done: ResultHandle[bool] = ResultHandle(f"resolve:{key}")
        if not self._coordinator.post_message(
            ResolveExecution(agent_id=key, done=done), completion=done
        ):
            raise self._coordinator.engine.refusal("the resolution")
        local = await done.result()
        service = self._coordinator.gateway
        if service is None:
            if not local:
                raise NotFoundError(f"agent {key!r} has no stale execution")
            return None
        store_key = agent_key(key)
        identity = service.store.identity
        row, record = await service.run(
            LoadOp(workflow_instance_id=store_key), finish=decode_record
        )
        try:
            op, resolved = record_resolution(
                key,
                row,
                record,
                action,
                by="runtime.executions.resolve()",
                quarantined=quarantined(identity, store_key) is not None,
            )
        except NotFoundError:
            if local:  # only this runtime's admission needed resolving
                return None
            raise
        written(await service.run(op), key)
        release_quarantine(identity, store_key)
        return resolved

    def _decide(self, execution_id: str, *, approved: bool, response: Any) -> None:
        self._coordinator.engine.check_thread(
            f"runtime.executions.{'approve' if approved else 'reject'}()"
        )
        view = self._coordinator.live.owner(execution_id)
        if view is None:
            raise NotFoundError(f"no live execution {execution_id!r} in this runtime")
        if view.status != "suspended":
            raise InstanceStateError(
                f"execution {execution_id!r} is {view.status}, not waiting for an approval"
            )
        decision = ApprovalDecision(
            execution_id=execution_id, approved=approved, response=response
        )
        if not self._coordinator.post_message(decision):
            raise self._coordinator.engine.refusal("the approval decision")
