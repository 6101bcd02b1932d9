"""Coalesce concurrent blocking operations into one offloaded call (group commit)."""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Generic, TypeVar, final

import outcome
import trio

from phronomy.errors import PhronomyInternalError

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._handle import ResultHandle
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
    order is preserved: an item never runs before an item submitted earlier. An idle
    batcher starts its next batch through *defer* (the engine's ``at_batch_end``), so
    the items a whole dispatch batch submits share one transaction.

    ``run_batch(items)`` runs in a worker thread and returns one
    :class:`outcome.Outcome` per item, in order. Each item's callback receives its
    outcome on the trio thread; if the offloaded call itself fails (or the pool refuses
    it), every item of the batch receives that error. With *handoff* (the engine's
    ``call_soon``) a batch's callbacks (its errors too) run on the dispatcher, in
    order, at the place in its queue where the batch completed: what a callback would
    post there, it may do at once (see :meth:`Engine.call_soon <phronomy.lowlevel.Engine.call_soon>`);
    one that raises fails the dispatcher. Where the engine no longer accepts them,
    they run at once, wherever the batch completed.

    Use on the runtime's trio thread only.
    """

    def __init__(
        self,
        pool: OffloadPool,
        run_batch: Callable[[list[I]], list[outcome.Outcome[O]]],
        *,
        defer: Callable[[Callable[[], object]], None] | None = None,
        handoff: Callable[[Callable[[], object]], bool] | None = None,
        max_batch: int = 256,
    ) -> None:
        """Create a batcher on *pool* (whose size should be 1 for ordered stores).

        Args:
            pool: where batches run.
            run_batch: runs one batch in a worker thread.
            defer: schedules the start of a batch (default: at once).
            handoff: runs a batch's callbacks elsewhere (``False``: it cannot; they
                run at once).
            max_batch: the largest batch.
        """
        self._pool = pool
        self._defer = defer
        self._handoff = handoff
        self._scheduled = False
        self._run_batch = run_batch
        self._max_batch = max_batch
        self._pending: list[tuple[I, Callable[[outcome.Outcome[O]], object]]] = []
        self._in_flight = False
        self._idle_waiters = trio.lowlevel.ParkingLot()
        self.batches = 0
        self.items = 0

    @property
    def idle(self) -> bool:
        """No batch is running and nothing is waiting."""
        return not self._in_flight and not self._pending

    async def wait_idle(self) -> None:
        """Wait until no batch runs and nothing waits (the caller bounds the wait).

        Cancellation:
            Safe: the batches are not affected.
        """
        while not self.idle:
            await self._idle_waiters.park()
        await trio.lowlevel.checkpoint()

    def submit(self, item: I, callback: Callable[[outcome.Outcome[O]], object]) -> None:
        """Queue *item*; ``callback(outcome)`` runs once its batch ran."""
        self._pending.append((item, callback))
        if self._in_flight or self._scheduled:
            return
        if self._defer is None:
            self._flush()
        else:
            self._scheduled = True
            self._defer(self._deferred_flush)

    def _deferred_flush(self) -> None:
        self._scheduled = False
        if self._pending and not self._in_flight:
            self._flush()

    def _flush(self) -> None:
        batch = self._pending[: self._max_batch]
        del self._pending[: self._max_batch]
        try:
            op = self._pool.submit_nowait(self._run_batch, [item for item, _ in batch])
        except Exception as exc:  # noqa: BLE001 - every item of the batch gets it
            self._fail(batch, exc)
            if self._pending:
                self._flush()
            return
        self._in_flight = True
        self.batches += 1
        self.items += len(batch)
        op.on_complete(functools.partial(self._completed, batch))

    def _completed(
        self,
        batch: list[tuple[I, Callable[[outcome.Outcome[O]], object]]],
        done: ResultHandle[list[outcome.Outcome[O]]],
    ) -> None:
        """A batch ran: its callbacks get their outcomes (handed off, or at once),
        and the next batch starts."""
        self._in_flight = False
        if done.status != "completed":  # every item of the batch gets its error
            assert done.error is not None
            results: list[outcome.Outcome[O]] = [outcome.Error(done.error)] * len(batch)
        else:
            results = done.result_nowait()
            if len(results) != len(batch):
                error = PhronomyInternalError(
                    f"batch returned {len(results)} results for {len(batch)} items"
                )
                results = [outcome.Error(error)] * len(batch)
        if self._handoff is None or not self._handoff(
            functools.partial(_hand_out, batch, results)
        ):
            for (_, callback), result in zip(batch, results, strict=True):
                _call(callback, result)
        if self._pending:
            self._flush()
        elif not self._in_flight:
            self._idle_waiters.unpark_all()

    @staticmethod
    def _fail(
        batch: list[tuple[I, Callable[[outcome.Outcome[O]], object]]],
        error: BaseException,
    ) -> None:
        for _, callback in batch:
            _call(callback, outcome.Error(error))

    def __repr__(self) -> str:
        return f"<Batcher batches={self.batches} items={self.items} pending={len(self._pending)}>"


def _hand_out(
    batch: list[tuple[I, Callable[[outcome.Outcome[O]], object]]],
    results: list[outcome.Outcome[O]],
) -> None:
    """A handed-off batch's callbacks, in order (what one raises fails the
    dispatcher: it may have acted on the dispatcher's state)."""
    for (_, callback), result in zip(batch, results, strict=True):
        callback(result)


def _call(
    callback: Callable[[outcome.Outcome[O]], object], result: outcome.Outcome[O]
) -> None:
    try:
        callback(result)
    except Exception:
        logger.exception("batch item callback failed")
