"""The coordinator of supervised executions: the engine's receiver for them.

It owns the admission table (one nonterminal top-level execution per agent key) and
the live executions, asks the :class:`ExecutionMachine` what each event means, and
carries that out: running steps, writing durable records, settling callers.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, final

import msgspec
import trio

from phronomy.durability import save_outcome
from phronomy.engine import AdmissionTable, ExecutionReceiver, random_hex
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

from ._context import StepContext
from ._durable import ExecutionRecords
from ._live import LiveExecutions
from ._machine import ExecutionMachine, RunStep, Terminate
from ._messages import (
    ActiveStep,
    ApprovalDecision,
    CancelExecution,
    DurableStarted,
    ExecutionEntry,
    ExecutionResult,
    PhysicalCompletion,
    RecordLoaded,
    ResolveExecution,
    StartExecution,
    StepResult,
    TerminalSaved,
)
from ._records import (
    RESOLVE_HINT,
    agent_key,
)
from ._steps import call_sync_step, is_async

if TYPE_CHECKING:
    import outcome

    from phronomy.durability import DurabilityService
    from phronomy.engine import Admission, Host, OffloadPool, ResultHandle

    from ._machine import Action

__all__ = ["ExecutionCoordinator"]

logger = logging.getLogger(__name__)

_BUSY = frozenset({"admitting", "executing", "cancelling", "terminalizing"})
_MARKABLE = frozenset(
    {"executing", "suspended", "cancelling", "terminalizing", "recovery_required"}
)


def _busy(current: Admission) -> BusyError:
    hint = (
        "; resolve it with " + RESOLVE_HINT.format(agent=current.key)
        if current.state == "recovery_required"
        else ""
    )
    return BusyError(
        f"Agent {current.key!r} already has a nonterminal top-level execution "
        f"({current.state}){hint}"
    )


@final
class ExecutionCoordinator(ExecutionReceiver):
    """Runs supervised executions; one per runtime, registered as a receiver.

    A sync step runs in a worker thread of the ``phronomy.executions`` pool; an
    ``async def`` step runs as a supervised trio task. Suspended and recovery-required
    executions do not keep the runtime busy; in-flight work and deferred terminals do.
    At most ``pool_size + queue_size`` of the pool's executions are busy at once (their
    steps then never meet a full pool); a start beyond that is refused with
    :class:`~phronomy.BackpressureError` before it touches anything.
    """

    def __init__(
        self, engine: Host, *, pool: OffloadPool, gateway: DurabilityService | None
    ) -> None:
        """Create the coordinator (register it with ``engine.receiver``)."""
        super().__init__(engine)
        self.pool = pool
        self.gateway = gateway
        self.records = ExecutionRecords(gateway) if gateway is not None else None
        self.machine = ExecutionMachine()
        self.admissions = AdmissionTable(
            noun="agent",
            busy_states=_BUSY,
            markable=_MARKABLE,
            busy_error=_busy,
            capacity=pool.capacity,
        )
        self.live = LiveExecutions(self.post_message)

    # --- the receiver contract ---------------------------------------------------------

    def idle(self) -> bool:
        """No supervised work, no deferred terminal, no busy admission."""
        return not self.live.busy and not self.admissions.busy

    def deliver(self, message: Any) -> None:
        """Handle one execution command (dispatcher only); never fails the dispatcher."""
        self.assert_dispatcher()
        try:
            self._handle(message)
        except Exception as exc:  # a coordinator bug must not take the runtime down
            logger.exception("execution command %s failed", type(message).__name__)
            execution_id = getattr(message, "execution_id", None)
            entry = self.live.entry(execution_id) if execution_id else None
            if entry is not None and not entry.caller.done:
                entry.caller.fail(
                    PhronomyInternalError(
                        f"execution {execution_id!r} failed internally: {exc!r}"
                    )
                )

    def shutdown(self, error: BaseException | None) -> None:
        """Fail every remaining caller (``RuntimeShutdownError`` on a clean stop)."""
        for entry in self.live:
            if entry.deadline_timer is not None:
                entry.deadline_timer.cancel()
            if entry.caller.done:
                continue
            if error is not None:
                entry.caller.fail(error)
                continue
            record = (
                ""
                if self.records is None
                else self.records.close_cut_off(
                    entry, self.live.quiescent(entry.execution_id)
                )
            )
            entry.caller.fail(
                RuntimeShutdownError(
                    f"execution {entry.execution_id!r} of agent {entry.agent_id!r} was "
                    f"cut off when the runtime shut down ({entry.status}); it cannot "
                    f"continue.{record} Start the agent again to run it anew."
                )
            )
        self.admissions.clear()
        self.live.clear()

    async def flush(self) -> None:
        """Wait for the store writes the executions owe (abandoned records).

        Cancellation:
            Bounded by the shutdown's grace deadline (writes already submitted still run).
        """
        if self.gateway is not None:
            await self.gateway.wait_idle()
        else:
            await super().flush()

    def describe_live(self) -> list[str]:
        """Describe busy executions (for the shutdown report)."""
        return [
            f"execution {e.execution_id} of agent {e.agent_id} ({e.status})"
            for e in self.live
            if self.admissions.state(e.agent_id) in _BUSY
        ]

    def _handle(self, message: object) -> None:
        match message:
            case StartExecution():
                self._start(message)
            case RecordLoaded():
                self._record_loaded(message)
            case DurableStarted():
                self._durable_started(message)
            case ResolveExecution():
                message.done.complete(self._resolve(message.agent_id))
            case StepResult():
                self._step_done(message)
            case ApprovalDecision():
                self._apply(
                    message.execution_id,
                    lambda e: self.machine.decided(
                        e, approved=message.approved, response=message.response
                    ),
                )
            case CancelExecution():
                self._cancel(message.execution_id, message.error)
            case PhysicalCompletion():
                self.live.physically_complete(message.execution_id, message.token)
            case TerminalSaved():
                self._terminal_saved(message)
            case _:
                raise PhronomyInternalError(f"unknown execution command {message!r}")

    # --- admission and durable creation ----------------------------------------------

    def _start(self, cmd: StartExecution) -> None:
        try:
            self.admit()
            self.admissions.admit(cmd.agent_id, cmd.owner)
        except Exception as exc:  # noqa: BLE001 - the caller's error (busy, full, closing)
            cmd.caller.fail(exc)
            return
        if self.records is None:
            self._run(cmd, durable_revision=None)
            return
        self.records.load(
            cmd.agent_id,
            lambda loaded: self._post(RecordLoaded(command=cmd, loaded=loaded), cmd),
        )

    def _post(self, message: object, cmd: StartExecution) -> None:
        if not self.post_message(message, completion=cmd.caller):
            cmd.caller.fail(
                RuntimeShutdownError(
                    f"the runtime shut down while agent {cmd.agent_id!r} was starting"
                )
            )

    def _refuse(self, cmd: StartExecution, error: BaseException) -> None:
        """A start refused before it wrote anything: the key is free again."""
        self.admissions.release(cmd.agent_id, owner=cmd.owner)
        cmd.caller.fail(error)

    def _record_loaded(self, message: RecordLoaded) -> None:
        cmd = message.command
        assert self.records is not None
        try:
            row, current = message.loaded.unwrap()
            self.records.write_active(
                cmd.agent_id,
                cmd.execution_id,
                row,
                current,
                lambda saved: self._post(
                    DurableStarted(command=cmd, saved=save_outcome(saved)), cmd
                ),
            )
        except Exception as exc:  # noqa: BLE001 - refused before anything was written
            self._refuse(cmd, exc)

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
            self.admissions.mark(cmd.agent_id, "recovery_required", owner=cmd.owner)
            self._mark_recovery_required(cmd.agent_id, result.error)
            cmd.caller.fail(
                RecoveryRequiredError(
                    f"the durable start of agent {cmd.agent_id!r} has an unknown outcome "
                    f"({result.error!r}); the key is refused until it is resolved with "
                    + RESOLVE_HINT.format(agent=cmd.agent_id),
                    instance_id=agent_key(cmd.agent_id),
                )
            )

    def _run(self, cmd: StartExecution, *, durable_revision: int | None) -> None:
        try:
            self.admissions.bind(cmd.agent_id, cmd.owner, cmd.execution_id)
            timer = None
            if cmd.deadline is not None:
                error = DeadlineExceededError(
                    f"execution {cmd.execution_id!r} passed its deadline"
                )
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
            self.live.install(entry)
        except Exception as exc:  # noqa: BLE001 - the caller's error
            self.admissions.release(cmd.agent_id, owner=cmd.owner)
            cmd.caller.fail(exc)
            return
        self._carry_out(*self.machine.next_step(entry))

    # --- carrying out the machine's actions ------------------------------------------

    def _apply(self, execution_id: str, decide: Any) -> None:
        entry = self.live.entry(execution_id)
        if entry is not None:
            self._carry_out(*decide(entry))

    def _carry_out(self, entry: ExecutionEntry, action: Action) -> None:
        match action:
            case RunStep():
                self._start_step(entry, action.index)
            case Terminate():
                self._terminate(entry, action.outcome)
            case _:
                if self.live.entry(entry.execution_id) is not entry:
                    self._replace(entry)  # suspended, or unchanged
                logger.debug("execution %s: %s", entry.execution_id, action)

    def _replace(self, entry: ExecutionEntry) -> None:
        if entry.status in _MARKABLE:
            self.admissions.mark(
                entry.agent_id, entry.status, holder=entry.execution_id
            )
        self.live.replace(entry)

    def _start_step(self, entry: ExecutionEntry, index: int) -> None:
        fn = entry.steps[index]
        step_id = f"{entry.execution_id}:{index}:{random_hex()[:12]}"
        ctx = StepContext(
            execution_id=entry.execution_id,
            agent_id=entry.agent_id,
            step_index=index,
            step_id=step_id,
            pool=self.pool,
        )
        args = (entry.value,) if entry.arities[index] == 1 else (entry.value, ctx)
        try:
            if is_async(fn):
                handle: ResultHandle[Any] = ctx.track(
                    self.engine.start_task(fn, *args, name=f"step:{step_id}")
                )
            else:
                handle = self.pool.submit_nowait(call_sync_step, fn, args)
        except Exception as exc:  # noqa: BLE001 - e.g. the pool's queue is full
            self._terminate(entry, exc)
            return
        self.live.supervise(entry.execution_id, handle)
        active = ActiveStep(step_id=step_id, handle=handle)
        self._replace(msgspec.structs.replace(entry, active=active))
        message = StepResult(
            execution_id=entry.execution_id, step_id=step_id, done=handle
        )

        def finished(_: ResultHandle[Any]) -> None:
            if not self.post_message(message):
                logger.debug(
                    "step %s finished after shutdown; its result is dropped", step_id
                )

        handle.on_complete(finished)

    def _step_done(self, message: StepResult) -> None:
        done = message.done
        if done.status == "completed":
            value, error = done.result_nowait(), None
        else:
            value, error = None, done.error or PhronomyError("step failed")
        self._apply(
            message.execution_id,
            lambda e: self.machine.step_finished(
                e, message.step_id, value=value, error=error
            ),
        )

    def _cancel(self, execution_id: str, error: BaseException) -> None:
        entry = self.live.entry(execution_id)
        if entry is None:
            return
        revoked, action = self.machine.cancelled(entry, error)
        if isinstance(action, Terminate) and entry.active is not None:
            entry.active.handle.cancel(error)  # cancels a trio step; a thread runs on
        self._carry_out(revoked, action)

    def _terminate(self, entry: ExecutionEntry, outcome: Any) -> None:
        if entry.deadline_timer is not None:
            entry.deadline_timer.cancel()
        entry = self.machine.terminalizing(entry, outcome)
        self._replace(entry)
        # Nothing is reported before everything the execution started has finished.
        self.live.defer_terminal_until_quiescent(
            entry.execution_id, lambda: self._record_terminal(entry)
        )

    # --- terminal records -----------------------------------------------------------

    def _record_terminal(self, entry: ExecutionEntry) -> None:
        if self.records is None or entry.durable_revision is None:
            self._finish(entry)
            return
        execution_id = entry.execution_id

        def back(saved: outcome.Outcome[Any]) -> None:
            message = TerminalSaved(
                execution_id=execution_id, saved=save_outcome(saved)
            )
            if not self.post_message(message):
                logger.warning(
                    "the terminal record of execution %r came back after shutdown",
                    execution_id,
                )

        try:
            self.records.write_terminal(entry, back)
        except Exception as exc:  # noqa: BLE001 - nothing was written
            self._finish(entry, save_error=exc)

    def _terminal_saved(self, message: TerminalSaved) -> None:
        entry = self.live.entry(message.execution_id)
        if entry is None:
            return
        result = message.saved
        if result.outcome == "success":
            self._finish(entry)
        elif result.outcome == "known_failure":
            self._finish(entry, save_error=result.error)
        else:
            # Uncertain terminal durability: stay nonterminal, keep the caller pending.
            self._replace(msgspec.structs.replace(entry, status="recovery_required"))
            self._mark_recovery_required(entry.agent_id, result.error)
            logger.warning(
                "the terminal record of execution %r (agent %r) has an unknown outcome "
                "(%r); the execution requires recovery and its caller stays pending "
                "until it is resolved with %s",
                entry.execution_id,
                entry.agent_id,
                result.error,
                RESOLVE_HINT.format(agent=entry.agent_id),
            )

    def _finish(
        self, entry: ExecutionEntry, *, save_error: BaseException | None = None
    ) -> None:
        self.admissions.release(entry.agent_id, holder=entry.execution_id)
        self.live.remove(entry.execution_id)
        outcome = entry.terminal
        if save_error is not None:
            entry.caller.fail(save_error)
        elif isinstance(outcome, ExecutionResult):
            entry.caller.complete(outcome)
        elif isinstance(outcome, CancellationError):
            entry.caller.cancel(outcome)
        else:
            entry.caller.fail(outcome)

    def _mark_recovery_required(
        self, agent_id: str, error: BaseException | None
    ) -> None:
        if self.records is not None:
            self.records.mark_recovery_required(agent_id, error)

    def _resolve(self, agent_id: str) -> bool:
        """Clear a recovery-required admission (operator resolution); its pending
        caller fails with a :class:`~phronomy.RecoveryRequiredError`."""
        admission = self.admissions.resolve(agent_id)
        if admission is None:
            return False
        entry = self.live.entry(admission.holder or "")
        if entry is None:
            return True
        self.live.forget(entry.execution_id)
        if not entry.caller.done:
            entry.caller.fail(
                RecoveryRequiredError(
                    f"execution {entry.execution_id!r} of agent {agent_id!r} was "
                    "resolved by an operator; its result is unavailable",
                    instance_id=agent_id,
                )
            )
        return True
