"""The engine's lifecycle: its state, who may touch live state, and what failed."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, final

import trio

from phronomy.errors import ReentrancyError, RuntimeShutdownError

from ._thread_guard import check_thread

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._messages import LifecycleState

__all__ = ["Lifecycle"]

logger = logging.getLogger(__name__)

_ACCEPTING = frozenset({"running", "draining"})


@final
class Lifecycle:
    """State shared by the engine's parts (each part owns the rest of its own state).

    ``running`` → ``draining`` (no new admissions; queued work and continuations still
    run) → ``stopping`` → ``terminated``; ``failed`` when the dispatcher failed or the
    cleanup was incomplete.

    Attributes:
        state: the current state.
        accepting: whether events and deliveries are accepted (running or draining).
        task: the dispatcher task, once started.
        exclusive: set while the engine mutates live state off the dispatcher (after it
            stopped, or on its failure): receivers may then do so too.
        failure: the error that failed the dispatcher.
        errors: failures recorded during shutdown (they make cleanup incomplete).
    """

    __slots__ = (
        "accepting",
        "errors",
        "exclusive",
        "failure",
        "state",
        "task",
        "thread_id",
    )

    def __init__(self) -> None:
        """Start ``running`` on the calling (trio) thread."""
        self.state: LifecycleState = "running"
        self.accepting = True
        self.thread_id = threading.get_ident()
        self.task: trio.lowlevel.Task | None = None
        self.exclusive = False
        self.failure: BaseException | None = None
        self.errors: list[BaseException] = []

    def set(self, state: LifecycleState) -> None:
        """Move to *state*."""
        self.state = state
        self.accepting = state in _ACCEPTING

    def is_dispatcher(self) -> bool:
        """Whether the calling code runs on the dispatcher task."""
        return trio.lowlevel.current_task() is self.task

    def assert_dispatcher(self) -> None:
        """Raise unless on the dispatcher (or in the engine's exclusive teardown).

        Raises:
            ReentrancyError: called from another task.
        """
        if not self.exclusive and trio.lowlevel.current_task() is not self.task:
            raise ReentrancyError(
                "phronomy-managed live execution state may only be mutated on the "
                "runtime's dispatcher task"
            )

    def refusal(self, what: str) -> RuntimeShutdownError:
        """The error of a request the runtime no longer takes (*what*: the request,
        e.g. ``"the workflow start"``), saying whether it is closing or closed."""
        if self.state in ("running", "draining", "stopping"):
            return RuntimeShutdownError(
                f"the runtime is shutting down ({self.state}); it refused {what}"
            )
        return RuntimeShutdownError(
            f"the runtime has shut down (its `async with open_runtime(...)` block has "
            f"ended, {self.state}); it refused {what}. Use the runtime only inside "
            "its block, or open a new one"
        )

    def check_thread(self, what: str) -> None:
        """Raise unless on the runtime's trio thread (see :func:`check_thread`)."""
        check_thread(self.thread_id, what)

    def attempt(self, what: str, fn: Callable[..., object], *args: Any) -> None:
        """Run one shutdown step; a failure is recorded (cleanup incomplete), not raised."""
        try:
            fn(*args)
        except Exception as exc:
            logger.exception("%s failed during shutdown", what)
            exc.add_note(f"phronomy: raised while {what} during runtime shutdown")
            self.errors.append(exc)
