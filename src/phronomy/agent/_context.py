"""The context a step receives as its optional second argument."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar, final

from phronomy.engine import ResultHandle

if TYPE_CHECKING:
    from collections.abc import Callable

    from phronomy.engine import OffloadPool

__all__ = ["StepContext"]

T = TypeVar("T")


@final
class StepContext:
    """Who is running, and a supervised way to call blocking tools from async steps.

    Attributes:
        execution_id: the execution.
        agent_id: its key.
        step_index: the step's position.
        step_id: the semantic id of this step run; a result is applied only while it is
            still the execution's current step.
    """

    def __init__(
        self,
        *,
        execution_id: str,
        agent_id: str,
        step_index: int,
        step_id: str,
        pool: OffloadPool,
    ) -> None:
        """Internal: created by the coordinator for each step."""
        self.execution_id = execution_id
        self.agent_id = agent_id
        self.step_index = step_index
        self.step_id = step_id
        self._pool = pool
        self._running = 0
        self._task_done = False
        self._physical: ResultHandle[Any] | None = None

    async def offload(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking ``fn(*args)`` in a worker thread and return its result.

        The thread is supervised: if the execution is cancelled while it runs, the
        execution's caller settles only after the thread has returned.

        Raises:
            BackpressureError: the execution pool is full.

        Cancellation:
            The step stops waiting at once; the thread keeps running and is waited for
            before the execution reports itself cancelled.
        """
        handle = self._pool.submit_nowait(fn, *args)
        self._running += 1
        handle.on_physical_complete(self._operation_done)
        return await handle.result()

    def track(self, task: ResultHandle[T]) -> ResultHandle[T]:
        """A handle that settles like *task* and is physically complete only when *task*
        and every thread it offloaded have finished (coordinator use)."""
        tracked: ResultHandle[T] = ResultHandle(task.name, tracks_physical=True)
        self._physical = tracked
        task.on_complete(tracked.settle_like)

        def propagate_cancel(h: ResultHandle[T]) -> None:
            if h.status == "cancelled":
                task.cancel(h.error)  # cancels the step's trio task

        tracked.on_complete(propagate_cancel)

        def task_exited(_: ResultHandle[T]) -> None:
            self._task_done = True
            self._maybe_quiescent()

        task.on_physical_complete(task_exited)
        return tracked

    def _operation_done(self, _: ResultHandle[Any]) -> None:
        self._running -= 1
        self._maybe_quiescent()

    def _maybe_quiescent(self) -> None:
        if self._task_done and self._running == 0 and self._physical is not None:
            self._physical.mark_physically_complete()

    def __repr__(self) -> str:
        return f"<StepContext execution={self.execution_id!r} step={self.step_index}>"
