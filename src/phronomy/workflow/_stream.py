"""A running segment's stable states, as an async iterator."""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, Self, TypeVar, final

import trio

from ._state import State

if TYPE_CHECKING:
    from phronomy.engine import ResultHandle

    from ._messages import Step, WorkflowResult

__all__ = ["WorkflowStream"]

S = TypeVar("S", bound=State)


@final
class WorkflowStream(Generic[S]):
    """The steps of one streamed segment, in order (see :meth:`~phronomy.workflow.WorkflowClient.stream`).

    ``async for step in stream`` yields each stable state; when the segment ends the
    iteration stops, or raises the segment's error. Then :meth:`result` returns the
    final (or halted) :class:`~phronomy.WorkflowResult`.
    """

    def __init__(
        self,
        receive: trio.MemoryReceiveChannel[Step[S]],
        handle: ResultHandle[WorkflowResult[S]],
    ) -> None:
        """Internal: created by :meth:`~phronomy.workflow.WorkflowClient.stream`."""
        self._receive = receive
        self._handle = handle

    @property
    def handle(self) -> ResultHandle[WorkflowResult[S]]:
        """The segment's result handle."""
        return self._handle

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Step[S]:
        # A plain async iterator (not an async generator): leaving the loop early
        # leaves nothing to finalize.
        try:
            return await self._receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            pass
        await self._handle.wait()
        if self._handle.status != "completed":
            self._handle.result_nowait()  # raises the segment's error
        raise StopAsyncIteration

    async def result(self) -> WorkflowResult[S]:
        """Wait for the segment and return its result (or raise its error).

        Cancellation:
            Cancelling the waiter leaves the segment running.
        """
        return await self._handle.result()
