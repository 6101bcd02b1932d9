"""The dispatcher: one task draining a FIFO memory channel in batches."""

from __future__ import annotations

import contextlib
import logging
import math
import time
from typing import TYPE_CHECKING, Any, final

import trio

from ._messages import Event

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._config import EngineConfig
    from ._contracts import Session
    from ._lifecycle import Lifecycle
    from ._timers import TimerQueue

__all__ = ["Dispatcher"]

logger = logging.getLogger(__name__)

_NO_THRESHOLD = 1 << 62


class _Marker:
    """A dispatcher-internal queue item (stop, wake)."""

    __slots__ = ("name",)
    target_id = ""  # no session has this id

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


_STOP = _Marker("stop")
_WAKE = _Marker("wake")


@final
class Dispatcher:
    """Receives from the channel, then drains whatever else is queued before awaiting.

    An :class:`Event` goes straight to its session (the hot path); every other item
    goes to *route*. After each batch the callbacks deferred to its end run
    (:meth:`at_batch_end`), then the timers that are due fire (and what they deferred
    runs), then *on_batch*.
    It owns its channel and its metrics (queue depth, lag, dispatch counts), and warns
    about backlog, starvation and long dispatches.
    """

    def __init__(
        self,
        config: EngineConfig,
        lifecycle: Lifecycle,
        timers: TimerQueue,
        sessions: dict[str, Session],
        *,
        start_pending: Callable[[str], Session | None],
        route: Callable[[Any], None],
        on_batch: Callable[[], None],
        on_failure: Callable[[Exception], None],
    ) -> None:
        """Create the dispatcher (the engine runs :meth:`run` in its nursery)."""
        self._config = config
        self._lifecycle = lifecycle
        self._timers = timers
        self._sessions = sessions
        self._start_pending = start_pending
        self._route = route
        self._on_batch = on_batch
        self._on_failure = on_failure
        self._send, self._recv = trio.open_memory_channel[Any](math.inf)
        self.send_nowait = self._send.send_nowait
        self._scope = trio.CancelScope()
        self.exited = trio.Event()
        self._batch_end: list[Callable[[], object]] = []
        self._batching = False  # while the loop runs: at_batch_end defers only then
        self.backlog_threshold = config.backlog_threshold
        self.posted = 0
        self.dispatched = 0
        self.dropped = 0
        self.max_depth = 0
        self._oldest_post_ns = 0
        self._last_backlog_warning = -math.inf
        self._batches = 0
        self._lag_last = 0
        self._lag_max = 0
        self._lag_sum = 0
        self._starvation_ns = (
            _NO_THRESHOLD
            if config.starvation_threshold is None
            else int(config.starvation_threshold * 1e9)
        )

    # --- posting ---------------------------------------------------------------------

    def enqueue(self, item: Any) -> None:
        """Queue *item* (the caller checked that the engine accepts it).

        ``Engine.post_nowait`` inlines these lines for events: keep them in step.
        """
        self.send_nowait(item)
        self.posted += 1
        depth = self.posted - self.dispatched
        if depth == 1 or depth >= self.backlog_threshold:
            self.note_depth(depth, item)

    def note_depth(self, depth: int, item: Any) -> None:
        """After a post: stamp the oldest item of the next batch, or warn of backlog."""
        if depth == 1:
            # The queue was empty: this is the oldest item of the next batch. Queue lag
            # is measured per batch, on its oldest item (the batch's largest lag).
            self._oldest_post_ns = time.perf_counter_ns()
        else:
            self._warn_backlog(depth, item)

    def at_batch_end(self, callback: Callable[[], object]) -> None:
        """Run *callback* once the current batch is dispatched (at once off the
        dispatcher task, or once its loop stopped: failed, ended or cancelled)."""
        if self._batching and trio.lowlevel.current_task() is self._lifecycle.task:
            self._batch_end.append(callback)
        else:
            callback()

    def _run_batch_end(self) -> None:
        pending = self._batch_end
        while pending:
            callbacks, self._batch_end = pending, []
            for callback in callbacks:
                callback()
            pending = self._batch_end

    def wake(self) -> None:
        """Make the dispatcher recompute its wait (an earlier timer was scheduled)."""
        if (
            self._lifecycle.task is not None
            and not self._lifecycle.is_dispatcher()
            and not self.exited.is_set()
        ):
            self.enqueue(_WAKE)

    def drain(self) -> list[Any]:
        """Take every item still queued (the dispatcher has stopped)."""
        items: list[Any] = []
        while True:
            try:
                items.append(self._recv.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                return items

    async def stop(self, *, graceful: bool) -> None:
        """Stop after the items already queued (*graceful*), or at once; then wait.

        Cancellation:
            Callers shield it (the shutdown sequence).
        """
        if not self.exited.is_set():
            if graceful:
                self.enqueue(_STOP)
            else:
                self._scope.cancel(reason="phronomy runtime aborted")
            await self.exited.wait()

    # --- statistics ----------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        """Items posted and not dispatched yet."""
        return max(self.posted - self.dispatched, 0)

    @property
    def lag(self) -> tuple[float, float, float]:
        """Queue lag in seconds: the last batch's, the largest, and the mean."""
        mean = self._lag_sum / self._batches / 1e9 if self._batches else 0.0
        return self._lag_last / 1e9, self._lag_max / 1e9, mean

    # --- the loop ----------------------------------------------------------------------

    async def run(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """The dispatcher task: run until stopped (a failure goes to *on_failure*).

        Cancellation:
            The engine's nursery cancels it when the runtime closes.
        """
        self._lifecycle.task = trio.lowlevel.current_task()
        try:
            with self._scope:
                task_status.started()
                self._batching = True
                try:
                    await self._loop()
                except Exception as exc:  # noqa: BLE001 - a dispatcher failure, reported
                    # What the failure's handling defers runs at once, then what the
                    # failed batch had deferred (a write owed, as a group commit's
                    # start, is flushed, not left for a batch end that never comes).
                    self._batching = False
                    self._on_failure(exc)
                    leftovers, self._batch_end = self._batch_end, []
                    for callback in leftovers:
                        self._lifecycle.attempt("ending the failed batch", callback)
        finally:
            self._batching = False
            self.exited.set()

    async def _loop(self) -> None:
        recv = self._recv
        timers = self._timers
        while True:
            deadline = timers.next_deadline()
            if deadline is None:
                item = await recv.receive()
            else:
                item = None
                with trio.move_on_at(deadline):
                    item = await recv.receive()
                if item is None:
                    timers.fire_due()
                    if self._batch_end:
                        self._run_batch_end()
                    self._on_batch()
                    continue
            keep_going = self._batch(item)
            if self._batch_end:
                self._run_batch_end()
            if timers.pending_count:
                timers.fire_due()
                if self._batch_end:
                    self._run_batch_end()
            self._on_batch()
            if not keep_going:
                return

    def _batch(self, item: Any) -> bool:
        """Dispatch *item*, then everything already queued; ``False`` after stop."""
        lag = time.perf_counter_ns() - self._oldest_post_ns
        depth = self.posted - self.dispatched
        if depth > self.max_depth:
            self.max_depth = depth
        self._batches += 1
        self._lag_last = lag
        self._lag_sum += lag
        if lag > self._lag_max:
            self._lag_max = lag
        if lag > self._starvation_ns:
            self._warn_starvation(item, lag)
        if self._config.dispatch_threshold is not None:
            return self._timed_batch(item, self._config.dispatch_threshold)
        recv_nowait = self._recv.receive_nowait
        sessions_get = self._sessions.get
        route = self._route
        while True:
            self.dispatched += 1
            # Every item has a target_id; only events name a session (others say "").
            session = sessions_get(item.target_id)
            if session is not None:
                session.handle(item)
            elif type(item) is Event:
                self._late(item)
            elif item is _STOP:
                return False
            elif item is not _WAKE:
                route(item)
            try:
                item = recv_nowait()
            except trio.WouldBlock:
                return True

    def _timed_batch(self, item: Any, threshold: float) -> bool:
        """The batch loop with long-dispatch warnings (``dispatch_threshold`` set)."""
        while True:
            started = time.perf_counter()
            self.dispatched += 1
            if type(item) is Event:
                session = self._sessions.get(item.target_id)
                if session is not None:
                    session.handle(item)
                else:
                    self._late(item)
            elif item is _STOP:
                return False
            elif item is not _WAKE:
                self._route(item)
            took = time.perf_counter() - started
            if took > threshold:
                logger.warning(
                    "dispatch of %s took %.3fs (threshold %.3fs); move blocking work "
                    "to an offload pool",
                    _describe(item)[0],
                    took,
                    threshold,
                )
            try:
                item = self._recv.receive_nowait()
            except trio.WouldBlock:
                return True

    # --- diagnostics -------------------------------------------------------------------

    def _late(self, event: Event) -> None:
        """An event for no live session: it starts one registered in this batch (the
        event came first), or it is dropped."""
        session = self._start_pending(event.target_id)
        if session is not None:
            session.handle(event)
        else:
            self._drop(event)

    def _drop(self, event: Event) -> None:
        self.dropped += 1
        if event.caller is not None:
            event.caller.complete(None)
        logger.warning(
            "dropping event %r: no session has target_id %r (it ended meanwhile)",
            event.type,
            event.target_id,
        )

    def _warn_backlog(self, depth: int, item: Any) -> None:
        now = time.monotonic()
        if now - self._last_backlog_warning < self._config.backlog_interval:
            return
        self._last_backlog_warning = now
        self.max_depth = max(self.max_depth, depth)
        kind, target = _describe(item)
        with contextlib.suppress(
            Exception
        ):  # a broken log handler must not break posting
            logger.warning(
                "dispatcher backlog: depth=%d max_depth=%d threshold=%d event=%s target=%s",
                depth,
                self.max_depth,
                self._config.backlog_threshold,
                kind,
                target,
            )

    def _warn_starvation(self, item: Any, lag_ns: int) -> None:
        kind, target = _describe(item)
        logger.warning(
            "dispatcher starvation: %s for %s waited %.3fs in the queue",
            kind,
            target,
            lag_ns / 1e9,
        )


def _describe(item: Any) -> tuple[str, str]:
    if isinstance(item, Event):
        return item.type, item.target_id
    return type(item).__name__, "-"
