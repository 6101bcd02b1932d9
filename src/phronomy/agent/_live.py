"""Live supervised executions of one runtime: entries, in-flight work, deferred ends.

Mutated only on the dispatcher (by the execution coordinator); read from any trio task
of the runtime's thread.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, final

import trio

from phronomy.errors import PhronomyError

from ._messages import ExecutionEntry, ExecutionOwner, PhysicalCompletion

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from phronomy.engine import ResultHandle

__all__ = ["LiveExecutions"]

logger = logging.getLogger(__name__)


@final
class LiveExecutions:
    """Live executions by id, the supervised work each still runs, and the terminals
    deferred until that work has physically finished."""

    def __init__(self, post: Callable[[Any], bool]) -> None:
        """Create an empty table; *post* queues messages for the coordinator."""
        self._post = post
        self._entries: dict[str, ExecutionEntry] = {}
        self._inflight: dict[str, set[object]] = {}
        self._deferred: dict[str, Callable[[], None]] = {}
        self._changed: dict[str, trio.Event] = {}

    def __iter__(self) -> Iterator[ExecutionEntry]:
        """Every live entry (a snapshot)."""
        return iter(list(self._entries.values()))

    @property
    def busy(self) -> bool:
        """Supervised work is running or a terminal is deferred."""
        return any(self._inflight.values()) or bool(self._deferred)

    def clear(self) -> list[ExecutionEntry]:
        """Forget everything (at shutdown); wake every waiter; return the entries."""
        entries = list(self._entries.values())
        self._entries.clear()
        self._inflight.clear()
        self._deferred.clear()
        for event in self._changed.values():
            event.set()
        self._changed.clear()
        return entries

    def install(self, entry: ExecutionEntry) -> None:
        """Install a new live execution.

        Raises:
            PhronomyError: the execution id is already live.
        """
        if entry.execution_id in self._entries:
            raise PhronomyError(f"execution {entry.execution_id!r} is already live")
        self._entries[entry.execution_id] = entry
        self.notify(entry.execution_id)

    def replace(self, entry: ExecutionEntry) -> None:
        """Replace a live execution's record.

        Raises:
            PhronomyError: the execution is not live.
        """
        if entry.execution_id not in self._entries:
            raise PhronomyError(f"execution {entry.execution_id!r} is not live")
        self._entries[entry.execution_id] = entry
        self.notify(entry.execution_id)

    def remove(self, execution_id: str) -> None:
        """Forget a terminal execution.

        Raises:
            PhronomyError: supervised work is still running, or a terminal is deferred.
        """
        if self._inflight.get(execution_id):
            raise PhronomyError(
                f"cannot release non-quiescent execution {execution_id!r}"
            )
        if execution_id in self._deferred:
            raise PhronomyError(
                f"cannot release execution {execution_id!r} with deferred terminal work"
            )
        self._entries.pop(execution_id, None)
        self._inflight.pop(execution_id, None)
        self.notify(execution_id)

    def forget(self, execution_id: str) -> None:
        """Drop an execution whatever it still runs (an operator resolved it)."""
        self._entries.pop(execution_id, None)
        self._inflight.pop(execution_id, None)
        self._deferred.pop(execution_id, None)
        self.notify(execution_id)

    def supervise(self, execution_id: str, handle: ResultHandle[Any]) -> None:
        """Track *handle* until it has physically finished (threads and tasks included)."""
        if handle.physically_complete:
            return
        token = object()
        self._inflight.setdefault(execution_id, set()).add(token)
        message = PhysicalCompletion(execution_id=execution_id, token=token)

        def finished(_: ResultHandle[Any]) -> None:
            if not self._post(message):
                logger.debug(
                    "physical completion of %r arrived after shutdown", execution_id
                )

        handle.on_physical_complete(finished)

    def physically_complete(self, execution_id: str, token: object) -> None:
        """Record a physical completion; run the deferred terminal once quiescent."""
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
        if execution_id in self._deferred:
            raise PhronomyError(
                f"execution {execution_id!r} already has a deferred terminal"
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

    # --- reads (any trio task) -------------------------------------------------------

    def entry(self, execution_id: str) -> ExecutionEntry | None:
        """The live execution, or ``None``."""
        return self._entries.get(execution_id)

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
