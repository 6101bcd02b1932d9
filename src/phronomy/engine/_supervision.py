"""Supervision: offload pools, supervised trio tasks and timers, and stopping them."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, TypeVar, final

import trio

from phronomy.errors import InvalidInputError, RuntimeShutdownError

from ._handle import ResultHandle
from ._pool import OffloadPool
from ._timers import TimerQueue

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from ._lifecycle import Lifecycle
    from ._messages import PoolStatistics

__all__ = ["Supervisor"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


@final
class Supervisor:
    """Owns the work that runs beside the dispatcher: pools, tasks, timers.

    Nothing it runs is abandoned: at shutdown queued operations are cancelled, tasks
    are cancelled and waited for, and worker threads are waited for until the grace
    deadline; whatever still runs then makes cleanup incomplete.
    """

    def __init__(
        self, lifecycle: Lifecycle, nursery: trio.Nursery, *, wake: Callable[[], None]
    ) -> None:
        """Create the supervisor; *wake* tells the dispatcher about earlier timers."""
        self._lifecycle = lifecycle
        self._nursery = nursery
        self.timers = TimerQueue(wake=wake)
        self._pools: dict[str, OffloadPool] = {}
        self._pools_closed = False
        self._tasks: set[ResultHandle[Any]] = set()
        self._tasks_idle = trio.lowlevel.ParkingLot()

    # --- pools ---------------------------------------------------------------------

    def pool(self, name: str, *, size: int, queue_size: int) -> OffloadPool:
        """The named pool, created on first use.

        Raises:
            RuntimeShutdownError: the engine is stopping or closed.
            RuntimeShutdownError: pools were already shut down.
        """
        existing = self._pools.get(name)
        if existing is not None:
            return existing
        if not self._lifecycle.accepting:
            raise RuntimeShutdownError(
                f"the runtime is {self._lifecycle.state}; new work is not accepted"
            )
        if self._pools_closed:
            raise RuntimeShutdownError("offload pools have been shut down")
        created = OffloadPool(
            name, pool_size=size, queue_size=queue_size, timers=self.timers
        )
        self._pools[name] = created
        return created

    @property
    def pools_idle(self) -> bool:
        """No pool has a queued or running operation."""
        return all(pool.idle for pool in self._pools.values())

    async def wait_pools_idle(self) -> None:
        """Wait until every operation of every pool has physically finished.

        Cancellation:
            Safe: nothing is changed (the caller's scope bounds the wait).
        """
        for pool in list(self._pools.values()):
            await pool.wait_idle()

    async def after_threads(self, fn: Callable[[], object]) -> None:
        """Run the blocking *fn* in a worker thread once no pool runs an operation
        (see ``Engine.after_threads``)."""
        if not self._pools_closed:
            raise InvalidInputError(
                "Engine.after_threads() is for after the engine stopped; its offload "
                "pools still take new operations"
            )
        if self.pools_idle:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(fn)
            return
        trio.lowlevel.spawn_system_task(
            self._run_after_threads, fn, name="phronomy.after-threads"
        )

    async def _run_after_threads(self, fn: Callable[[], object]) -> None:
        # A system task (it outlives the engine): shielded, it raises nothing.
        with trio.CancelScope(shield=True):
            await self.wait_pools_idle()
            try:
                await trio.to_thread.run_sync(fn)
            except Exception:
                logger.exception("the cleanup after the last worker thread failed")

    def pool_statistics(self) -> tuple[PoolStatistics, ...]:
        """One snapshot per pool."""
        return tuple(p.statistics() for p in self._pools.values())

    # --- tasks -----------------------------------------------------------------------

    @property
    def task_count(self) -> int:
        """Supervised tasks still running."""
        return len(self._tasks)

    def start_task(
        self, fn: Callable[..., Awaitable[T]], args: tuple[Any, ...], name: str | None
    ) -> ResultHandle[T]:
        """Run ``await fn(*args)`` as a supervised task (see ``Engine.start_task``).

        Raises:
            RuntimeShutdownError: the engine is stopping or closed.
        """
        if not self._lifecycle.accepting:
            raise RuntimeShutdownError(
                f"the runtime is {self._lifecycle.state}; new work is not accepted"
            )
        label = name or getattr(fn, "__name__", "task")
        handle: ResultHandle[T] = ResultHandle(f"task:{label}", tracks_physical=True)
        scope = trio.CancelScope()

        def cancel_scope_on_cancel(h: ResultHandle[T]) -> None:
            if h.status == "cancelled":
                scope.cancel(reason=f"{label} cancelled")

        handle.on_complete(cancel_scope_on_cancel)
        self._tasks.add(handle)
        self._nursery.start_soon(
            self._supervise, handle, scope, fn, args, name=f"phronomy.task.{label}"
        )
        return handle

    async def _supervise(
        self,
        handle: ResultHandle[T],
        scope: trio.CancelScope,
        fn: Callable[..., Awaitable[T]],
        args: tuple[Any, ...],
    ) -> None:
        try:
            with scope:
                try:
                    value = await fn(*args)
                except Exception as exc:  # noqa: BLE001 - the task's own failure
                    handle.fail(exc)
                else:
                    handle.complete(value)
        finally:
            if not handle.done:
                handle.cancel(
                    RuntimeShutdownError(
                        "the runtime shut down before the task finished"
                    )
                )
            handle.mark_physically_complete()
            self._tasks.discard(handle)
            if not self._tasks:
                self._tasks_idle.unpark_all()

    # --- stopping --------------------------------------------------------------------

    async def stop(self, deadline: float, *, wait: bool) -> tuple[int, int]:
        """Close pools, cancel queued operations, tasks and timers; wait until *deadline*.

        Returns:
            Worker threads and supervised tasks still running.

        Cancellation:
            Callers shield it; the waits are bounded by *deadline*.
        """
        self._pools_closed = True
        cancelled = RuntimeShutdownError(
            "offloaded operation cancelled: the runtime shut down"
        )
        attempt = self._lifecycle.attempt
        for pool in self._pools.values():
            attempt(f"closing offload pool {pool.name!r}", pool.close)
        for pool in self._pools.values():
            attempt(
                f"cancelling the queue of offload pool {pool.name!r}",
                pool.cancel_queued,
                cancelled,
            )
        for handle in list(self._tasks):
            attempt(
                f"cancelling supervised task {handle.name!r}",
                handle.cancel,
                RuntimeShutdownError("the runtime shut down before the task finished"),
            )
        attempt("shutting the timer queue down", self.timers.shutdown)
        if wait:
            with trio.move_on_at(deadline):
                await self.wait_pools_idle()
                while self._tasks:
                    await self._tasks_idle.park()
        threads = sum(pool.active_count for pool in self._pools.values())
        return threads, len(self._tasks)
