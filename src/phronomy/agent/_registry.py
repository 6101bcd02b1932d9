"""Agent admissions and live executions, mutated only on the dispatcher (spec §6.2-6.4)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from phronomy.engine import ExecutionReceiver
from phronomy.errors import (
    BackpressureError,
    BusyError,
    InvalidInputError,
    PhronomyError,
    PhronomyInternalError,
    RecoveryRequiredError,
    RuntimeShutdownError,
)

from ._messages import (
    AgentAdmission,
    AgentAdmissionState,
    ExecutionEntry,
    ExecutionOwner,
    PhysicalCompletion,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from phronomy.engine import Engine, ResultHandle

__all__ = ["AgentRegistry"]

logger = logging.getLogger(__name__)

_MARKABLE: frozenset[AgentAdmissionState] = frozenset(
    {
        "executing",
        "suspended",
        "resuming",
        "cancelling",
        "terminalizing",
        "recovery_required",
    }
)
_BUSY: frozenset[AgentAdmissionState] = frozenset(
    {"admitting", "executing", "resuming", "cancelling", "terminalizing"}
)


class AgentRegistry(ExecutionReceiver):
    """At most one nonterminal top-level execution per agent key, and its live state.

    Admission per key::

        (absent) --admit(token)--> admitting --bind(token, execution_id)--> executing
        executing <-> suspended -> resuming -> executing; -> cancelling -> terminalizing
        any --recovery--> recovery_required
        release(token: pre-durable failure | execution_id: known terminal) --> (absent)

    Suspended and recovery-required admissions do not keep the runtime busy; in-flight
    supervised work and deferred terminals do. At most *capacity* admissions are busy
    at once: a start beyond that is refused before it touches anything.
    """

    def __init__(
        self,
        engine: Engine,
        deliver: Callable[[Any], None],
        *,
        capacity: int,
        cut_off: Callable[[ExecutionEntry, bool], str] | None = None,
        flush: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """Create the registry.

        Args:
            engine: the engine it is registered on.
            deliver: handles execution commands on the dispatcher.
            capacity: executions that may be busy at once.
            cut_off: called at a clean shutdown for each live execution with whether it
                is quiescent; returns what happened to its durable record (a sentence
                for its caller's error).
            flush: waits for the executions' store writes (at shutdown).
        """
        super().__init__(engine)
        self._deliver = deliver
        self._capacity = capacity
        self._cut_off = cut_off
        self._flush = flush
        self._busy = 0
        self._admissions: dict[str, AgentAdmission] = {}
        self._entries: dict[str, ExecutionEntry] = {}
        self._inflight: dict[str, set[object]] = {}
        self._deferred: dict[str, Callable[[], None]] = {}
        self._changed: dict[str, trio.Event] = {}

    # --- the receiver contract ----------------------------------------------------

    def idle(self) -> bool:
        """No supervised work, no deferred terminal, no busy admission."""
        return (
            not any(self._inflight.values()) and not self._deferred and not self._busy
        )

    def deliver(self, message: Any) -> None:
        """Hand an execution command to the coordinator (dispatcher only)."""
        self._deliver(message)

    def shutdown(self, error: BaseException | None) -> None:
        """Fail every remaining caller (``RuntimeShutdownError`` on a clean stop)."""
        for entry in self._entries.values():
            if entry.deadline_timer is not None:
                entry.deadline_timer.cancel()
            if entry.caller.done:
                continue
            if error is not None:
                entry.caller.fail(error)
                continue
            record = (
                self._cut_off(entry, self.quiescent(entry.execution_id))
                if self._cut_off is not None
                else ""
            )
            entry.caller.fail(
                RuntimeShutdownError(
                    f"execution {entry.execution_id!r} of agent {entry.agent_id!r} was "
                    f"cut off when the runtime shut down ({entry.status}); it cannot "
                    f"continue.{record} Start the agent again to run it anew."
                )
            )
        self._admissions.clear()
        self._busy = 0
        self._entries.clear()
        self._inflight.clear()
        self._deferred.clear()
        for event in self._changed.values():
            event.set()
        self._changed.clear()

    async def flush(self) -> None:
        """Wait for the store writes the executions owe (abandoned records)."""
        if self._flush is not None:
            await self._flush()
        else:
            await super().flush()

    def describe_live(self) -> list[str]:
        """Describe busy executions (for the shutdown report)."""
        return [
            f"execution {e.execution_id} of agent {e.agent_id} ({e.status})"
            for e in self._entries.values()
            if self._admissions.get(e.agent_id) is not None
            and self._admissions[e.agent_id].state in _BUSY
        ]

    # --- admission (dispatcher only) ---------------------------------------------------

    def admit_agent_execution(self, agent_id: str, owner: object) -> None:
        """Reserve the key's one top-level execution slot, before any storage.

        Raises:
            InvalidInputError: empty id or no token.
            RuntimeShutdownError: new admissions are closed.
            BusyError: the key has an admission in any state.
            BackpressureError: *capacity* executions are already busy.
        """
        self.assert_dispatcher()
        if not agent_id:
            raise InvalidInputError("agent_id must not be empty")
        if owner is None:
            raise InvalidInputError("owner_token is required")
        self.admit()
        current = self._admissions.get(agent_id)
        if current is not None:
            raise BusyError(
                f"Agent {agent_id!r} already has a nonterminal top-level execution ({current.state})"
                + (
                    "; resolve it with runtime.executions.resolve("
                    f"{agent_id!r}, action='release')"
                    if current.state == "recovery_required"
                    else ""
                )
            )
        if self._busy >= self._capacity:
            raise BackpressureError(
                f"runtime.executions has {self._busy} executions starting or running, "
                f"its capacity (pool_size + queue_size); agent {agent_id!r} was not "
                "started, start it again later"
            )
        self._set(
            AgentAdmission(
                agent_id=agent_id, owner=owner, execution_id=None, state="admitting"
            )
        )

    def bind_agent_execution_admission(
        self, agent_id: str, owner: object, execution_id: str
    ) -> None:
        """Bind the admission to its execution id (state ``executing``).

        Raises:
            PhronomyInternalError: no admission, another owner, or already bound.
        """
        self.assert_dispatcher()
        current = self._admissions.get(agent_id)
        if current is None:
            raise PhronomyInternalError(f"Agent {agent_id!r} has no Runtime admission")
        if current.owner is not owner or current.execution_id is not None:
            raise PhronomyInternalError(f"stale Agent admission bind for {agent_id!r}")
        self._set(
            msgspec.structs.replace(
                current, execution_id=execution_id, state="executing"
            )
        )

    def mark_agent_execution_admission(
        self, agent_id: str, execution_id: str, state: AgentAdmissionState
    ) -> None:
        """Move the bound admission to *state*.

        Raises:
            ValueError: an unsupported state.
            PhronomyInternalError: no admission, or bound to another execution.
        """
        self.assert_dispatcher()
        if state not in _MARKABLE:
            raise ValueError(f"unsupported Agent admission state: {state!r}")
        current = self._admissions.get(agent_id)
        if current is None:
            raise PhronomyInternalError(f"Agent {agent_id!r} has no Runtime admission")
        if current.execution_id != execution_id:
            raise PhronomyInternalError(
                f"stale Agent admission state update for {agent_id!r}"
            )
        self._set(msgspec.structs.replace(current, state=state))

    def mark_agent_admission_recovery_required(
        self, agent_id: str, owner: object
    ) -> None:
        """Fail-closed by token (for example: storage reported an unknown nonterminal execution).

        Raises:
            PhronomyInternalError: no admission, or another owner.
        """
        self.assert_dispatcher()
        current = self._admissions.get(agent_id)
        if current is None:
            raise PhronomyInternalError(f"Agent {agent_id!r} has no Runtime admission")
        if current.owner is not owner:
            raise PhronomyInternalError(
                f"stale Agent admission recovery update for {agent_id!r}"
            )
        self._set(msgspec.structs.replace(current, state="recovery_required"))

    def release_agent_execution_admission(
        self,
        agent_id: str,
        *,
        owner: object | None = None,
        execution_id: str | None = None,
    ) -> bool:
        """Release when authoritative: the bound execution id matches, or (without one) the
        token is identical. Otherwise ``False``."""
        self.assert_dispatcher()
        current = self._admissions.get(agent_id)
        if current is None:
            return False
        if execution_id is not None:
            authoritative = current.execution_id == execution_id
        elif owner is not None:
            authoritative = current.owner is owner
        else:
            authoritative = False
        if authoritative:
            self._delete(agent_id)
        return authoritative

    def resolve(self, agent_id: str) -> bool:
        """Clear a recovery-required admission (operator resolution).

        Its execution (if any) is removed and its pending caller fails with a
        :class:`~phronomy.RecoveryRequiredError` that says it was resolved.

        Returns:
            Whether the key had a recovery-required admission here.
        """
        self.assert_dispatcher()
        current = self._admissions.get(agent_id)
        if current is None or current.state != "recovery_required":
            return False
        self._delete(agent_id)
        entry = self._entries.pop(current.execution_id or "", None)
        if entry is not None:
            self.notify(entry.execution_id)
        if entry is not None and not entry.caller.done:
            entry.caller.fail(
                RecoveryRequiredError(
                    f"execution {entry.execution_id!r} of agent {agent_id!r} was resolved "
                    "by an operator; its result is unavailable",
                    instance_id=agent_id,
                )
            )
        return True

    def recovery_keys(self) -> list[str]:
        """Keys whose admission requires recovery in this runtime."""
        return sorted(
            a.agent_id
            for a in self._admissions.values()
            if a.state == "recovery_required"
        )

    def _set(self, admission: AgentAdmission) -> None:
        previous = self._admissions.get(admission.agent_id)
        self._busy += (admission.state in _BUSY) - (
            previous is not None and previous.state in _BUSY
        )
        self._admissions[admission.agent_id] = admission

    def _delete(self, agent_id: str) -> None:
        self._busy -= self._admissions.pop(agent_id).state in _BUSY

    # --- live entries (dispatcher only) ----------------------------------------------------

    def install(self, entry: ExecutionEntry) -> None:
        """Install a new live execution.

        Raises:
            PhronomyError: the execution id is already live.
        """
        self.assert_dispatcher()
        if entry.execution_id in self._entries:
            raise PhronomyError(
                f"Agent execution {entry.execution_id!r} is already live"
            )
        self._entries[entry.execution_id] = entry
        self.notify(entry.execution_id)

    def replace(self, entry: ExecutionEntry) -> None:
        """Replace a live execution's record.

        Raises:
            PhronomyError: the execution is not live.
        """
        self.assert_dispatcher()
        if entry.execution_id not in self._entries:
            raise PhronomyError(f"Agent execution {entry.execution_id!r} is not live")
        self._entries[entry.execution_id] = entry
        self.notify(entry.execution_id)

    def remove(self, execution_id: str) -> None:
        """Forget a terminal execution.

        Raises:
            PhronomyError: supervised work is still running, or a terminal is deferred.
        """
        self.assert_dispatcher()
        if self._inflight.get(execution_id):
            raise PhronomyError(
                f"cannot release non-quiescent Agent execution {execution_id!r}"
            )
        if execution_id in self._deferred:
            raise PhronomyError(
                f"cannot release Agent execution {execution_id!r} with deferred terminal work"
            )
        self._entries.pop(execution_id, None)
        self._inflight.pop(execution_id, None)
        self.notify(execution_id)

    def supervise(self, execution_id: str, handle: ResultHandle[Any]) -> None:
        """Track *handle* until it has physically finished (threads and tasks included)."""
        self.assert_dispatcher()
        if handle.physically_complete:
            return
        token = object()
        self._inflight.setdefault(execution_id, set()).add(token)
        message = PhysicalCompletion(execution_id=execution_id, token=token)

        def finished(_: ResultHandle[Any]) -> None:
            if not self.post_message(message):
                logger.debug(
                    "physical completion of %r arrived after shutdown", execution_id
                )

        handle.on_physical_complete(finished)

    def physically_complete(self, execution_id: str, token: object) -> None:
        """Record a physical completion; run the deferred terminal once quiescent."""
        self.assert_dispatcher()
        pending = self._inflight.get(execution_id)
        if pending is None:
            return
        pending.discard(token)
        if not pending and execution_id in self._deferred:
            self._deferred.pop(execution_id)()

    def quiescent(self, execution_id: str) -> bool:
        """Whether no supervised work of the execution is still running."""
        return not self._inflight.get(execution_id)

    def inflight(self, execution_id: str) -> int:
        """How many supervised operations of the execution are still running."""
        return len(self._inflight.get(execution_id, ()))

    def defer_terminal_until_quiescent(
        self, execution_id: str, terminal: Callable[[], None]
    ) -> None:
        """Run *terminal* once the execution's supervised work has physically finished.

        Raises:
            PhronomyError: a terminal is already deferred for this execution.
        """
        self.assert_dispatcher()
        if execution_id in self._deferred:
            raise PhronomyError(
                f"Agent execution {execution_id!r} already has a deferred terminal"
            )
        if self.quiescent(execution_id):
            terminal()
        else:
            self._deferred[execution_id] = terminal

    # --- change notification -------------------------------------------------------------

    def notify(self, execution_id: str) -> None:
        """Wake the tasks waiting for a change of *execution_id*."""
        event = self._changed.pop(execution_id, None)
        if event is not None:
            event.set()

    async def wait_changed(self, execution_id: str) -> None:
        """Wait until *execution_id* changes (installed, replaced, removed, or settled).

        Cancellation:
            Safe: nothing is changed.
        """
        event = self._changed.get(execution_id)
        if event is None:
            event = self._changed[execution_id] = trio.Event()
        await event.wait()

    # --- reads (any trio task) ------------------------------------------------------------

    def entry(self, execution_id: str) -> ExecutionEntry | None:
        """The live execution, or ``None``."""
        return self._entries.get(execution_id)

    def admission(self, agent_id: str) -> AgentAdmission | None:
        """The key's admission, or ``None``."""
        return self._admissions.get(agent_id)

    def agent_execution_admitted(self, agent_id: str | None) -> bool:
        """Whether the key has an admission (``False`` for unknown or empty ids)."""
        return bool(agent_id) and agent_id in self._admissions

    def owner(self, execution_id: str) -> ExecutionOwner | None:
        """A read-only view of a live execution, or ``None``."""
        entry = self._entries.get(execution_id)
        if entry is None:
            return None
        return ExecutionOwner(
            execution_id=entry.execution_id,
            agent_id=entry.agent_id,
            status=entry.status,
            step_index=entry.index,
            pending_approval=entry.pending_approval,
        )
