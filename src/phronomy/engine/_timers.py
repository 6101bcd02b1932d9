"""A threadless timer heap driven by the dispatcher task."""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
from typing import TYPE_CHECKING, final

import trio

from phronomy.errors import RuntimeShutdownError

from ._thread_guard import check_thread

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["Timer", "TimerQueue"]

logger = logging.getLogger(__name__)


@final
class Timer:
    """A scheduled callback; :meth:`cancel` it to drop it."""

    __slots__ = ("_queue", "callback", "cancelled", "when")

    def __init__(
        self, queue: TimerQueue, when: float, callback: Callable[[], object]
    ) -> None:
        self._queue = queue
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        """Drop the timer (a timer already taken by the dispatcher may still run)."""
        self._queue.cancel(self)


@final
class TimerQueue:
    """Monotonic min-heap of callbacks fired by the dispatcher, in deadline order.

    Callbacks run on the dispatcher task, must be short and synchronous, and are
    isolated: a raising callback is logged and the others still run. Scheduling after
    :meth:`shutdown` raises :class:`~phronomy.RuntimeShutdownError`.
    """

    def __init__(self, *, wake: Callable[[], object] | None = None) -> None:
        """Create an empty queue; *wake* is called when a new timer becomes the earliest."""
        self._heap: list[tuple[float, int, Timer]] = []
        self._seq = itertools.count()
        self._wake = wake
        self._pending = 0
        self._stopped = False
        self._thread = threading.get_ident()

    def schedule(self, seconds: float, callback: Callable[[], object]) -> Timer:
        """Run *callback* on the dispatcher after *seconds* (trio clock).

        Raises:
            RuntimeShutdownError: the queue was shut down.
            TypeError: *callback* is not callable.
            ReentrancyError: called from a thread other than the runtime's.
        """
        check_thread(self._thread, "TimerQueue.schedule()")
        if not callable(callback):
            raise TypeError("schedule requires a callable")
        if self._stopped:
            raise RuntimeShutdownError("TimerQueue has been shut down")
        when = trio.current_time() + max(seconds, 0.0)
        timer = Timer(self, when, callback)
        earliest = not self._heap or when < self._heap[0][0]
        heapq.heappush(self._heap, (when, next(self._seq), timer))
        self._pending += 1
        if earliest and self._wake is not None:
            self._wake()
        return timer

    def cancel(self, timer: Timer) -> None:
        """Drop *timer* if it has not fired yet."""
        if not timer.cancelled:
            timer.cancelled = True
            self._pending -= 1

    @property
    def pending_count(self) -> int:
        """Timers scheduled and neither fired nor cancelled."""
        return self._pending

    def next_deadline(self) -> float | None:
        """Absolute trio time of the earliest live timer, or ``None``."""
        heap = self._heap
        while heap and heap[0][2].cancelled:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def seconds_until_next(self) -> float | None:
        """Seconds until the earliest timer (floor 0), or ``None`` when empty or stopped."""
        if self._stopped:
            return None
        deadline = self.next_deadline()
        return None if deadline is None else max(deadline - trio.current_time(), 0.0)

    def fire_due(self) -> int:
        """Run every timer that is due, in deadline order; returns how many ran."""
        if self._stopped or not self._heap:
            return 0
        now = trio.current_time()
        fired = 0
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, _, timer = heapq.heappop(heap)
            if timer.cancelled:
                continue
            timer.cancelled = True
            self._pending -= 1
            fired += 1
            try:
                timer.callback()
            except Exception:
                logger.exception("timer callback failed")
        return fired

    def shutdown(self) -> None:
        """Clear the heap and refuse later schedules."""
        self._stopped = True
        self._heap.clear()
        self._pending = 0
