"""Test helpers: a store wrapper that injects faults at named points, and a test clock
that skips time.

Example::

    store = FaultyStore(SQLiteStore(path))
    store.fail("save.after", OSError("connection lost"))   # commits, then raises
    gate = store.block("load.before")                       # holds loads until gate.set()

The faults fire inside the wrapped store's own batches (group commit included), at the
points :class:`~phronomy.storage.BaseStore` defines: ``<op>.before`` (nothing of the
operation ran; a failing write abandons its whole transaction), ``<op>.applied`` (it
ran, not committed), ``commit.before``, ``commit.after`` and ``<op>.after`` (committed,
then the caller sees an error), ``readback.before`` (the read of a reconciliation) and
``open.before``. ``<op>`` is ``load``, ``list``, ``find_write``, ``begin``, ``save``,
``mark`` or ``delete``.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Self, final

from phronomy.storage import BaseStore

if TYPE_CHECKING:
    from collections.abc import Sequence

    import outcome
    import trio.testing

    from phronomy.storage import StoreOp

__all__ = ["FaultyStore", "TestClock"]


class _Fault:
    __slots__ = ("error", "gate", "remaining", "seconds")

    def __init__(
        self,
        *,
        error: BaseException | None = None,
        seconds: float = 0.0,
        gate: threading.Event | None = None,
        times: int | None = 1,
    ) -> None:
        self.error = error
        self.seconds = seconds
        self.gate = gate
        self.remaining = times


@final
class FaultyStore(BaseStore[Any]):
    """Wrap a :class:`~phronomy.storage.BaseStore` and fire faults at named points.

    The wrapped store keeps running every operation itself; this object only installs
    its hook there (thread-safe) and counts the operations.

    Attributes:
        calls: every operation started, in order (for example ``"save"``).
    """

    def __init__(self, inner: BaseStore[Any]) -> None:
        """Wrap *inner* (its ``fault_hook`` is taken over); no faults are armed yet."""
        super().__init__(clock=inner.wall_now_ms)
        self.inner = inner
        self.max_concurrency = inner.max_concurrency
        self.calls: list[str] = []
        self._faults: dict[str, list[_Fault]] = {}
        self._lock = threading.Lock()
        inner.fault_hook = self._fire

    # --- arming -----------------------------------------------------------------------

    def fail(
        self, point: str, error: BaseException | None = None, *, times: int | None = 1
    ) -> Self:
        """Raise *error* (default ``OSError("injected fault at <point>")``) at *point*.

        Args:
            point: for example ``"save.before"`` or ``"save.after"``.
            error: the exception to raise.
            times: how many times (``None``: every time).
        """
        fault = _Fault(
            error=error or OSError(f"injected fault at {point}"), times=times
        )
        return self._arm(point, fault)

    def delay(self, point: str, seconds: float, *, times: int | None = 1) -> Self:
        """Sleep *seconds* at *point*."""
        return self._arm(point, _Fault(seconds=seconds, times=times))

    def block(
        self,
        point: str,
        *,
        times: int | None = 1,
        then: BaseException | None = None,
    ) -> threading.Event:
        """Block at *point* until the returned event is set (at most 30 s), then raise
        *then* if given (a slow operation that fails)."""
        gate = threading.Event()
        self._arm(point, _Fault(gate=gate, times=times, error=then))
        return gate

    def clear(self) -> None:
        """Disarm every fault."""
        with self._lock:
            self._faults.clear()

    def count(self, operation: str) -> int:
        """How many times *operation* started (``"load"``, ``"save"``, ...)."""
        with self._lock:
            return self.calls.count(operation)

    def _arm(self, point: str, fault: _Fault) -> Self:
        with self._lock:
            self._faults.setdefault(point, []).append(fault)
        return self

    def _fire(self, point: str) -> None:
        with self._lock:
            if point.endswith(".before"):
                self.calls.append(point.removesuffix(".before"))
            queue = self._faults.get(point)
            if not queue:
                return
            fault = queue[0]
            if fault.remaining is not None:
                fault.remaining -= 1
                if fault.remaining <= 0:
                    queue.pop(0)
        if fault.gate is not None:
            fault.gate.wait(30)
        if fault.seconds:
            time.sleep(fault.seconds)
        if fault.error is not None:
            raise fault.error

    # --- the store contract: the wrapped store's -----------------------------------------

    @property
    def identity(self) -> str:
        """The wrapped store's identity (the same database)."""
        return self.inner.identity

    def open(self) -> None:
        """Open the wrapped store (``open.before`` fires there)."""
        self.inner.open()

    def execute(self, ops: Sequence[StoreOp]) -> list[outcome.Outcome[Any]]:
        """Run the batch in the wrapped store, where the faults fire."""
        return self.inner.execute(ops)

    def fence(self) -> None:
        """Fence the wrapped store."""
        self.inner.fence()

    def close(self) -> None:
        """Close the wrapped store."""
        self.inner.close()


@final
class TestClock:
    """One clock for trio and the store, which a test moves forward: a timeout of two
    days fires in no wall time.

    It reads a :class:`trio.testing.MockClock` (run the test with it: pytest-trio's
    ``autojump_clock`` fixture, or ``trio.run(..., clock=...)``) as the store's wall
    clock, counted from *start*. :meth:`skip` jumps both at once: the runtime's next
    poll finds every timer that fell due and fires it. Pass the clock to the store::

        clock = TestClock(autojump_clock)
        store = SQLiteStore(path, clock=clock)

    Skip time while instances wait (halted, or in trio sleeps the mock clock runs):
    a runtime holding a lease sees a skip longer than the lease's margin as a renewal
    that came too late, and gives the lease up.
    """

    __test__ = False  # not a test class (pytest collects ``Test*``)

    def __init__(
        self, clock: trio.testing.MockClock, *, start_ms: int | None = None
    ) -> None:
        """Read *clock*, starting at *start_ms* wall-clock milliseconds (default:
        now)."""
        self.mock = clock
        base = time.time_ns() // 1_000_000 if start_ms is None else start_ms
        self._offset_ms = base - int(clock.current_time() * 1000)

    def __call__(self) -> int:
        """The store's wall clock in milliseconds (safe from any thread)."""
        return self._offset_ms + int(self.mock.current_time() * 1000)

    def skip(self, delay: timedelta | float) -> None:
        """Move trio's clock and the store's forward by *delay* (seconds, or a
        timedelta).

        Raises:
            ValueError: a negative delay.
        """
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
        self.mock.jump(float(seconds))
