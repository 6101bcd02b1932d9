"""Bounded offload pools for blocking work, on ``trio.to_thread.run_sync``."""

from __future__ import annotations

import collections
import contextvars
import logging
import math
import threading
import time
from typing import TYPE_CHECKING, Any, Literal, TypeVar, final

import outcome
import trio
from sniffio import current_async_library_cvar

from phronomy.errors import (
    BackpressureError,
    CancellationError,
    DeadlineExceededError,
    InvalidInputError,
    PhronomyInternalError,
    RuntimeShutdownError,
)

from ._handle import ResultHandle
from ._messages import PoolStatistics
from ._operation import SKIPPED, Operation, thread_body
from ._thread_guard import check_thread

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._cancel import CancellationToken
    from ._timers import TimerQueue

__all__ = ["OffloadPool"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
OnFull = Literal["raise", "wait"]

_UNLIMITED = trio.CapacityLimiter(math.inf)


@final
class OffloadPool:
    """A bounded pool that runs blocking callables in worker threads.

    ``pool_size`` bounds the threads running at once (the pool's own
    :class:`trio.CapacityLimiter`); ``queue_size`` bounds the operations admitted but
    not started. Results are captured inside the worker thread with
    :func:`outcome.capture`.

    Worker threads are never interrupted. A timeout or cancellation settles the
    caller-facing handle only; if the worker had already started, the operation is
    counted as *abandoned* until the thread returns, and its result is discarded. The
    handle's :attr:`~phronomy.ResultHandle.physically_complete` reports when the thread has
    really finished. Waiting for worker threads never abandons them: trio keeps
    waiting for a running write even after the runtime block has exited.

    Pools are created by the engine (:attr:`~phronomy.lowlevel.Engine.default_pool`, :meth:`~phronomy.lowlevel.Engine.pool`).
    """

    def __init__(
        self,
        name: str,
        *,
        pool_size: int,
        queue_size: int,
        timers: TimerQueue | None,
    ) -> None:
        """Create a pool (engine use).

        Raises:
            InvalidInputError: *pool_size* < 1 or *queue_size* < 0.
        """
        if pool_size < 1:
            raise InvalidInputError(
                f"pool {name!r}: pool_size must be >= 1, got {pool_size}"
            )
        if queue_size < 0:
            raise InvalidInputError(
                f"pool {name!r}: queue_size must be >= 0, got {queue_size}"
            )
        self._name = name
        # made once, not per operation
        self._task_name = f"phronomy.pool.{name}"
        self._thread_name = f"phronomy:{name}"
        self._pool_size = pool_size
        self._queue_size = queue_size
        self._timers = timers
        self._limiter = trio.CapacityLimiter(pool_size)
        self._closed = False
        self._ops: set[Operation] = set()
        self._queue: collections.deque[Operation] = collections.deque()
        self._queued = 0
        self._space = trio.lowlevel.ParkingLot()
        self._idle = trio.lowlevel.ParkingLot()
        self._submitted = 0
        self._completed = 0
        self._started = 0
        self._wait_total = 0.0
        self._abandoned_total = 0
        self._abandoned_active = 0
        self._thread = threading.get_ident()
        # worker tasks waiting for their next operation: a task is made only when
        # none waits (a task per operation cost more than the rest of a short one)
        self._waiting: list[trio.lowlevel.Task] = []

    # --- public API ------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The pool's name."""
        return self._name

    @property
    def closed(self) -> bool:
        """Whether the pool refuses new submissions."""
        return self._closed

    @property
    def active_count(self) -> int:
        """Worker threads running now, abandoned ones included."""
        return self._limiter.borrowed_tokens

    @property
    def capacity(self) -> int:
        """Operations it holds at most, running and queued (``pool_size + queue_size``)."""
        return self._pool_size + self._queue_size

    @property
    def queue_depth(self) -> int:
        """Operations admitted and not started."""
        return self._queued

    def submit_nowait(
        self,
        fn: Callable[..., T],
        *args: Any,
        timeout: float | None = None,
        cancellation: CancellationToken | None = None,
    ) -> ResultHandle[T]:
        """Admit ``fn(*args)`` without waiting; it runs in a worker thread.

        Args:
            fn: a blocking callable (keyword arguments through ``functools.partial``).
            *args: positional arguments for *fn*.
            timeout: operation-wide timeout in seconds, measured from now (queue wait
                included); expiry settles the handle with
                :class:`~phronomy.DeadlineExceededError`.
            cancellation: a token whose cancellation settles the handle with
                :class:`~phronomy.CancellationError`.

        Returns:
            A handle that tracks physical completion separately.

        Raises:
            RuntimeShutdownError: the pool was shut down.
            BackpressureError: ``queue_size`` operations are already waiting.
            InvalidInputError: a timeout was requested but the pool has no timer queue.
            ReentrancyError: called from a thread other than the runtime's.
        """
        check_thread(self._thread, "OffloadPool.submit_nowait()")
        self._check_open()
        if self._full():
            raise BackpressureError(
                f"OffloadPool {self._name!r} queue is full (depth: {self._queued})"
            )
        return self._admit(fn, args, timeout, cancellation)

    async def submit(
        self,
        fn: Callable[..., T],
        *args: Any,
        timeout: float | None = None,  # noqa: ASYNC109 - the operation's, not the wait's
        cancellation: CancellationToken | None = None,
        on_full: OnFull = "wait",
    ) -> ResultHandle[T]:
        """Admit ``fn(*args)``, waiting for queue space when ``on_full="wait"``.

        Args:
            fn: a blocking callable.
            *args: positional arguments for *fn*.
            timeout: as in :meth:`submit_nowait`.
            cancellation: as in :meth:`submit_nowait`.
            on_full: ``"wait"`` for queue space, or ``"raise"``
                :class:`~phronomy.BackpressureError` at once.

        Returns:
            The operation's handle (await :meth:`~phronomy.ResultHandle.result` for its value).

        Raises:
            RuntimeShutdownError: the pool was (or got) shut down.
            BackpressureError: the queue is full and ``on_full="raise"``.

        Cancellation:
            Cancelling the caller while it waits for queue space admits nothing.
        """
        check_thread(self._thread, "OffloadPool.submit()")
        if on_full not in ("raise", "wait"):
            raise InvalidInputError(
                f"on_full must be 'raise' or 'wait', got {on_full!r}"
            )
        if on_full == "raise":
            handle = self.submit_nowait(
                fn, *args, timeout=timeout, cancellation=cancellation
            )
            await trio.lowlevel.checkpoint()
            return handle
        await trio.lowlevel.checkpoint_if_cancelled()
        while True:
            self._check_open()
            if not self._full():
                break
            await self._space.park()
        handle = self._admit(fn, args, timeout, cancellation)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return handle

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` in a worker thread and return its result.

        Cancellation:
            The caller waits for the worker (threads are never abandoned); the handle's
            result is returned or raised once the thread returns.
        """
        handle = await self.submit(fn, *args)
        with trio.CancelScope(shield=True):
            await handle.wait()
        return handle.result_nowait()

    def statistics(self) -> PoolStatistics:
        """Return a snapshot of the pool's counters."""
        return PoolStatistics(
            name=self._name,
            pool_size=self._pool_size,
            queue_size=self._queue_size,
            active_count=self.active_count,
            queue_depth=self._queued,
            submitted_total=self._submitted,
            completed_total=self._completed,
            abandoned_total=self._abandoned_total,
            abandoned_active_count=self._abandoned_active,
            average_wait_seconds=self._wait_total / self._started
            if self._started
            else 0.0,
            closed=self._closed,
        )

    # --- lifecycle (engine use) --------------------------------------------------------

    def close(self) -> None:
        """Refuse new submissions; queued operations still run."""
        self._closed = True
        self._space.unpark_all()
        waiting, self._waiting = self._waiting, []
        for task in waiting:  # a closed pool's workers end (busy ones, once done)
            trio.lowlevel.reschedule(task, outcome.Value(None))

    def cancel_queued(self, error: BaseException) -> int:
        """Settle every operation that has not started with *error*; returns how many."""
        cancelled = 0
        for op in list(self._queue):
            if op.queued and not op.handle.done:
                op.handle.fail(error)
                self._settled_while_queued(op)
                cancelled += 1
        return cancelled

    @property
    def idle(self) -> bool:
        """No operation is queued or running (abandoned ones included)."""
        return not self._ops

    async def wait_idle(self) -> None:
        """Wait until every operation has physically finished.

        Cancellation:
            The caller's cancel scope bounds the wait; operations are not affected.
        """
        while self._ops:
            await self._idle.park()
        await trio.lowlevel.checkpoint()

    # --- internals -----------------------------------------------------------------

    def _full(self) -> bool:
        # Free thread slots absorb queued operations first, then the queue itself.
        return self._queued >= self._queue_size + self._limiter.available_tokens

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeShutdownError(f"OffloadPool {self._name!r} has been shut down")

    def _admit(
        self,
        fn: Callable[..., T],
        args: tuple[Any, ...],
        timeout: float | None,
        cancellation: CancellationToken | None,
    ) -> ResultHandle[T]:
        handle: ResultHandle[T] = ResultHandle(
            f"offload:{self._name}:{getattr(fn, '__name__', 'callable')}",
            tracks_physical=True,
        )
        op = Operation(fn, args, handle)
        remaining = timeout
        if cancellation is not None and cancellation.deadline is not None:
            token_left = cancellation.remaining()
            assert token_left is not None
            if token_left > 0:
                remaining = (
                    token_left if remaining is None else min(remaining, token_left)
                )
        if remaining is not None and self._timers is None:
            raise InvalidInputError(
                f"OffloadPool {self._name!r} has no timer queue; timeouts are unavailable"
            )
        if cancellation is not None and cancellation.cancelled:
            cancellation.cancel("cancelled before submission")
            handle.cancel(
                CancellationError("offloaded operation cancelled before execution")
            )
            handle.mark_physically_complete()
            return handle
        if timeout is not None and timeout <= 0:
            handle.fail(
                DeadlineExceededError(f"offloaded operation timed out after {timeout}s")
            )
            handle.mark_physically_complete()
            return handle
        op.submitted_at = time.monotonic()
        self._ops.add(op)
        self._submitted += 1
        if remaining is not None:
            assert self._timers is not None
            limit = timeout if timeout is not None else remaining
            op.timer = self._timers.schedule(
                remaining,
                lambda: self._expire(
                    op,
                    DeadlineExceededError(
                        f"offloaded operation timed out after {limit}s"
                    ),
                ),
            )
        if cancellation is not None:

            def on_cancel() -> None:
                self._expire(
                    op, CancellationError("offloaded operation cancelled"), cancel=True
                )

            op.token = cancellation
            op.token_callback = on_cancel
            cancellation.on_cancel(on_cancel)
        if not self._queue and self._limiter.available_tokens:
            self._start(op)
        else:
            op.queued = True
            self._queued += 1
            self._queue.append(op)
        return handle

    def _expire(
        self, op: Operation, error: BaseException, *, cancel: bool = False
    ) -> None:
        """Timeout (failed) or cancellation (cancelled): settle the handle first,
        whatever the worker does."""
        with op.lock:
            if op.handle.done:
                return
            started = op.started
            if cancel:
                op.handle.cancel(error)
            else:
                op.handle.fail(error)
        if started:
            op.abandoned = True
            self._abandoned_total += 1
            self._abandoned_active += 1
        elif op.queued:
            self._settled_while_queued(op)

    def _release_hooks(self, op: Operation) -> None:
        if op.timer is not None:
            op.timer.cancel()
            op.timer = None
        if op.token is not None and op.token_callback is not None:
            op.token.remove_callback(op.token_callback)
            op.token = None

    def _settled_while_queued(self, op: Operation) -> None:
        """A queued operation was settled: it will never run (skipped when dequeued)."""
        op.queued = False
        self._queued -= 1
        self._release_hooks(op)
        op.handle.mark_physically_complete()
        self._finish(op, counted=False)
        self._space.unpark()

    def _start(self, op: Operation) -> None:
        """Give *op* a thread slot (strict FIFO hand-off) and run it."""
        self._limiter.acquire_on_behalf_of_nowait(op)
        self._started += 1
        self._wait_total += time.monotonic() - op.submitted_at
        if self._waiting:
            trio.lowlevel.reschedule(self._waiting.pop(), outcome.Value(op))
        else:
            trio.lowlevel.spawn_system_task(self._work, op, name=self._task_name)

    async def _work(self, op: Operation | None) -> None:
        """A worker task: run *op*, then each operation handed to it while it waits,
        until the pool closes (a system task: anything but Cancelled escaping it
        would crash trio.run). An operation's thread starts from a copy of the context
        the task started with: the handles' callbacks run here and may set variables.
        """
        clean = contextvars.copy_context()
        clean.run(current_async_library_cvar.set, None)  # as to_thread's threads
        task = trio.lowlevel.current_task()

        def abort(_: Any) -> trio.lowlevel.Abort:  # (made once, not per wait)
            self._waiting.remove(task)
            return trio.lowlevel.Abort.SUCCEEDED

        while op is not None:
            finished = False
            try:
                await self._run_op(op, clean.copy())
                finished = True
            except trio.Cancelled:  # pragma: no cover - defensive
                op.handle.cancel(
                    CancellationError("offloaded operation cancelled at exit")
                )
                raise
            except Exception:  # pragma: no cover - defensive
                logger.exception("offload pool %r failed internally", self._name)
            finally:
                if not finished:  # pragma: no cover - defensive
                    op.handle.fail(
                        PhronomyInternalError(
                            f"offload pool {self._name!r} failed internally"
                        )
                    )
                    op.handle.mark_physically_complete()
                    self._finish(op, counted=False)
            if self._closed:
                return
            op = None  # (a waiting worker keeps nothing of the last one alive)
            self._waiting.append(task)
            op = await trio.lowlevel.wait_task_rescheduled(abort)

    def _start_next(self) -> None:
        while self._queue and self._limiter.available_tokens:
            op = self._queue.popleft()
            if not op.queued:
                continue  # settled while it waited
            op.queued = False
            self._queued -= 1
            self._start(op)
        self._space.unpark()

    async def _run_op(self, op: Operation, context: contextvars.Context) -> None:
        try:
            result = await trio.to_thread.run_sync(
                context.run,
                thread_body,
                op,
                limiter=_UNLIMITED,
                thread_name=self._thread_name,
            )
        finally:
            self._limiter.release_on_behalf_of(op)
            self._start_next()  # a thread slot is free again
        self._release_hooks(op)
        # Physical completion is published before the logical callbacks run.
        op.handle.mark_physically_complete()
        if op.abandoned:
            self._abandoned_active -= 1
            logger.debug(
                "discarding the result of abandoned operation %s", op.handle.name
            )
        elif isinstance(result, outcome.Value) and result.value is SKIPPED:
            pass
        elif isinstance(result, outcome.Value):
            op.handle.complete(result.value)
        elif isinstance(result, outcome.Error):
            op.handle.fail(result.error)
        self._finish(op, counted=True)

    def _finish(self, op: Operation, *, counted: bool) -> None:
        self._ops.discard(op)
        if counted:
            self._completed += 1
        if not self._ops:
            self._idle.unpark_all()
