"""The context a step receives as its optional second argument."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar, final

import outcome
import trio

from phronomy.errors import InstanceStateError

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["StepContext"]

T = TypeVar("T")


@final
class StepContext:
    """Who is running, and a supervised way to call blocking tools from async steps.

    Attributes:
        execution_id: the execution.
        agent_id: its key.
        step_index: the step's position.
        step_id: the id of this step run; its result is applied only while it is still
            the execution's current step.
    """

    def __init__(
        self,
        *,
        execution_id: str,
        agent_id: str,
        step_index: int,
        step_id: str,
        nursery: trio.Nursery | None = None,
    ) -> None:
        """Internal: created for each step run."""
        self.execution_id = execution_id
        self.agent_id = agent_id
        self.step_index = step_index
        self.step_id = step_id
        self._nursery = nursery

    async def offload(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking ``fn(*args)`` in a worker thread and return its result.

        The thread is supervised: if the execution is cancelled while it runs, the
        step's task (and so the execution's caller) ends only after the thread has
        returned. Threads are never abandoned.

        Raises:
            InstanceStateError: called from a ``def`` step (it runs in a worker thread
                already: call the tool directly).

        Cancellation:
            The step stops waiting at once; the thread keeps running and is waited for
            before the execution reports itself cancelled.
        """
        nursery = self._nursery
        if nursery is None:
            raise InstanceStateError(
                "ctx.offload() is for async steps; a def step runs in a worker thread "
                "already: call the tool directly"
            )
        done = trio.Event()
        box: list[outcome.Outcome[T]] = []

        async def run() -> None:
            # not abandoned on cancel: the nursery (the step) waits for the thread
            try:
                box.append(outcome.Value(await trio.to_thread.run_sync(fn, *args)))
            except Exception as exc:  # noqa: BLE001 - the step's caller raises it
                box.append(outcome.Error(exc))
            finally:
                done.set()

        nursery.start_soon(run)
        await done.wait()
        if not box:  # the thread returned into a cancelled step
            await trio.lowlevel.checkpoint()
            raise InstanceStateError("the step was cancelled while its tool ran")
        return box[0].unwrap()

    def __repr__(self) -> str:
        return f"<StepContext execution={self.execution_id!r} step={self.step_index}>"
