"""The coordinator of supervised executions: every decision is made on the dispatcher."""

from __future__ import annotations

import inspect
import logging
from typing import TYPE_CHECKING, Any, final

import msgspec
import trio

from phronomy.durability import mark_op, save_outcome
from phronomy.engine import random_hex
from phronomy.errors import (
    BusyError,
    CancellationError,
    ConflictError,
    DeadlineExceededError,
    PhronomyError,
    PhronomyInternalError,
    RecoveryRequiredError,
    RuntimeShutdownError,
)
from phronomy.storage import (
    LoadOp,
    SaveOp,
    check_not_quarantined,
    quarantine,
)

from ._context import StepContext
from ._messages import (
    ActiveStep,
    Approval,
    ApprovalDecision,
    ApprovalRequest,
    CancelExecution,
    DurableStarted,
    ExecutionEntry,
    ExecutionRecord,
    ExecutionResult,
    PhysicalCompletion,
    RecordLoaded,
    ResolveExecution,
    StartExecution,
    StepResult,
    TerminalSaved,
)
from ._records import agent_key, decode_record, record_request
from ._registry import AgentRegistry

if TYPE_CHECKING:
    import outcome

    from phronomy.durability import DurabilityService
    from phronomy.engine import Engine, OffloadPool, ResultHandle
    from phronomy.storage import StoredRecord

__all__ = ["ExecutionCoordinator"]

logger = logging.getLogger(__name__)

_RESOLVE_HINT = (
    "runtime.executions.resolve({agent!r}, action='release') or "
    "`python -m phronomy executions resolve --db FILE {agent} release`"
)


@final
class ExecutionCoordinator:
    """Runs supervised executions; one per runtime.

    Steps run one after another. A sync step runs in a worker thread of the
    ``phronomy.executions`` pool; an ``async def`` step runs as a supervised trio task.
    Each step run has a semantic ``step_id``; its result is applied only while it is
    still the execution's current step, so late results after a cancellation never
    change live state.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        pool: OffloadPool,
        gateway: DurabilityService | None,
    ) -> None:
        """Create the coordinator and register its registry on *engine*.

        At most ``pool_size + queue_size`` of *pool* executions are busy at once (their
        steps then never meet a full pool); a start beyond that is refused with
        :class:`~phronomy.BackpressureError` before it touches anything.
        """
        self.engine = engine
        self.pool = pool
        self.gateway = gateway
        self.registry: AgentRegistry = engine.receiver(
            AgentRegistry,
            lambda e: AgentRegistry(
                e,
                self.deliver,
                capacity=pool.capacity,
                cut_off=self._cut_off,
                flush=gateway.wait_idle if gateway is not None else None,
            ),
        )

    def deliver(self, message: object) -> None:
        """Handle one execution command (dispatcher only); never fails the dispatcher."""
        self.engine.assert_dispatcher()
        try:
            self._handle(message)
        except Exception as exc:  # a coordinator bug must not take the runtime down
            logger.exception("execution command %s failed", type(message).__name__)
            execution_id = getattr(message, "execution_id", None)
            entry = self.registry.entry(execution_id) if execution_id else None
            if entry is not None and not entry.caller.done:
                entry.caller.fail(
                    PhronomyInternalError(
                        f"execution {execution_id!r} failed internally: {exc!r}"
                    )
                )

    def _handle(self, message: object) -> None:
        match message:
            case StartExecution():
                self._start(message)
            case RecordLoaded():
                self._record_loaded(message)
            case DurableStarted():
                self._durable_started(message)
            case ResolveExecution():
                message.done.complete(self.registry.resolve(message.agent_id))
            case StepResult():
                self._step_done(message)
            case ApprovalDecision():
                self._decide(message)
            case CancelExecution():
                self._cancel(message.execution_id, message.error)
            case PhysicalCompletion():
                self.registry.physically_complete(message.execution_id, message.token)
            case TerminalSaved():
                self._terminal_saved(message)
            case _:
                raise PhronomyInternalError(f"unknown execution command {message!r}")

    # --- admission and durable creation ----------------------------------------------

    def _start(self, cmd: StartExecution) -> None:
        try:
            self.registry.admit_agent_execution(cmd.agent_id, cmd.owner)
        except Exception as exc:  # noqa: BLE001 - the caller's error (busy, full, closing)
            cmd.caller.fail(exc)
            return
        if self.gateway is None:
            self._run(cmd, durable_revision=None)
            return
        self.gateway.submit(
            LoadOp(workflow_instance_id=agent_key(cmd.agent_id)),
            lambda loaded: self._post(RecordLoaded(command=cmd, loaded=loaded), cmd),
            finish=decode_record,
        )

    def _post(self, message: object, cmd: StartExecution) -> None:
        if not self.registry.post_message(message, completion=cmd.caller):
            cmd.caller.fail(
                RuntimeShutdownError(
                    "Runtime rejected the execution start while shutting down"
                )
            )

    def _refuse(self, cmd: StartExecution, error: BaseException) -> None:
        """A start refused before it wrote anything: the key is free again."""
        self.registry.release_agent_execution_admission(cmd.agent_id, owner=cmd.owner)
        cmd.caller.fail(error)

    def _record_loaded(self, message: RecordLoaded) -> None:
        cmd = message.command
        assert self.gateway is not None
        agent = cmd.agent_id
        try:
            row, current = message.loaded.unwrap()
            check_not_quarantined(self.gateway.store.identity, agent_key(agent))
            request = record_request(
                agent,
                ExecutionRecord(execution_id=cmd.execution_id, status="active"),
                _startable(agent, row, current),
            )
        except Exception as exc:  # noqa: BLE001 - refused before anything was written
            self._refuse(cmd, exc)
            return
        self.gateway.submit(
            SaveOp(request=request),
            lambda saved: self._post(
                DurableStarted(command=cmd, saved=save_outcome(saved)), cmd
            ),
        )

    def _durable_started(self, message: DurableStarted) -> None:
        cmd, result = message.command, message.saved
        if result.outcome == "success":
            self._run(cmd, durable_revision=result.revision)
        elif result.outcome == "known_failure":
            error = result.error or PhronomyError("durable execution start failed")
            if isinstance(error, ConflictError):
                busy = BusyError(
                    f"Agent {cmd.agent_id!r} was started by another owner concurrently"
                )
                busy.__cause__ = error
                error = busy
            self._refuse(cmd, error)
        else:  # the active record may exist: fail closed until resolved
            self.registry.mark_agent_admission_recovery_required(
                cmd.agent_id, cmd.owner
            )
            self._mark_recovery_required(cmd.agent_id, result.error)
            cmd.caller.fail(
                RecoveryRequiredError(
                    f"the durable start of agent {cmd.agent_id!r} has an unknown outcome "
                    f"({result.error!r}); the key is refused until it is resolved with "
                    + _RESOLVE_HINT.format(agent=cmd.agent_id),
                    instance_id=agent_key(cmd.agent_id),
                )
            )

    def _cut_off(self, entry: ExecutionEntry, quiescent: bool) -> str:
        """The runtime shuts down with *entry* live: close its durable record if honest."""
        if self.gateway is None or entry.durable_revision is None:
            return ""
        if not quiescent or entry.status == "recovery_required":
            return (
                " Its durable record stays active (work it started was still running, "
                "or its outcome is unknown): runtime.executions.stale() lists it and "
                + _RESOLVE_HINT.format(agent=entry.agent_id)
                + " releases it."
            )
        record = ExecutionRecord(
            execution_id=entry.execution_id,
            status="abandoned",
            steps_completed=entry.index,
            error=f"cut off when the runtime shut down ({entry.status})",
        )
        self.gateway.submit_quietly(
            SaveOp(
                request=record_request(entry.agent_id, record, entry.durable_revision)
            ),
            f"close the record of execution {entry.execution_id!r} as abandoned",
        )
        return " Its durable record is closed as abandoned, so the key can start again."

    def _mark_recovery_required(
        self, agent_id: str, error: BaseException | None
    ) -> None:
        if self.gateway is not None:
            quarantine(
                self.gateway.store.identity,
                agent_key(agent_id),
                f"the outcome of a write is unknown: {error!r}",
            )
            self.gateway.submit_quietly(
                mark_op(
                    agent_key(agent_id),
                    "recovery_required",
                    expected_revision=None,
                    detail=f"the outcome of a write is unknown: {error!r}",
                ),
                f"mark agent {agent_id!r} recovery_required",
            )

    def _run(self, cmd: StartExecution, *, durable_revision: int | None) -> None:
        try:
            self.registry.bind_agent_execution_admission(
                cmd.agent_id, cmd.owner, cmd.execution_id
            )
            timer = None
            if cmd.deadline is not None:
                error = _deadline_error(cmd.execution_id)
                timer = self.engine.timers.schedule(
                    cmd.deadline - trio.current_time(),
                    lambda: self._cancel(cmd.execution_id, error),
                )
            entry = ExecutionEntry(
                execution_id=cmd.execution_id,
                agent_id=cmd.agent_id,
                owner=cmd.owner,
                steps=tuple(cmd.steps),
                arities=cmd.arities,
                index=0,
                value=cmd.input,
                status="executing",
                caller=cmd.caller,
                durable_revision=durable_revision,
                deadline_timer=timer,
            )
            self.registry.install(entry)
        except Exception as exc:  # noqa: BLE001 - the caller's error
            self.registry.release_agent_execution_admission(
                cmd.agent_id, owner=cmd.owner
            )
            cmd.caller.fail(exc)
            return
        self._next_step(entry)

    # --- steps -------------------------------------------------------------------------

    def _next_step(self, entry: ExecutionEntry) -> None:
        if entry.index >= len(entry.steps):
            self._terminate(
                entry,
                ExecutionResult(
                    execution_id=entry.execution_id,
                    agent_id=entry.agent_id,
                    status="completed",
                    value=entry.value,
                ),
            )
            return
        fn = entry.steps[entry.index]
        step_id = f"{entry.execution_id}:{entry.index}:{random_hex()[:12]}"
        ctx = StepContext(
            execution_id=entry.execution_id,
            agent_id=entry.agent_id,
            step_index=entry.index,
            step_id=step_id,
            pool=self.pool,
        )
        args = (entry.value,) if entry.arities[entry.index] == 1 else (entry.value, ctx)
        try:
            if _is_async(fn):
                handle: ResultHandle[Any] = ctx.track(
                    self.engine.start_task(fn, *args, name=f"step:{step_id}")
                )
            else:
                handle = self.pool.submit_nowait(_call_sync_step, fn, args)
        except Exception as exc:  # noqa: BLE001 - e.g. the pool's queue is full
            self._terminate(entry, exc)
            return
        self.registry.supervise(entry.execution_id, handle)
        self.registry.replace(
            msgspec.structs.replace(
                entry, active=ActiveStep(step_id=step_id, handle=handle)
            )
        )
        message = StepResult(
            execution_id=entry.execution_id, step_id=step_id, done=handle
        )

        def finished(_: ResultHandle[Any]) -> None:
            if not self.registry.post_message(message):
                logger.debug(
                    "step %s finished after shutdown; its result is dropped", step_id
                )

        handle.on_complete(finished)

    def _step_done(self, message: StepResult) -> None:
        entry = self.registry.entry(message.execution_id)
        if (
            entry is None
            or entry.status != "executing"
            or entry.active is None
            or entry.active.step_id != message.step_id
        ):
            logger.debug("dropping a stale step result %s", message.step_id)
            return
        done = message.done
        entry = msgspec.structs.replace(entry, active=None)
        if done.status != "completed":
            self._terminate(entry, done.error or PhronomyError("step failed"))
            return
        value = done.result_nowait()
        if isinstance(value, ApprovalRequest):
            self.registry.mark_agent_execution_admission(
                entry.agent_id, entry.execution_id, "suspended"
            )
            self.registry.replace(
                msgspec.structs.replace(
                    entry, status="suspended", pending_approval=value
                )
            )
            return
        entry = msgspec.structs.replace(entry, index=entry.index + 1, value=value)
        self.registry.replace(entry)
        self._next_step(entry)

    def _decide(self, decision: ApprovalDecision) -> None:
        entry = self.registry.entry(decision.execution_id)
        if (
            entry is None
            or entry.status != "suspended"
            or entry.pending_approval is None
        ):
            logger.debug(
                "dropping an approval decision for %s (not suspended)",
                decision.execution_id,
            )
            return
        if not decision.approved:
            self._terminate(
                entry,
                ExecutionResult(
                    execution_id=entry.execution_id,
                    agent_id=entry.agent_id,
                    status="rejected",
                    rejection=decision.response,
                ),
            )
            return
        self.registry.mark_agent_execution_admission(
            entry.agent_id, entry.execution_id, "resuming"
        )
        approval = Approval(request=entry.pending_approval, response=decision.response)
        entry = msgspec.structs.replace(
            entry,
            status="executing",
            pending_approval=None,
            index=entry.index + 1,
            value=approval,
        )
        self.registry.replace(entry)
        self.registry.mark_agent_execution_admission(
            entry.agent_id, entry.execution_id, "executing"
        )
        self._next_step(entry)

    # --- cancellation and terminals ----------------------------------------------------------

    def _cancel(self, execution_id: str, error: BaseException) -> None:
        entry = self.registry.entry(execution_id)
        if entry is None or entry.status not in ("executing", "suspended"):
            return
        # Result authority is revoked now: the active step's result will be stale.
        if entry.active is not None:
            entry.active.handle.cancel(
                error
            )  # cancels a trio step; a thread keeps running
        entry = msgspec.structs.replace(
            entry, status="cancelling", active=None, pending_approval=None
        )
        self.registry.mark_agent_execution_admission(
            entry.agent_id, execution_id, "cancelling"
        )
        self.registry.replace(entry)
        self._terminate(entry, error)

    def _terminate(
        self, entry: ExecutionEntry, outcome: ExecutionResult | BaseException
    ) -> None:
        if entry.deadline_timer is not None:
            entry.deadline_timer.cancel()
        entry = msgspec.structs.replace(
            entry, status="terminalizing", terminal=outcome, deadline_timer=None
        )
        self.registry.mark_agent_execution_admission(
            entry.agent_id, entry.execution_id, "terminalizing"
        )
        self.registry.replace(entry)
        # Nothing is reported before everything the execution started has finished.
        terminal = entry
        self.registry.defer_terminal_until_quiescent(
            entry.execution_id, lambda: self._record_terminal(terminal)
        )

    def _record_terminal(self, entry: ExecutionEntry) -> None:
        terminal = entry.terminal
        if self.gateway is None or entry.durable_revision is None:
            self._finish(entry)
            return
        record = ExecutionRecord(
            execution_id=entry.execution_id,
            status=_terminal_status(terminal),
            steps_completed=entry.index,
            error=None
            if isinstance(terminal, ExecutionResult)
            else f"{type(terminal).__name__}: {terminal}",
        )
        try:
            request = record_request(entry.agent_id, record, entry.durable_revision)
        except Exception as exc:  # noqa: BLE001 - nothing was written
            self._finish(entry, save_error=exc)
            return
        execution_id = entry.execution_id

        def back(saved: outcome.Outcome[Any]) -> None:
            message = TerminalSaved(
                execution_id=execution_id, saved=save_outcome(saved)
            )
            if not self.registry.post_message(message):
                logger.warning(
                    "the terminal record of execution %r came back after shutdown",
                    execution_id,
                )

        self.gateway.submit(SaveOp(request=request), back)

    def _terminal_saved(self, message: TerminalSaved) -> None:
        entry = self.registry.entry(message.execution_id)
        if entry is None:
            return
        result = message.saved
        if result.outcome == "success":
            self._finish(entry)
        elif result.outcome == "known_failure":
            self._finish(entry, save_error=result.error)
        else:
            # Uncertain terminal durability: stay nonterminal, keep the caller pending.
            self.registry.mark_agent_execution_admission(
                entry.agent_id, entry.execution_id, "recovery_required"
            )
            self.registry.replace(
                msgspec.structs.replace(entry, status="recovery_required")
            )
            self._mark_recovery_required(entry.agent_id, result.error)
            logger.warning(
                "the terminal record of execution %r (agent %r) has an unknown outcome (%r); "
                "the execution requires recovery and its caller stays pending until it "
                "is resolved with %s",
                entry.execution_id,
                entry.agent_id,
                result.error,
                _RESOLVE_HINT.format(agent=entry.agent_id),
            )

    def _finish(
        self, entry: ExecutionEntry, *, save_error: BaseException | None = None
    ) -> None:
        self.registry.release_agent_execution_admission(
            entry.agent_id, execution_id=entry.execution_id
        )
        self.registry.remove(entry.execution_id)
        outcome = entry.terminal
        if save_error is not None:
            entry.caller.fail(save_error)
        elif isinstance(outcome, ExecutionResult):
            entry.caller.complete(outcome)
        elif isinstance(outcome, CancellationError):
            entry.caller.cancel(outcome)
        else:
            entry.caller.fail(outcome)


def _startable(
    agent_id: str, row: StoredRecord | None, current: ExecutionRecord | None
) -> int | None:
    """The revision a new ``active`` record replaces, or raise if the key is taken.

    Raises:
        RecoveryRequiredError: the stored record requires recovery.
        BusyError: the stored record says an execution is active.
    """
    if row is not None and row.status == "recovery_required":
        raise RecoveryRequiredError(
            f"the durable record of agent {agent_id!r} requires recovery "
            f"({row.detail or 'the outcome of a write is unknown'}); resolve it with "
            + _RESOLVE_HINT.format(agent=agent_id),
            instance_id=agent_key(agent_id),
        )
    if current is not None and current.status == "active":
        raise BusyError(
            f"Agent {agent_id!r} already has a nonterminal top-level execution "
            f"({current.execution_id!r} is active in the store: it runs in another "
            "process, or its runtime stopped before it ended). If it is stale, list it "
            "with runtime.executions.stale() and release it with "
            + _RESOLVE_HINT.format(agent=agent_id)
        )
    return row.revision if row is not None and row.revision > 0 else None


def _is_async(fn: Any) -> bool:
    """``async def`` functions, partials of them, and objects with an ``async __call__``."""
    call = type(fn).__dict__.get("__call__")
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


def _deadline_error(execution_id: str) -> BaseException:
    return DeadlineExceededError(f"execution {execution_id!r} passed its deadline")


def _terminal_status(outcome: ExecutionResult | BaseException) -> Any:
    if isinstance(outcome, ExecutionResult):
        return outcome.status
    return "cancelled" if isinstance(outcome, CancellationError) else "failed"


def _call_sync_step(fn: Any, args: tuple[Any, ...]) -> Any:
    result = fn(*args)
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()
        raise TypeError(f"step {fn!r} returned an awaitable; declare it with async def")
    return result
