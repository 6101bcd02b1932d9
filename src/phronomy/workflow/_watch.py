"""Watching instances: every stable state, in order, for any number of trio tasks."""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar, final

import msgspec
import trio_util

from ._state import State

if TYPE_CHECKING:
    from collections.abc import Iterator

    from ._messages import InstanceUpdate

__all__ = ["InstanceWatch", "Watchers"]

S = TypeVar("S", bound=State)


@final
class InstanceWatch(Generic[S]):
    """The updates of one instance for one watcher (an async iterator).

    Updates are buffered per watcher, so a slow consumer still sees every stable
    state in order; one that falls more than *buffer* updates behind loses the oldest,
    and the next update it gets says how many it missed (:attr:`InstanceUpdate.skipped`).
    The iteration does not end by itself (an instance can be restarted): leave it when
    you have seen what you wait for.
    """

    def __init__(self, workflow_instance_id: str, buffer: int) -> None:
        """Internal: use ``runtime.workflows.watch``."""
        self.workflow_instance_id = workflow_instance_id
        self._updates: collections.deque[tuple[int, InstanceUpdate[Any]]] = (
            collections.deque(maxlen=buffer)
        )
        # (updates published so far, closed): what a waiting consumer watches
        self._progress = trio_util.AsyncValue((0, False))
        self._next = 0  # the sequence number this consumer expects next

    def publish(self, update: InstanceUpdate[Any]) -> None:
        """Queue *update* (on the runtime's thread)."""
        published, closed = self._progress.value
        if not closed:
            self._updates.append((published, update))
            self._progress.value = (published + 1, False)

    @property
    def published(self) -> int:
        """Updates published to this watcher so far."""
        return self._progress.value[0]

    def close(self) -> None:
        """No more updates: the watch ends once the buffered ones are taken."""
        published, _ = self._progress.value
        self._progress.value = (published, True)

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> InstanceUpdate[S]:
        """The next update.

        Raises:
            StopAsyncIteration: the runtime closed (after the buffered updates).

        Cancellation:
            Safe: an update is never lost by cancelling the wait.
        """
        await self._progress.wait_value(lambda p: p[0] > self._next or p[1])
        if not self._updates:
            raise StopAsyncIteration
        sequence, update = self._updates.popleft()
        missed, self._next = sequence - self._next, sequence + 1
        if missed:
            return msgspec.structs.replace(update, skipped=missed)
        return update


@final
class Watchers:
    """Who watches which instance (owned by the workflow coordinator)."""

    def __init__(self) -> None:
        """No watchers yet."""
        self._by_instance: dict[str, set[InstanceWatch[Any]]] = {}

    def add(self, watch: InstanceWatch[Any]) -> None:
        """Start sending updates of its instance to *watch*."""
        self._by_instance.setdefault(watch.workflow_instance_id, set()).add(watch)

    def remove(self, watch: InstanceWatch[Any]) -> None:
        """Stop sending updates to *watch*."""
        watches = self._by_instance.get(watch.workflow_instance_id)
        if watches is not None:
            watches.discard(watch)
            if not watches:
                del self._by_instance[watch.workflow_instance_id]

    def watched(self, workflow_instance_id: str) -> bool:
        """Whether anyone watches the instance (updates cost nothing otherwise)."""
        return workflow_instance_id in self._by_instance

    def publish(self, update: InstanceUpdate[Any]) -> None:
        """Send *update* to every watcher of its instance."""
        for watch in tuple(self._by_instance.get(update.workflow_instance_id, ())):
            watch.publish(update)  # a watcher may stop watching when it hears it

    def close(self) -> None:
        """The runtime is closing: every watch ends."""
        for watch in self._all():
            watch.close()
        self._by_instance.clear()

    def _all(self) -> Iterator[InstanceWatch[Any]]:
        for watches in list(self._by_instance.values()):
            yield from list(watches)
