"""Effects: async or blocking work started by an action, owned by its segment."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, final

from phronomy.errors import InstanceStateError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from phronomy.engine import OffloadPool, ResultHandle, Timer

    from ._session import WorkflowSession

__all__ = ["EFFECT_FAILED", "Effects"]

logger = logging.getLogger(__name__)

EFFECT_FAILED = "__phronomy.effect_failed__"
"""Internal event: an effect without ``on_error`` failed; the segment fails with it."""


@final
class Effects:
    """Start work from an action and get its result back as an event.

    An action that takes a third argument receives the segment's ``Effects``::

        def start_payment(state, event, effects):
            effects.offload(charge_card, state.card, on_done="charged", on_error="declined")

    The work is owned by the segment: when the segment ends (halted, finished, failed
    or cut off at shutdown), trio work is cancelled and pending timers are dropped;
    offloaded threads cannot be interrupted, so their results are discarded (with a
    debug log) and never reach a later segment of the same instance. Shutdown still
    waits for those threads physically.
    """

    def __init__(self, session: WorkflowSession[Any]) -> None:
        """Bind the effects to *session* (runtime internal)."""
        self._session = session
        self._handles: set[ResultHandle[Any]] = set()
        self._timers: set[Timer] = set()
        self._closed = False

    @property
    def pending(self) -> int:
        """Effects started and not delivered yet."""
        return len(self._handles) + len(self._timers)

    def start_soon(
        self,
        fn: Callable[..., Awaitable[Any]],
        *args: Any,
        on_done: str,
        on_error: str | None = None,
    ) -> None:
        """Run ``await fn(*args)`` as a supervised trio task.

        Args:
            fn: an async function (keyword arguments through ``functools.partial``).
            *args: its positional arguments.
            on_done: the event posted with the return value as payload.
            on_error: the event posted with the exception as payload; without it, a
                failure fails the segment.

        Raises:
            RuntimeShutdownError: the runtime is closing.
        """
        self._check_open()
        handle = self._session.host.start_task(fn, *args)
        self._watch(handle, on_done, on_error)

    def offload(
        self,
        fn: Callable[..., Any],
        *args: Any,
        on_done: str,
        on_error: str | None = None,
        pool: OffloadPool | None = None,
    ) -> None:
        """Run blocking ``fn(*args)`` in a worker thread (default pool unless *pool*).

        Raises:
            BackpressureError: the pool's queue is full (the action fails with it).
            RuntimeShutdownError: the pool is closed.
        """
        self._check_open()
        target = pool if pool is not None else self._session.host.default_pool
        self._watch(target.submit_nowait(fn, *args), on_done, on_error)

    def schedule(self, seconds: float, event: str, payload: Any = None) -> None:
        """Post *event* to this segment after *seconds* (dropped if the segment ended)."""
        self._check_open()
        timer: Timer | None = None

        def fire() -> None:
            if timer is not None:
                self._timers.discard(timer)
            self._post(event, payload)

        timer = self._session.host.timers.schedule(seconds, fire)
        self._timers.add(timer)

    def close(self) -> None:
        """The segment ended: cancel trio work and timers; late results are dropped."""
        self._closed = True
        for handle in list(self._handles):
            handle.cancel()
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()

    def _check_open(self) -> None:
        if self._closed:
            raise InstanceStateError("the segment has ended; it cannot start effects")

    def _watch(
        self, handle: ResultHandle[Any], on_done: str, on_error: str | None
    ) -> None:
        self._handles.add(handle)

        def deliver(done: ResultHandle[Any]) -> None:
            self._handles.discard(done)
            if done.status == "cancelled" and self._closed:
                return
            if done.status == "completed":
                self._post(on_done, done.result_nowait())
            elif on_error is not None:
                self._post(on_error, done.error)
            else:
                self._post(EFFECT_FAILED, done.error)

        handle.on_complete(deliver)

    def _post(self, event: str, payload: Any) -> None:
        if self._closed or not self._session.sink.post(event, payload):
            logger.debug(
                "dropping late effect result %r for workflow instance %r: its segment ended",
                event,
                self._session.workflow_instance_id,
            )
