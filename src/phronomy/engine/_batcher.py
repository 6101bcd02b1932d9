"""Coalesce concurrent blocking operations into one offloaded call (group commit)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Generic, TypeVar, final

import outcome

from phronomy.errors import PhronomyInternalError

from ._handle import ResultHandle

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._pool import OffloadPool

__all__ = ["Batcher"]

logger = logging.getLogger(__name__)

I = TypeVar("I")  # noqa: E741 - item
O = TypeVar("O")  # noqa: E741 - output


@final
class Batcher(Generic[I, O]):
    """Run items through ``run_batch`` in a pool, one batch in flight at a time.

    Items submitted while a batch runs wait and form the next batch (up to
    ``max_batch``), so N concurrent writers cost one transaction instead of N, and
    order is preserved: an item never runs before an item submitted earlier.

    ``run_batch(items)`` runs in a worker thread and returns one
    :class:`outcome.Outcome` per item, in order. If the offloaded call itself fails,
    every item of the batch fails with that error.

    Use on the runtime's trio thread only.
    """

    def __init__(
        self,
        pool: OffloadPool,
        run_batch: Callable[[list[I]], list[outcome.Outcome[O]]],
        *,
        max_batch: int = 256,
    ) -> None:
        """Create a batcher on *pool* (whose size should be 1 for ordered stores)."""
        self._pool = pool
        self._run_batch = run_batch
        self._max_batch = max_batch
        self._pending: list[tuple[I, ResultHandle[O]]] = []
        self._in_flight = False
        self.batches = 0
        self.items = 0

    @property
    def idle(self) -> bool:
        """No batch is running and nothing is waiting."""
        return not self._in_flight and not self._pending

    def submit(self, item: I) -> ResultHandle[O]:
        """Queue *item*; the handle settles with its outcome once its batch ran.

        Raises (through the handle):
            PoolShutdownError, BackpressureError: the pool refused the batch.
        """
        handle: ResultHandle[O] = ResultHandle("batch-item")
        self._pending.append((item, handle))
        if not self._in_flight:
            self._flush()
        return handle

    def _flush(self) -> None:
        batch = self._pending[: self._max_batch]
        del self._pending[: self._max_batch]
        items = [item for item, _ in batch]
        try:
            op = self._pool.submit_nowait(self._run_batch, items)
        except Exception as exc:  # noqa: BLE001 - every item of the batch fails with it
            for _, handle in batch:
                handle.fail(exc)
            if self._pending:
                self._flush()
            return
        self._in_flight = True
        self.batches += 1
        self.items += len(batch)
        op.on_complete(lambda done: self._distribute(batch, done))

    def _distribute(
        self,
        batch: list[tuple[I, ResultHandle[O]]],
        done: ResultHandle[list[outcome.Outcome[O]]],
    ) -> None:
        self._in_flight = False
        if done.status == "completed":
            results = done.result_nowait()
            if len(results) != len(batch):
                error: BaseException = PhronomyInternalError(
                    f"batch returned {len(results)} results for {len(batch)} items"
                )
                for _, handle in batch:
                    handle.fail(error)
            else:
                for (_, handle), result in zip(batch, results, strict=True):
                    if isinstance(result, outcome.Value):
                        handle.complete(result.value)
                    elif isinstance(result, outcome.Error):
                        handle.fail(result.error)
        else:
            failure = done.error
            assert failure is not None
            for _, handle in batch:
                handle.fail(failure)
        if self._pending:
            self._flush()

    def __repr__(self) -> str:
        return f"<Batcher batches={self.batches} items={self.items} pending={len(self._pending)}>"
