"""The coordinator of supervised executions: every decision is made on the dispatcher."""

from __future__ import annotations

import inspect
import logging
from typing import TYPE_CHECKING, Any, final

import msgspec
import trio

from phronomy.engine import random_hex
from phronomy.errors import (
    AgentBusyError,
    CancellationError,
    ConflictError,
    DeadlineExceededError,
    PhronomyError,
    PhronomyInternalError,
    RecoveryRequiredError,
    RuntimeShutdownError,
)
from phronomy.storage import (
    SaveOp,
    SaveOutcome,
    SaveRequest,
    decode_snapshot,
    encode_snapshot,
)

from .context import StepContext
from .messages import (
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
    StartExecution,
    StepResult,
    TerminalSaved,
)
from .registry import AgentRegistry

if TYPE_CHECKING:
    from phronomy.engine import Engine, OffloadPool, ResultHandle
    from phronomy.storage import WorkflowStore

__all__ = ["EXECUTION_WORKFLOW", "ExecutionCoordinator", "agent_key"]

logger = logging.getLogger(__name__)

EXECUTION_WORKFLOW = "phronomy.execution"
"""The workflow name under which agents' execution records are stored."""


def agent_key(agent_id: str) -> str:
    """The store key of an agent's execution record."""
    return f"agent:{agent_id}"


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
        store: WorkflowStore | None,
        store_pool: OffloadPool | None,
    ) -> None:
        """Create the coordinator and register its registry on *engine*."""
        self.engine = engine
        self.pool = pool
        self.store = store
        self.store_pool = store_pool
        self.registry: AgentRegistry = engine.receiver(
            AgentRegistry, lambda e: AgentRegistry(e, self.deliver)
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
            case DurableStarted():
                self._durable_started(message)
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
        except Exception as exc:  # noqa: BLE001 - the caller's error (busy, shutting down)
            cmd.caller.fail(exc)
            return
        if self.store is None or self.store_pool is None:
            self._run(cmd, durable_revision=None)
            return
        try:
            saved = self.store_pool.submit_nowait(
                _create_active, self.store, cmd.agent_id, cmd.execution_id
            )
        except Exception as exc:  # noqa: BLE001 - refused before anything was written
            self.registry.release_agent_execution_admission(
                cmd.agent_id, owner=cmd.owner
            )
            cmd.caller.fail(exc)
            return

        def created(done: ResultHandle[Any]) -> None:
            if not self.registry.post_message(
                DurableStarted(command=cmd, saved=done), completion=cmd.caller
            ):
                cmd.caller.fail(
                    RuntimeShutdownError(
                        "Runtime rejected the execution start while shutting down"
                    )
                )

        saved.on_complete(created)

    def _durable_started(self, message: DurableStarted) -> None:
        cmd, done = message.command, message.saved
        if done.status != "completed":
            # A known pre-durable failure (the load failed): nothing was written.
            self.registry.release_agent_execution_admission(
                cmd.agent_id, owner=cmd.owner
            )
            cmd.caller.fail(
                done.error or PhronomyError("durable execution start failed")
            )
            return
        result = done.result_nowait()
        if isinstance(result, str):
            # The store holds another nonterminal execution: fail closed, remember it.
            self.registry.mark_agent_admission_recovery_required(
                cmd.agent_id, cmd.owner
            )
            cmd.caller.fail(
                AgentBusyError(
                    f"Agent {cmd.agent_id!r} already has a nonterminal top-level execution "
                    f"({result!r} in the store)"
                )
            )
            return
        outcome: SaveOutcome = result
        if outcome.outcome == "success":
            self._run(cmd, durable_revision=outcome.revision)
        elif outcome.outcome == "known_failure":
            self.registry.release_agent_execution_admission(
                cmd.agent_id, owner=cmd.owner
            )
            error = outcome.error or PhronomyError("durable execution start failed")
            if isinstance(error, ConflictError):
                busy = AgentBusyError(
                    f"Agent {cmd.agent_id!r} was started by another owner concurrently"
                )
                busy.__cause__ = error
                error = busy
            cmd.caller.fail(error)
        else:  # the active record may exist: fail closed
            self.registry.mark_agent_admission_recovery_required(
                cmd.agent_id, cmd.owner
            )
            cmd.caller.fail(
                RecoveryRequiredError(
                    f"the durable start of agent {cmd.agent_id!r} has an unknown outcome "
                    f"({outcome.error!r}); it requires recovery",
                    instance_id=agent_key(cmd.agent_id),
                )
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
        outcome = entry.terminal
        if (
            self.store is None
            or self.store_pool is None
            or entry.durable_revision is None
        ):
            self._finish(entry)
            return
        record = ExecutionRecord(
            execution_id=entry.execution_id,
            status=_terminal_status(outcome),
            steps_completed=entry.index,
            error=None
            if isinstance(outcome, ExecutionResult)
            else f"{type(outcome).__name__}: {outcome}",
        )
        try:
            saved = self.store_pool.submit_nowait(
                _save_record, self.store, entry.agent_id, record, entry.durable_revision
            )
        except Exception as exc:  # noqa: BLE001 - refused: nothing was written
            self._finish(entry, save_error=exc)
            return
        message = TerminalSaved(execution_id=entry.execution_id, saved=saved)

        def back(_: ResultHandle[Any]) -> None:
            if not self.registry.post_message(message):
                logger.warning(
                    "the terminal record of execution %r came back after shutdown",
                    entry.execution_id,
                )

        saved.on_complete(back)

    def _terminal_saved(self, message: TerminalSaved) -> None:
        entry = self.registry.entry(message.execution_id)
        if entry is None:
            return
        done = message.saved
        result: SaveOutcome = (
            done.result_nowait()
            if done.status == "completed"
            else SaveOutcome(outcome="outcome_unknown", error=done.error)
        )
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
            logger.warning(
                "the terminal record of execution %r (agent %r) has an unknown outcome (%r); "
                "the execution requires recovery and its caller stays pending",
                entry.execution_id,
                entry.agent_id,
                result.error,
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


# --- worker-side durable operations (run in the store's worker thread) ----------------------------


def _create_active(
    store: WorkflowStore, agent_id: str, execution_id: str
) -> str | SaveOutcome:
    """Write the ``active`` record, or return the id of a nonterminal execution found."""
    key = agent_key(agent_id)
    record = store.load(key)
    expected: int | None = None
    if record is not None:
        if record.status == "recovery_required":
            return "recovery_required"
        if record.snapshot is not None:
            current = decode_snapshot(
                record.snapshot,
                workflow_instance_id=key,
                revision=record.revision,
                state_type=ExecutionRecord,
            ).fields
            if current.status == "active":
                return current.execution_id
        expected = record.revision or None
    return _save_record(
        store,
        agent_id,
        ExecutionRecord(execution_id=execution_id, status="active"),
        expected,
    )


def _save_record(
    store: WorkflowStore, agent_id: str, record: ExecutionRecord, expected: int | None
) -> SaveOutcome:
    key = agent_key(agent_id)
    revision = (expected or 0) + 1
    active = record.status == "active"
    phase = "active" if active else "__end__"
    request = SaveRequest(
        workflow_instance_id=key,
        expected_revision=expected,
        snapshot=encode_snapshot(
            record,
            workflow_instance_id=key,
            revision=revision,
            phase=phase,
            workflow=EXECUTION_WORKFLOW,
        ),
        write_id=random_hex(),
        status="running" if active else "finished",
        phase=phase,
        workflow=EXECUTION_WORKFLOW,
    )
    outcome: SaveOutcome = store.execute([SaveOp(request=request)])[0].unwrap()
    return outcome
