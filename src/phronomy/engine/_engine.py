"""The engine: a small composition of the dispatcher, sessions, receivers, supervision
and shutdown (``open_engine`` runs one)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, TypeVar, final

import trio

from phronomy.errors import (
    InvalidInputError,
    ReentrancyError,
    RuntimeShutdownError,
)

from ._contracts import Delivery
from ._dispatcher import Dispatcher
from ._handle import ResultHandle
from ._lifecycle import Lifecycle
from ._messages import (
    Continuation,
    EngineStatistics,
    Event,
    SessionEnded,
    SessionStart,
)
from ._receivers import ReceiverTable
from ._sessions import SessionTable
from ._shutdown import Shutdown
from ._supervision import Supervisor
from ._thread_guard import foreign_thread_error

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from ._config import EngineConfig
    from ._contracts import Receiver, Session
    from ._messages import LifecycleState, ShutdownResult
    from ._pool import OffloadPool
    from ._timers import TimerQueue

__all__ = ["Engine"]

T = TypeVar("T")
R = TypeVar("R", bound="Receiver")


@final
class Engine:
    """The generic runtime engine: one dispatcher task owning all live state.

    Obtain one with :func:`open_engine` (users normally use
    :func:`phronomy.open_runtime`, which wraps it). It is composed of parts that each
    own their state: the dispatcher (the FIFO channel and its task), the session table,
    the receiver table (feature state and the admission gate), supervision (pools,
    tasks, timers) and the shutdown sequence.

    Thread-safety: every method must be called on the runtime's trio thread (others
    raise :class:`~phronomy.ReentrancyError`); mutating sessions and receivers
    additionally requires the dispatcher task (:meth:`assert_dispatcher`).
    """

    def __init__(self, config: EngineConfig, nursery: trio.Nursery) -> None:
        """Internal: use :func:`open_engine`."""
        self._config = config
        self._token = trio.lowlevel.current_trio_token()
        self._lifecycle = lifecycle = Lifecycle()

        # The parts are created in dependency order; late-bound lambdas reach the
        # dispatcher and the shutdown sequence created after them.
        def enqueue(item: Any) -> None:
            self._dispatcher.enqueue(item)

        self._supervisor = Supervisor(
            lifecycle, nursery, wake=lambda: self._dispatcher.wake()
        )
        self._sessions = SessionTable(lifecycle, enqueue, self.at_batch_end)
        self._receivers = ReceiverTable(lifecycle, enqueue)
        self._dispatcher = Dispatcher(
            config,
            lifecycle,
            self._supervisor.timers,
            self._sessions.live,
            start_pending=self._sessions.start_pending,
            route=self._route,
            on_batch=lambda: self._shutdown.after_batch(),
            on_failure=lambda error: self._shutdown.fail(error),
        )
        self._shutdown = Shutdown(
            lifecycle,
            self._dispatcher,
            self._sessions,
            self._receivers,
            self._supervisor,
        )
        self._admitted = self._sessions.admitted
        self._default_pool = self._supervisor.pool(
            "default", size=config.pool_size, queue_size=config.queue_size
        )

    # --- state -----------------------------------------------------------------------

    @property
    def config(self) -> EngineConfig:
        """The engine's settings."""
        return self._config

    @property
    def state(self) -> LifecycleState:
        """``running``, ``draining``, ``stopping``, ``terminated`` or ``failed``."""
        return self._lifecycle.state

    @property
    def trio_token(self) -> trio.lowlevel.TrioToken:
        """The trio token of the runtime's thread (for :mod:`trio.from_thread`)."""
        return self._token

    @property
    def shutdown_result(self) -> ShutdownResult | None:
        """The result of the shutdown, once it finished."""
        return self._shutdown.result

    @property
    def timers(self) -> TimerQueue:
        """The dispatcher-driven timer queue."""
        return self._supervisor.timers

    @property
    def default_pool(self) -> OffloadPool:
        """The default offload pool."""
        return self._default_pool

    def is_dispatcher(self) -> bool:
        """Whether the calling code runs on the dispatcher task."""
        return self._lifecycle.is_dispatcher()

    def assert_dispatcher(self) -> None:
        """Raise unless running on the dispatcher (or in exclusive shutdown teardown).

        Raises:
            ReentrancyError: called from another task.
        """
        lifecycle = self._lifecycle
        if trio.lowlevel.current_task() is not lifecycle.task:
            lifecycle.assert_dispatcher()  # raises, unless in exclusive teardown

    def refusal(self, what: str) -> RuntimeShutdownError:
        """The error for a request (*what*) the engine no longer takes: it says
        whether the runtime is shutting down or has shut down (its block ended)."""
        return self._lifecycle.refusal(what)

    def check_thread(self, what: str) -> None:
        """Raise unless called on the runtime's trio thread (before touching anything).

        Args:
            what: how the error names the call, for example ``"runtime.workflows.signal()"``.

        Raises:
            ReentrancyError: called from another thread.
        """
        if threading.get_ident() != self._lifecycle.thread_id:
            raise foreign_thread_error(what)

    # --- posting: the one verb -------------------------------------------------------

    def post_nowait(self, item: Event | Delivery, *, at_once: bool = False) -> bool:
        """Queue *item* for the dispatcher, in FIFO order.

        An :class:`Event` is queued only while its target session is admitted (from
        registration until it ends); a :class:`Delivery` only to a registered receiver,
        and with ``admission=True`` only while the engine is running. With *at_once*,
        an event posted on the dispatcher is handed to its live session at once, even
        once the engine stopped accepting posts (the dispatcher still dispatches what
        it accepted): for code that runs where its posts would be queued (a
        continuation, see :meth:`call_soon`).

        Returns:
            Whether the item was queued, or taken (``False``: the engine or the target
            no longer accepts it).

        Raises:
            ReentrancyError: called from a thread other than the runtime's.
        """
        lifecycle = self._lifecycle
        if threading.get_ident() != lifecycle.thread_id:
            raise foreign_thread_error(f"Engine.post_nowait({type(item).__name__})")
        if type(item) is Event:  # the hottest path of the engine: enqueue, inlined
            if at_once and trio.lowlevel.current_task() is lifecycle.task:
                # dispatching what it accepted earlier (a continuation): handed over
                # while the session lives, even once the engine stopped accepting
                session = self._sessions.live.get(item.target_id)
                if session is not None and item.target_id in self._admitted:
                    if item.caller is not None:
                        self._receivers.track(item.caller)
                    session.handle(item)
                    return True
            if not lifecycle.accepting or item.target_id not in self._admitted:
                return False
            if item.caller is not None:
                self._receivers.track(item.caller)
            dispatcher = self._dispatcher
            dispatcher.send_nowait(item)
            dispatcher.posted += 1
            depth = dispatcher.posted - dispatcher.dispatched
            if depth == 1 or depth >= dispatcher.backlog_threshold:
                dispatcher.note_depth(depth, item)
            return True
        return self._receivers.post(item)

    def at_batch_end(self, callback: Callable[[], object]) -> None:
        """Run *callback* once the dispatcher has dispatched its current batch.

        On the dispatcher task, work that many items of one batch contribute to (a
        group commit) is started once, after the whole batch; anywhere else (or once
        the dispatcher has stopped) *callback* runs at once.
        """
        self._dispatcher.at_batch_end(callback)

    def call_soon(self, call: Callable[[], object]) -> bool:
        """Queue *call* to run on the dispatcher, in FIFO order after what is queued.

        What *call* does, it does at that place in the queue: what it would post
        (to a session or a receiver) it may do at once instead, with the same order
        (the group commit hands a batch's completions over this way). An exception
        it raises fails the dispatcher, as a delivery's does; one queued when the
        dispatcher stops runs at the engine's teardown (its posts are refused then).

        Returns:
            Whether it was queued (``False``: the engine no longer accepts it; run it
            elsewhere).

        Raises:
            ReentrancyError: called from a thread other than the runtime's.
        """
        lifecycle = self._lifecycle
        if threading.get_ident() != lifecycle.thread_id:
            raise foreign_thread_error("Engine.call_soon()")
        if not lifecycle.accepting:
            return False
        self._dispatcher.enqueue(Continuation(call=call))
        return True

    def end_session(self, ended: SessionEnded) -> None:
        """A session reached its end: it stops being admitted now, and its waiter
        settles after the events already queued (at the end of the dispatcher's
        current batch, or through the queue when called from elsewhere)."""
        self._admitted.discard(ended.session_id)
        if self._lifecycle.is_dispatcher():
            self._sessions.end_soon(ended)
        else:
            self._dispatcher.enqueue(ended)

    def _route(self, item: Any) -> None:
        if type(item) is Delivery:
            self._receivers.deliver(item)
        elif type(item) is Continuation:
            item.call()
        elif type(item) is SessionEnded:
            self._sessions.end(item)
        elif type(item) is SessionStart:
            self._sessions.start(item)

    # --- sessions and receivers --------------------------------------------------------

    def register_session(
        self,
        session: Session,
        *,
        completion: ResultHandle[Any] | None = None,
        receiver: Receiver | None = None,
    ) -> ResultHandle[Any]:
        """Register *session*; the dispatcher starts it in FIFO order.

        Args:
            session: the session to run.
            completion: settled with the session's result or error; a new handle is
                created when omitted.
            receiver: the registered receiver that owns the session (told when it
                retires).

        Returns:
            The completion handle.

        Raises:
            RuntimeShutdownError: the engine no longer accepts sessions.
            PhronomyError: a session with that id is already registered.
            ValueError: *receiver* is not registered on this engine.
            ReentrancyError: called from a thread other than the runtime's.
        """
        self.check_thread("Engine.register_session()")
        waiter = (
            ResultHandle(f"session:{session.id}") if completion is None else completion
        )
        self._sessions.register(session, waiter, _known(self._receivers, receiver))
        return waiter

    def run_session(
        self,
        session: Session,
        *,
        on_end: Callable[[SessionEnded], object],
        receiver: Receiver | None = None,
    ) -> None:
        """Register *session* as :meth:`register_session` does, without a handle:
        *on_end* is called with how it ended (on the dispatcher, once the events it
        received were dispatched; with ``outcome="error"`` when it is cut off, never
        starts, or the dispatcher fails). A retired session goes to *receiver*
        instead (``waiter=None``).

        Args:
            session: the session to run.
            on_end: learns how it ended.
            receiver: the registered receiver that owns the session (told when it
                retires).

        Raises:
            RuntimeShutdownError: the engine no longer accepts sessions.
            PhronomyError: a session with that id is already registered.
            ValueError: *receiver* is not registered on this engine.
            ReentrancyError: called from a thread other than the runtime's.
        """
        self.check_thread("Engine.run_session()")
        self._sessions.register(session, on_end, _known(self._receivers, receiver))

    def receiver(self, key: object, factory: Callable[[Engine], R]) -> R:
        """Return the receiver registered under *key*, creating it with *factory*.

        Raises:
            RuntimeShutdownError: none is registered and the engine is not running.
        """
        existing = self._receivers.get(key)
        if existing is not None:
            return existing  # type: ignore[return-value]
        return self._receivers.register(key, factory(self))  # type: ignore[return-value]

    def admit(self, receiver: Receiver) -> None:
        """Pass the admission gate for a new execution (call from ``receiver.deliver``).

        Open while running, and while draining for a request the same receiver queued
        with ``admission=True`` before draining began.

        Raises:
            RuntimeShutdownError: new executions are no longer accepted.
        """
        self._receivers.admit(receiver)

    # --- supervised work ---------------------------------------------------------------

    def pool(self, name: str, *, size: int = 10, queue_size: int = 100) -> OffloadPool:
        """Return the named offload pool, creating it on first use.

        Raises:
            RuntimeShutdownError: the engine is stopping or closed.
            RuntimeShutdownError: pools were already shut down.
            ReentrancyError: called from a thread other than the runtime's.
        """
        self.check_thread("Engine.pool()")
        return self._supervisor.pool(name, size=size, queue_size=queue_size)

    async def after_threads(self, fn: Callable[[], object]) -> None:
        """Run the blocking *fn* in a worker thread once no offload pool runs an
        operation (cleanup after the engine stopped): now, or in the background after
        the last thread a shutdown gave up on returns (a failure is then logged).

        Raises:
            InvalidInputError: the engine has not stopped (its pools take new work).
            Exception: what *fn* raised, when it ran now.

        Cancellation:
            Shielded: once started, *fn* runs to its end.
        """
        await self._supervisor.after_threads(fn)

    def start_task(
        self, fn: Callable[..., Awaitable[T]], *args: Any, name: str | None = None
    ) -> ResultHandle[T]:
        """Run ``await fn(*args)`` as a supervised trio task in the engine's nursery.

        Cancelling the returned handle cancels the task; the handle is physically
        complete once the task has exited. Shutdown cancels supervised tasks that are
        still running and waits for them.

        Raises:
            RuntimeShutdownError: the engine is stopping or closed.
            ReentrancyError: called from a thread other than the runtime's.
        """
        self.check_thread("Engine.start_task()")
        return self._supervisor.start_task(fn, args, name)

    def statistics(self) -> EngineStatistics:
        """Return a snapshot of the engine's counters."""
        dispatcher = self._dispatcher
        last, largest, mean = dispatcher.lag
        return EngineStatistics(
            state=self._lifecycle.state,
            queue_depth=dispatcher.queue_depth,
            max_queue_depth=dispatcher.max_depth,
            dispatched_total=dispatcher.dispatched,
            dropped_total=dispatcher.dropped,
            last_lag_seconds=last,
            max_lag_seconds=largest,
            average_lag_seconds=mean,
            sessions=len(self._sessions),
            pending_deliveries=len(self._receivers),
            timers_pending=self._supervisor.timers.pending_count,
            supervised_tasks=self._supervisor.task_count,
            pools=self._supervisor.pool_statistics(),
        )

    # --- shutdown ----------------------------------------------------------------------

    async def shutdown(
        self,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - a drain deadline, not a wait bound
        cancel_grace: float | None = None,
    ) -> ShutdownResult:
        """Shut the engine down gracefully; later calls return the first result.

        1. Stop admitting new executions; queued requests and continuations still run.
        2. Wait up to *timeout* for live work to finish.
        3. Stop the dispatcher (after the events already queued), then cut off what is
           still live: its callers get :class:`~phronomy.RuntimeShutdownError`, or
           :class:`~phronomy.RecoveryRequiredError` when a durable save was in flight.
        4. Let receivers finish the writes they owe, close the offload pools, cancel
           queued operations and supervised tasks, and wait up to *cancel_grace* for
           worker threads (never killing them).

        Args:
            timeout: drain deadline in seconds (default: the engine's ``shutdown_timeout``).
            cancel_grace: seconds to wait for worker threads (default: *timeout*, at
                least 0.2).

        Returns:
            The :class:`~phronomy.ShutdownResult`.

        Raises:
            ReentrancyError: called from the dispatcher task.
            ValueError: a negative *timeout* or *cancel_grace*.

        Cancellation:
            The shutdown itself is shielded and bounded by the two deadlines; cancelling
            the caller does not leave the engine half closed.
        """
        if self.is_dispatcher():
            raise ReentrancyError(
                "Engine.shutdown cannot be called from the dispatcher task"
            )
        if (timeout is not None and timeout < 0) or (
            cancel_grace is not None and cancel_grace < 0
        ):
            raise InvalidInputError(
                f"timeout and cancel_grace must be non-negative, got {timeout!r} and "
                f"{cancel_grace!r}"
            )
        drain = self._config.shutdown_timeout if timeout is None else timeout
        grace = cancel_grace if cancel_grace is not None else self._config.cancel_grace
        with trio.CancelScope(shield=True):
            if not self._shutdown.started:
                return await self._shutdown.run(
                    drain, drain if grace is None else grace
                )
            await self._shutdown.done.wait()
        result = self._shutdown.result
        assert result is not None
        return result


def _known(receivers: ReceiverTable, receiver: R | None) -> R | None:
    """*receiver*, once it is known to be registered (``None`` passes).

    Raises:
        ValueError: it is not registered on this engine.
    """
    if receiver is not None and not receivers.known(receiver):
        raise ValueError("the receiver is not registered on this engine")
    return receiver
