"""The engine: one dispatcher task on a FIFO memory channel, and everything it owns."""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Literal, NoReturn, Protocol, TypeVar, final

import msgspec
import trio

from phronomy.errors import (
    ConfigurationError,
    DispatcherOnlyError,
    PhronomyError,
    PhronomyInternalError,
    PoolShutdownError,
    RecoveryRequiredError,
    ReentrancyError,
    RuntimeShutdownError,
)

from ._handle import ResultHandle
from ._messages import (
    SYSTEM_CHANNEL,
    DispatcherStatus,
    EngineStatistics,
    Event,
    LifecycleState,
    SessionOutcome,
    ShutdownResult,
)
from ._pool import OffloadPool
from ._thread_guard import check_thread, foreign_thread_error
from ._timers import TimerQueue

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Awaitable, Callable

    from ._receiver import ExecutionReceiver
    from ._session import Session

__all__ = ["Engine", "EngineConfig", "ShutdownParticipant", "open_engine"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R", bound="ExecutionReceiver")

_ACCEPTING_EVENTS = frozenset({"running", "draining"})
_TERMINAL_MANAGEMENT = frozenset({"finished", "halted", "error", "recovery_required"})

_NO_THRESHOLD = 1 << 62
_MIN_STOP_GRACE = 0.2


class EngineConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Settings of an engine.

    Attributes:
        pool_size: worker threads of the default offload pool.
        queue_size: queued operations the default pool admits.
        shutdown_timeout: seconds a graceful shutdown waits for live work to finish.
        cancel_grace: seconds shutdown then waits for worker threads (default:
            ``shutdown_timeout``; at least 0.2).
        backlog_threshold: queue depth that triggers a backlog warning.
        backlog_interval: minimum seconds between two backlog warnings.
        starvation_threshold: warn when an event waited longer than this in the queue.
        dispatch_threshold: warn when one dispatch took longer than this.
    """

    pool_size: int = 10
    queue_size: int = 100
    shutdown_timeout: float = 5.0
    cancel_grace: float | None = None
    backlog_threshold: int = 1000
    backlog_interval: float = 60.0
    starvation_threshold: float | None = None
    dispatch_threshold: float | None = None

    def __post_init__(self) -> None:
        """Validate the numbers."""
        if self.shutdown_timeout < 0 or (
            self.cancel_grace is not None and self.cancel_grace < 0
        ):
            raise ConfigurationError("shutdown_timeout and cancel_grace must be >= 0")
        if self.pool_size < 1 or self.queue_size < 0:
            raise ConfigurationError("pool_size must be >= 1 and queue_size >= 0")
        if self.backlog_threshold < 1 or self.backlog_interval < 0:
            raise ConfigurationError(
                "backlog_threshold must be >= 1, backlog_interval >= 0"
            )


class ShutdownParticipant(Protocol):
    """A runtime-lifetime component that must quiesce before the engine stops."""

    def begin_draining(self) -> None:
        """Stop admitting new work (short, idempotent, must not call the engine)."""
        ...

    async def wait_until_idle(self) -> bool:
        """Wait until idle; the caller's cancel scope carries the shutdown deadline."""
        ...


class _Marker:
    """A dispatcher-internal queue item (STOP, WAKE)."""

    __slots__ = ("name",)
    target_id = "\x00marker"

    def __init__(self, name: str) -> None:
        self.name = name


_STOP = _Marker("stop")
_WAKE = _Marker("wake")


class _Delivery:
    """A queued receiver message (its ``target_id`` never names a session)."""

    __slots__ = ("admission", "completion", "message", "receiver")
    target_id = "\x00delivery"

    def __init__(
        self,
        receiver: ExecutionReceiver,
        message: Any,
        admission: bool,
        completion: ResultHandle[Any] | None,
    ) -> None:
        self.receiver = receiver
        self.message = message
        self.admission = admission
        self.completion = completion


@final
class Engine:
    """The generic runtime engine: one dispatcher task owning all live state.

    Obtain one with :func:`open_engine` (users normally use
    :func:`phronomy.open_runtime`, which wraps it). The dispatcher reads a FIFO trio
    memory channel and drains whatever else is queued before awaiting again. Sessions,
    execution receivers and timers run on it; blocking work goes to offload pools.

    Thread-safety: every method must be called on the runtime's trio thread, except
    :meth:`post_from_thread`. Mutating methods of receivers and sessions additionally
    require the dispatcher task (see :meth:`is_dispatcher`).
    """

    def __init__(self, config: EngineConfig, nursery: trio.Nursery) -> None:
        """Internal: use :func:`open_engine`."""
        self._config = config
        self._nursery = nursery
        self._send, self._recv = trio.open_memory_channel[Any](math.inf)
        self._token = trio.lowlevel.current_trio_token()
        self._thread_id = threading.get_ident()
        self._state: LifecycleState = "running"
        self._accepting = True
        self._task: trio.lowlevel.Task | None = None
        self._dispatcher_scope = trio.CancelScope()
        self._dispatcher_exited = trio.Event()
        self._exclusive = False
        # sessions
        self._sessions: dict[str, Session] = {}
        self._waiters: dict[str, ResultHandle[Any]] = {}
        self._starting: dict[str, tuple[Session, ResultHandle[Any]]] = {}
        self._session_receivers: dict[str, ExecutionReceiver] = {}
        self._admitted: set[str] = set()
        # receivers and deliveries
        self._receivers: dict[object, ExecutionReceiver] = {}
        self._receiver_ids: set[int] = set()
        self._deliveries: set[_Delivery] = set()
        self._dispatching: _Delivery | None = None
        self._receivers_shut_down = False
        # callers' handles given with requests, until they settle: every one of them
        # is settled before the runtime block exits
        self._callers: set[ResultHandle[Any]] = set()
        # participants
        self._participants: dict[object, ShutdownParticipant] = {}
        # resources
        self._timers = TimerQueue(wake=self._wake)
        self._pools: dict[str, OffloadPool] = {}
        self._pools_closed = False
        self._tasks: set[ResultHandle[Any]] = set()
        self._tasks_idle = trio.lowlevel.ParkingLot()
        # metrics
        self._posted = 0
        self._dispatched = 0
        self._dropped = 0
        self._max_depth = 0
        self._last_backlog_warning = -math.inf
        self._oldest_post_ns = 0
        self._batches = 0
        self._lag_last = 0
        self._lag_max = 0
        self._lag_sum = 0
        self._backlog_threshold = config.backlog_threshold
        self._starvation_ns = (
            _NO_THRESHOLD
            if config.starvation_threshold is None
            else int(config.starvation_threshold * 1e9)
        )
        # lifecycle
        self._idle_event: trio.Event | None = None
        self._failure: BaseException | None = None
        self._errors: list[BaseException] = []
        self._shutdown_started = False
        self._shutdown_done = trio.Event()
        self._result: ShutdownResult | None = None
        self._default_pool = self.pool(
            "default", size=config.pool_size, queue_size=config.queue_size
        )

    # --- identity and state ----------------------------------------------------------

    @property
    def config(self) -> EngineConfig:
        """The engine's settings."""
        return self._config

    @property
    def state(self) -> LifecycleState:
        """``running``, ``draining``, ``stopping``, ``terminated`` or ``failed``."""
        return self._state

    @property
    def trio_token(self) -> trio.lowlevel.TrioToken:
        """The trio token of the runtime's thread (for :mod:`trio.from_thread`)."""
        return self._token

    @property
    def shutdown_result(self) -> ShutdownResult | None:
        """The result of the shutdown, once it finished."""
        return self._result

    @property
    def failure(self) -> BaseException | None:
        """The error that failed the dispatcher, if any."""
        return self._failure

    @property
    def timers(self) -> TimerQueue:
        """The dispatcher-driven timer queue."""
        return self._timers

    def _set_state(self, state: LifecycleState) -> None:
        self._state = state
        self._accepting = state in _ACCEPTING_EVENTS

    def is_dispatcher(self) -> bool:
        """Whether the calling code runs on the dispatcher task."""
        return trio.lowlevel.current_task() is self._task

    def assert_dispatcher(self) -> None:
        """Raise unless running on the dispatcher (or in exclusive shutdown teardown).

        Raises:
            DispatcherOnlyError: called from another task.
        """
        if not self._exclusive and trio.lowlevel.current_task() is not self._task:
            raise DispatcherOnlyError(
                "phronomy-managed live execution state may only be mutated on the "
                "runtime's dispatcher task"
            )

    def check_thread(self, what: str) -> None:
        """Raise unless called on the runtime's trio thread (before touching anything).

        Args:
            what: how the error names the call, for example ``"runtime.signal()"``.

        Raises:
            ReentrancyError: called from another thread.
        """
        check_thread(self._thread_id, what)

    # --- posting -----------------------------------------------------------------------

    def post(self, event: Event) -> bool:
        """Queue *event* for the dispatcher.

        Returns ``False`` when the engine no longer accepts events (stopping, closed or
        failed). An event for an unknown session is dropped with a warning at dispatch.
        A terminal management event un-admits its session at once.

        Raises:
            ReentrancyError: called from a thread other than the runtime's (use
                :meth:`post_from_thread`).
        """
        if threading.get_ident() != self._thread_id:
            raise foreign_thread_error("Engine.post()")
        if not self._accepting:
            return False
        if event.target_id == SYSTEM_CHANNEL and event.type in _TERMINAL_MANAGEMENT:
            payload = event.payload
            if isinstance(payload, SessionOutcome):
                self._admitted.discard(payload.session_id)
        # _enqueue, inlined: this is the hottest path of the engine.
        self._send.send_nowait(event)
        self._posted += 1
        depth = self._posted - self._dispatched
        if depth == 1:
            self._oldest_post_ns = time.perf_counter_ns()
        elif depth >= self._backlog_threshold:
            self._maybe_warn_backlog(depth, event)
        return True

    def post_to_session(self, event: Event) -> bool:
        """Queue *event* only if its target session is still admitted.

        Raises:
            ValueError: the target is the system channel.
        """
        check_thread(self._thread_id, "Engine.post_to_session()")
        if event.target_id == SYSTEM_CHANNEL:
            raise ValueError("post_to_session cannot target the system channel")
        if not self._accepting or event.target_id not in self._admitted:
            return False
        self._enqueue(event)
        return True

    def post_from_thread(self, event: Event) -> bool:
        """Post *event* from a thread that is not the runtime's; blocks briefly.

        Returns:
            What :meth:`post` returned, or ``False`` once the trio run has finished.

        Raises:
            ReentrancyError: called on the runtime's own thread (use :meth:`post`).
        """
        if threading.get_ident() == self._thread_id:
            raise ReentrancyError(
                "post_from_thread called on the runtime's thread; use post"
            )
        try:
            return trio.from_thread.run_sync(self.post, event, trio_token=self._token)
        except trio.RunFinishedError:
            return False

    def is_session_admitted(self, session_id: str) -> bool:
        """Whether events for *session_id* are still accepted."""
        return session_id in self._admitted

    def _enqueue(self, item: Any) -> None:
        self._send.send_nowait(item)
        self._posted += 1
        depth = self._posted - self._dispatched
        if depth == 1:
            # The queue was empty: this is the oldest item of the next batch. Queue lag
            # is measured per batch, on its oldest item (the batch's largest lag).
            self._oldest_post_ns = time.perf_counter_ns()
        elif depth >= self._backlog_threshold:
            self._maybe_warn_backlog(depth, item)

    def _maybe_warn_backlog(self, depth: int, item: Any) -> None:
        now = time.monotonic()
        if now - self._last_backlog_warning < self._config.backlog_interval:
            return
        self._last_backlog_warning = now
        self._max_depth = max(self._max_depth, depth)
        kind = item.type if isinstance(item, Event) else type(item).__name__
        target = item.target_id if isinstance(item, Event) else "-"
        with contextlib.suppress(
            Exception
        ):  # a broken log handler must not break posting
            logger.warning(
                "dispatcher backlog: depth=%d max_depth=%d threshold=%d event=%s target=%s",
                depth,
                self._max_depth,
                self._config.backlog_threshold,
                kind,
                target,
            )

    def _wake(self) -> None:
        if (
            self._task is not None
            and not self.is_dispatcher()
            and not self._dispatcher_exited.is_set()
        ):
            self._enqueue(_WAKE)

    # --- sessions --------------------------------------------------------------------

    def register_session(
        self,
        session: Session,
        *,
        completion: ResultHandle[Any] | None = None,
        receiver: ExecutionReceiver | None = None,
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
        check_thread(self._thread_id, "Engine.register_session()")
        if self._state not in _ACCEPTING_EVENTS:
            raise RuntimeShutdownError(
                f"the runtime is {self._state}; new sessions are not accepted"
            )
        sid = session.id
        if sid in self._admitted or sid in self._sessions or sid in self._starting:
            raise PhronomyError(f"session {sid!r} is already registered")
        if receiver is not None and id(receiver) not in self._receiver_ids:
            raise ValueError("the receiver is not registered on this engine")
        handle = (
            completion if completion is not None else ResultHandle(f"session:{sid}")
        )
        self._admitted.add(sid)
        self._starting[sid] = (session, handle)
        if receiver is not None:
            self._session_receivers[sid] = receiver
        self._enqueue(Event(type="start", target_id=SYSTEM_CHANNEL, payload=sid))
        return handle

    # --- receivers ---------------------------------------------------------------------

    def receiver(self, key: object, factory: Callable[[Engine], R]) -> R:
        """Return the receiver registered under *key*, creating it with *factory*.

        Raises:
            RuntimeShutdownError: no receiver is registered under *key* and the engine
                is no longer running.
        """
        existing = self._receivers.get(key)
        if existing is not None:
            return existing  # type: ignore[return-value]
        return self.register_receiver(key, factory(self))

    def register_receiver(self, key: object, receiver: R) -> R:
        """Register *receiver* under *key*; the first registration per key wins.

        Returns:
            The registered receiver (an earlier one if the key was taken).

        Raises:
            ValueError: *receiver* is bound to another engine.
            RuntimeShutdownError: the engine is not running.
        """
        existing = self._receivers.get(key)
        if existing is not None:
            return existing  # type: ignore[return-value]
        if receiver.engine is not self:
            raise ValueError("the receiver is bound to another runtime, not this one")
        if self._state != "running":
            raise RuntimeShutdownError(
                f"the runtime is {self._state}; execution receivers cannot be registered"
            )
        self._receivers[key] = receiver
        self._receiver_ids.add(id(receiver))
        return receiver

    def existing_receiver(self, key: object) -> ExecutionReceiver | None:
        """Look up the receiver registered under *key* (never creates one)."""
        return self._receivers.get(key)

    def post_execution(
        self,
        receiver: ExecutionReceiver,
        message: Any,
        *,
        admission: bool,
        completion: ResultHandle[Any] | None = None,
    ) -> bool:
        """Queue *message* for ``receiver.deliver`` on the dispatcher.

        Args:
            receiver: a receiver registered on this engine.
            message: any value.
            admission: ``True`` for requests that may establish a new admission; they
                are refused once draining begins (requests already queued still run).
            completion: failed with the error if delivery fails or is cut off.

        Returns:
            Whether the message was queued.

        Raises:
            ReentrancyError: called from a thread other than the runtime's.
        """
        check_thread(self._thread_id, "Engine.post_execution()")
        if (
            self._state not in _ACCEPTING_EVENTS
            or id(receiver) not in self._receiver_ids
        ):
            return False
        if admission and self._state != "running":
            return False
        if completion is not None and not completion.done:
            self._callers.add(completion)
            completion.on_complete(self._callers.discard)
        delivery = _Delivery(receiver, message, admission, completion)
        self._deliveries.add(delivery)
        self._enqueue(delivery)
        return True

    def admit_execution(self, receiver: ExecutionReceiver) -> None:
        """Gate a new admission (call from ``receiver.deliver``).

        Allowed while running, or while draining for a request that was queued with
        ``admission=True`` by the same receiver before draining began.

        Raises:
            RuntimeShutdownError: new executions are no longer accepted.
        """
        if self._state == "running":
            return
        current = self._dispatching
        if (
            self._state == "draining"
            and current is not None
            and current.admission
            and current.receiver is receiver
        ):
            return
        raise RuntimeShutdownError(
            f"the runtime is {self._state}; new executions are not accepted"
        )

    def route_execution_event(
        self, receiver: ExecutionReceiver, lookup: Callable[[], Event | None]
    ) -> bool:
        """Ask *receiver* for an event (``lookup``) and queue it if its session is live.

        Lookup and enqueue happen without a checkpoint in between, so the session the
        lookup resolved cannot change before the event is queued.

        Raises:
            ReentrancyError: called from a thread other than the runtime's.
        """
        check_thread(self._thread_id, "Engine.route_execution_event()")
        if (
            self._state not in _ACCEPTING_EVENTS
            or id(receiver) not in self._receiver_ids
        ):
            return False
        event = lookup()
        if event is None or event.target_id not in self._admitted:
            return False
        self._enqueue(event)
        return True

    # --- shutdown participants ------------------------------------------------------

    def register_shutdown_participant(
        self, key: object, participant: ShutdownParticipant
    ) -> ShutdownParticipant:
        """Register a participant that shutdown drains before stopping the dispatcher.

        Raises:
            TypeError: the participant lacks ``begin_draining`` and ``wait_until_idle``.
            RuntimeShutdownError: the engine is not running.
        """
        if not (
            callable(getattr(participant, "begin_draining", None))
            and callable(getattr(participant, "wait_until_idle", None))
        ):
            raise TypeError(
                "a shutdown participant must implement begin_draining and wait_until_idle"
            )
        if self._state != "running":
            raise RuntimeShutdownError(
                f"Runtime is {self._state}; shutdown participants cannot be registered"
            )
        return self._participants.setdefault(key, participant)

    def shutdown_participant(self, key: object) -> ShutdownParticipant | None:
        """Look up a participant (works during and after shutdown)."""
        return self._participants.get(key)

    # --- pools, timers, supervised tasks -----------------------------------------

    @property
    def default_pool(self) -> OffloadPool:
        """The default offload pool."""
        return self._default_pool

    def pool(self, name: str, *, size: int = 10, queue_size: int = 100) -> OffloadPool:
        """Return the named offload pool, creating it on first use.

        Raises:
            RuntimeShutdownError: the engine is stopping or closed.
            PoolShutdownError: pools were already shut down.
            ReentrancyError: called from a thread other than the runtime's.
        """
        check_thread(self._thread_id, "Engine.pool()")
        existing = self._pools.get(name)
        if existing is not None:
            return existing
        if self._state not in _ACCEPTING_EVENTS:
            raise RuntimeShutdownError(
                f"Runtime is {self._state}; new work is not accepted"
            )
        if self._pools_closed:
            raise PoolShutdownError("offload pools have been shut down")
        created = OffloadPool(
            name, pool_size=size, queue_size=queue_size, timers=self._timers
        )
        self._pools[name] = created
        return created

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
        check_thread(self._thread_id, "Engine.start_task()")
        if self._state not in _ACCEPTING_EVENTS:
            raise RuntimeShutdownError(
                f"Runtime is {self._state}; new work is not accepted"
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

    # --- statistics ------------------------------------------------------------------

    def statistics(self) -> EngineStatistics:
        """Return a snapshot of the engine's counters."""
        dispatched = self._dispatched
        return EngineStatistics(
            state=self._state,
            queue_depth=max(self._posted - dispatched, 0),
            max_queue_depth=self._max_depth,
            dispatched_total=dispatched,
            dropped_total=self._dropped,
            last_lag_seconds=self._lag_last / 1e9,
            max_lag_seconds=self._lag_max / 1e9,
            average_lag_seconds=(self._lag_sum / self._batches / 1e9)
            if self._batches
            else 0.0,
            sessions=len(self._sessions) + len(self._starting),
            pending_deliveries=len(self._deliveries),
            timers_pending=self._timers.pending_count,
            supervised_tasks=len(self._tasks),
            pools=tuple(p.statistics() for p in self._pools.values()),
        )

    # --- the dispatcher --------------------------------------------------------------

    async def _dispatch_main(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        self._task = trio.lowlevel.current_task()
        try:
            with self._dispatcher_scope:
                task_status.started()
                try:
                    await self._dispatch_loop()
                except Exception as exc:  # noqa: BLE001 - a dispatcher failure, reported
                    self._fail(exc)
        finally:
            self._dispatcher_exited.set()

    async def _dispatch_loop(self) -> None:
        recv = self._recv
        timers = self._timers
        timed = self._config.dispatch_threshold is not None
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
                    self._after_batch()
                    continue
            keep_going = self._dispatch_batch(item, timed)
            if timers.pending_count:
                timers.fire_due()
            self._after_batch()
            if not keep_going:
                return

    def _dispatch_batch(self, event: Any, timed: bool) -> bool:
        """Dispatch *event*, then everything already queued; ``False`` after STOP."""
        lag = time.perf_counter_ns() - self._oldest_post_ns
        depth = self._posted - self._dispatched
        if depth > self._max_depth:
            self._max_depth = depth
        self._batches += 1
        self._lag_last = lag
        self._lag_sum += lag
        if lag > self._lag_max:
            self._lag_max = lag
        if lag > self._starvation_ns:
            self._warn_starvation(event, lag)
        recv_nowait = self._recv.receive_nowait
        if timed:
            return self._dispatch_timed(event, recv_nowait)
        sessions_get = self._sessions.get
        while True:
            self._dispatched += 1
            # Every queued item has a target_id; the common case is a live session.
            session = sessions_get(event.target_id)
            if session is not None:
                session.handle(event)
            elif event is _STOP:
                return False
            else:
                self._dispatch_other(event)
            try:
                event = recv_nowait()
            except trio.WouldBlock:
                return True

    def _dispatch_timed(self, event: Any, recv_nowait: Callable[[], Any]) -> bool:
        """The batch loop with long-dispatch warnings (``dispatch_threshold`` set)."""
        threshold = self._config.dispatch_threshold
        assert threshold is not None
        while True:
            self._dispatched += 1
            started = time.perf_counter()
            session = self._sessions.get(event.target_id)
            if session is not None:
                session.handle(event)
            elif event is _STOP:
                return False
            else:
                self._dispatch_other(event)
            took = time.perf_counter() - started
            if took > threshold:
                logger.warning(
                    "dispatch of %s took %.3fs (threshold %.3fs); move blocking work to an offload pool",
                    getattr(event, "type", type(event).__name__),
                    took,
                    threshold,
                )
            try:
                event = recv_nowait()
            except trio.WouldBlock:
                return True

    def _dispatch_other(self, item: Any) -> None:
        """Dispatch an item that is not an event for a live session."""
        if type(item) is Event:
            if item.target_id == SYSTEM_CHANNEL:
                self._manage(item)
            else:
                self._drop(item)
        elif type(item) is _Delivery:
            self._deliver(item)

    def _warn_starvation(self, event: Any, lag_ns: int) -> None:
        logger.warning(
            "dispatcher starvation: %s for %s waited %.3fs in the queue",
            event.type if isinstance(event, Event) else type(event).__name__,
            event.target_id if isinstance(event, Event) else "-",
            lag_ns / 1e9,
        )

    def _drop(self, event: Event) -> None:
        self._dropped += 1
        logger.warning(
            "dropping event %r: no session has target_id %r",
            event.type,
            event.target_id,
        )

    def _after_batch(self) -> None:
        if self._idle_event is not None and self._is_idle():
            self._idle_event.set()
            self._idle_event = None

    def _manage(self, event: Event) -> None:
        kind = event.type
        if kind == "start":
            sid = event.payload
            entry = self._starting.pop(sid, None)
            if entry is None:
                return
            session, waiter = entry
            self._sessions[sid] = session
            self._waiters[sid] = waiter
            session.start()
        elif kind in ("finished", "halted", "error"):
            outcome: SessionOutcome = event.payload
            sid = outcome.session_id
            self._sessions.pop(sid, None)
            self._session_receivers.pop(sid, None)
            ended = self._waiters.pop(sid, None)
            if ended is not None:
                if outcome.error is not None:
                    ended.fail(outcome.error)
                else:
                    ended.complete(outcome.result)
        elif kind == "recovery_required":
            outcome = event.payload
            sid = outcome.session_id
            self._sessions.pop(sid, None)
            retired = self._waiters.pop(sid, None)
            owner = self._session_receivers.pop(sid, None)
            if owner is not None:
                owner.session_retired(
                    sid, reason="recovery_required", waiter=retired, error=outcome.error
                )
            elif retired is not None:  # nobody owns the outcome: report it unknown
                error = RecoveryRequiredError(
                    f"session {sid} retired: the outcome of its terminal work is "
                    f"unknown ({outcome.error!r})"
                )
                error.__cause__ = outcome.error
                retired.fail(error)
        else:
            logger.warning("unknown management event %r", kind)

    def _deliver(self, delivery: _Delivery) -> None:
        self._dispatching = delivery
        try:
            delivery.receiver.deliver(delivery.message)
        except Exception as exc:
            if delivery.completion is not None:
                delivery.completion.fail(exc)
            raise
        finally:
            self._dispatching = None
            self._deliveries.discard(delivery)

    def _is_idle(self) -> bool:
        if self._state == "failed":
            return True
        return (
            not self._sessions
            and not self._starting
            and not self._deliveries
            and all(r.idle() for r in self._receivers.values())
        )

    def _fail(self, error: BaseException) -> None:
        """The dispatcher failed: fail everything pending with *error*."""
        logger.error("phronomy dispatcher failed", exc_info=error)
        if self._failure is None:
            self._failure = error
        self._set_state("failed")
        self._admitted.clear()
        self._exclusive = True
        try:
            for _, waiter in self._starting.values():
                waiter.fail(error)
            for waiter in self._waiters.values():
                waiter.fail(error)
            self._starting.clear()
            self._waiters.clear()
            self._sessions.clear()
            self._session_receivers.clear()
            for delivery in self._drain_channel():
                if delivery.completion is not None:
                    delivery.completion.fail(error)
            for delivery in list(self._deliveries):
                if delivery.completion is not None:
                    delivery.completion.fail(error)
            self._deliveries.clear()
            self._shutdown_receivers(error)
            self._settle_callers(lambda _: error)
            for participant in self._participants.values():
                try:
                    participant.begin_draining()
                except Exception as exc:  # noqa: BLE001 - recorded
                    self._errors.append(exc)
        finally:
            self._exclusive = False
        if self._idle_event is not None:
            self._idle_event.set()

    def _drain_channel(self) -> list[_Delivery]:
        deliveries: list[_Delivery] = []
        while True:
            try:
                item = self._recv.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                return deliveries
            if isinstance(item, _Delivery):
                deliveries.append(item)

    def _shutdown_receivers(self, error: BaseException | None) -> None:
        if self._receivers_shut_down:
            return
        self._receivers_shut_down = True
        for receiver in list(self._receivers.values()):
            try:
                receiver.shutdown(error)
            except Exception as exc:
                logger.exception("receiver cleanup failed")
                self._errors.append(PhronomyError(f"receiver cleanup failed: {exc!r}"))

    # --- shutdown --------------------------------------------------------------------

    async def shutdown(
        self,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - a drain deadline, not a wait bound
        cancel_grace: float | None = None,
    ) -> ShutdownResult:
        """Shut the engine down gracefully; idempotent (later calls return the first result).

        1. Stop admitting new executions; queued requests and continuations still run.
        2. Wait up to *timeout* for live work to finish.
        3. Stop the dispatcher (after the events already queued), then cut off what is
           still live: its callers get :class:`~phronomy.RuntimeShutdownError`, or
           :class:`~phronomy.RecoveryRequiredError` when a durable save was in flight.
        4. Close the offload pools, cancel queued operations and supervised tasks, and
           wait up to *cancel_grace* for worker threads to return (never killing them).

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
            raise ValueError("timeout and cancel_grace must be non-negative")
        with trio.CancelScope(shield=True):
            if not self._shutdown_started:
                self._shutdown_started = True
                try:
                    self._result = await self._graceful_shutdown(timeout, cancel_grace)
                except (
                    Exception
                ) as exc:  # a bug in a shutdown step: still end with a result
                    logger.exception("the graceful shutdown failed; stopping at once")
                    self._errors.append(exc)
                    await self._abort()
                finally:
                    self._shutdown_done.set()
            await self._shutdown_done.wait()
        result = self._result
        assert result is not None
        return result

    async def _graceful_shutdown(
        self,
        timeout: float | None,  # noqa: ASYNC109 - see shutdown()
        cancel_grace: float | None,
    ) -> ShutdownResult:
        drain_timeout = self._config.shutdown_timeout if timeout is None else timeout
        grace = (
            cancel_grace
            if cancel_grace is not None
            else (
                self._config.cancel_grace
                if self._config.cancel_grace is not None
                else drain_timeout
            )
        )
        drain_deadline = trio.current_time() + drain_timeout
        if self._state == "running":
            self._set_state("draining")
        for participant in self._participants.values():
            try:
                participant.begin_draining()
            except Exception as exc:  # noqa: BLE001 - recorded
                self._errors.append(exc)
        participants_idle = await self._wait_participants(drain_deadline)
        with trio.move_on_at(drain_deadline):
            await self._wait_idle()
        idle = self._quiescent()
        if self._state == "failed":
            status: DispatcherStatus = "failed"
        else:
            self._set_state("stopping")
            status = "terminated" if idle else "cancel_timeout"
        await self._stop_dispatcher(graceful=True)
        cut_off = self._teardown()
        stop_deadline = trio.current_time() + max(grace, _MIN_STOP_GRACE)
        with trio.move_on_at(stop_deadline):
            await self._flush_receivers()
        threads, tasks_left = await self._stop_resources(stop_deadline, wait=True)
        return self._finish(status, cut_off, threads, tasks_left, participants_idle)

    async def _wait_participants(self, deadline: float) -> bool:
        all_idle = True
        for participant in self._participants.values():
            ok = False
            with trio.move_on_at(deadline):
                try:
                    ok = bool(await participant.wait_until_idle())
                except Exception as exc:  # noqa: BLE001 - recorded, counts as not idle
                    self._errors.append(exc)
            all_idle = all_idle and ok
        return all_idle

    async def _wait_idle(self) -> None:
        """Wait until no live work is left: sessions, deliveries, receivers and pools."""
        while True:
            while not self._is_idle():
                if self._idle_event is None:
                    self._idle_event = trio.Event()
                await self._idle_event.wait()
            for pool in list(self._pools.values()):
                await pool.wait_idle()
            if self._is_idle():
                return

    def _quiescent(self) -> bool:
        return self._is_idle() and all(pool.idle for pool in self._pools.values())

    async def _stop_dispatcher(self, *, graceful: bool) -> None:
        if self._dispatcher_exited.is_set():
            return
        if graceful:
            self._enqueue(_STOP)
        else:
            self._dispatcher_scope.cancel(reason="phronomy runtime aborted")
        await self._dispatcher_exited.wait()

    def _teardown(self) -> tuple[str, ...]:
        """With the dispatcher stopped: cut off live work and shut receivers down."""
        self._exclusive = True
        cut: list[str] = []
        try:
            for receiver in self._receivers.values():
                try:
                    cut.extend(receiver.describe_live())
                except Exception:
                    logger.exception("describe_live failed")
            for sid, session in list(self._sessions.items()):
                waiter = self._waiters.pop(sid, None)
                try:
                    error = session.cut_off()
                except Exception as exc:  # noqa: BLE001 - the session's own failure
                    error = exc
                if sid not in self._session_receivers:
                    cut.append(
                        f"session {sid}"
                    )  # receivers describe their own sessions
                if waiter is not None:
                    waiter.fail(error)
            self._sessions.clear()
            self._session_receivers.clear()
            self._admitted.clear()
            for _, waiter in self._starting.values():
                waiter.fail(
                    RuntimeShutdownError(
                        "the runtime shut down before the session started"
                    )
                )
            self._starting.clear()
            pending = self._drain_channel() + list(self._deliveries)
            for delivery in pending:
                if delivery.completion is not None:
                    delivery.completion.fail(
                        RuntimeShutdownError(
                            "the runtime shut down before the request was processed"
                        )
                    )
            self._deliveries.clear()
            self._shutdown_receivers(None)
            self._settle_callers(
                lambda h: RuntimeShutdownError(
                    f"the runtime shut down before {h.name} finished"
                )
            )
        finally:
            self._exclusive = False
        return tuple(cut)

    def _settle_callers(
        self, error_for: Callable[[ResultHandle[Any]], BaseException]
    ) -> None:
        """Fail every caller's handle that is still pending (the last safety net)."""
        for handle in list(self._callers):  # settling discards it from the set
            handle.fail(error_for(handle))

    def _attempt(self, what: str, fn: Callable[..., object], *args: Any) -> None:
        """Run one shutdown step; a failure is recorded (cleanup incomplete), not raised."""
        try:
            fn(*args)
        except Exception as exc:
            logger.exception("%s failed during shutdown", what)
            exc.add_note(f"phronomy: raised while {what} during runtime shutdown")
            self._errors.append(exc)

    async def _flush_receivers(self) -> None:
        """Let receivers finish the writes they owe (the caller's scope bounds it)."""
        for receiver in list(self._receivers.values()):
            try:
                await receiver.flush()
            except Exception as exc:
                logger.exception("receiver flush failed")
                exc.add_note("phronomy: raised while flushing a receiver at shutdown")
                self._errors.append(exc)

    async def _stop_resources(self, deadline: float, *, wait: bool) -> tuple[int, int]:
        self._pools_closed = True
        cancelled = RuntimeShutdownError(
            "offloaded operation cancelled: the runtime shut down"
        )
        for pool in self._pools.values():
            self._attempt(f"closing offload pool {pool.name!r}", pool.close)
        for pool in self._pools.values():
            self._attempt(
                f"cancelling the queue of offload pool {pool.name!r}",
                pool.cancel_queued,
                cancelled,
            )
        for handle in list(self._tasks):
            self._attempt(
                f"cancelling supervised task {handle.name!r}",
                handle.cancel,
                RuntimeShutdownError("the runtime shut down before the task finished"),
            )
        self._attempt("shutting the timer queue down", self._timers.shutdown)
        if wait:
            with trio.move_on_at(deadline):
                for pool in self._pools.values():
                    await pool.wait_idle()
                while self._tasks:
                    await self._tasks_idle.park()
        threads = sum(pool.active_count for pool in self._pools.values())
        return threads, len(self._tasks)

    def _finish(
        self,
        status: DispatcherStatus,
        cut_off: tuple[str, ...],
        threads: int,
        tasks_left: int,
        participants_idle: bool,
    ) -> ShutdownResult:
        cleanup_complete = (
            participants_idle and not self._errors and threads == 0 and tasks_left == 0
        )
        if cleanup_complete:
            for participant in self._participants.values():
                finalize = getattr(participant, "after_runtime_shutdown", None)
                if finalize is None:
                    continue
                try:
                    finalize()
                except Exception as exc:  # noqa: BLE001 - recorded
                    self._errors.append(exc)
                    cleanup_complete = False
        error = self._failure or (self._errors[0] if self._errors else None)
        outcome: Literal["terminated", "failed"] = (
            "failed" if (self._failure is not None or self._errors) else "terminated"
        )
        self._set_state(outcome if cleanup_complete else "failed")
        if threads:
            logger.warning(
                "phronomy runtime closed with %d worker thread(s) still running; "
                "trio will wait for them before trio.run returns",
                threads,
            )
        return ShutdownResult(
            outcome=outcome,
            cleanup_complete=cleanup_complete,
            dispatcher_status=status,
            error=error,
            cut_off=cut_off,
            threads_running=threads,
        )

    async def _abort(self) -> None:
        """The runtime block raised: stop at once, cut everything off, don't wait."""
        if self._result is not None:
            return
        self._shutdown_started = True
        if self._state in _ACCEPTING_EVENTS:
            self._set_state("stopping")
        status: DispatcherStatus = (
            "failed"
            if self._failure is not None
            else ("terminated" if self._quiescent() else "cancel_timeout")
        )
        await self._stop_dispatcher(graceful=False)
        cut_off = self._teardown()
        threads, _ = await self._stop_resources(0.0, wait=False)
        self._result = self._finish(status, cut_off, threads, 0, participants_idle=True)
        self._shutdown_done.set()


@asynccontextmanager
async def open_engine(
    *,
    pool_size: int = 10,
    queue_size: int = 100,
    shutdown_timeout: float = 5.0,
    cancel_grace: float | None = None,
    backlog_threshold: int = 1000,
    backlog_interval: float = 60.0,
    starvation_threshold: float | None = None,
    dispatch_threshold: float | None = None,
) -> AsyncGenerator[Engine]:
    """Run an engine for the duration of the ``async with`` block.

    On a normal exit the engine shuts down gracefully (:meth:`~phronomy.Engine.shutdown`). If the
    body raises (or is cancelled), the engine stops at once: live work is cut off, its
    callers get :class:`~phronomy.RuntimeShutdownError`, queued offloaded operations
    are cancelled, and the body's exception propagates unchanged (never wrapped in an
    exception group).

    Args:
        pool_size: worker threads of the default offload pool.
        queue_size: queued operations of the default offload pool.
        shutdown_timeout: seconds a graceful shutdown waits for live work.
        cancel_grace: seconds shutdown waits for worker threads.
        backlog_threshold: queue depth that triggers a backlog warning.
        backlog_interval: minimum seconds between backlog warnings.
        starvation_threshold: optional queue-lag warning threshold in seconds.
        dispatch_threshold: optional long-dispatch warning threshold in seconds.

    Yields:
        The running :class:`Engine`.

    Raises:
        ConfigurationError: invalid settings.
        PhronomyInternalError: an internal task failed (a bug; please report it).
    """
    config = EngineConfig(
        pool_size=pool_size,
        queue_size=queue_size,
        shutdown_timeout=shutdown_timeout,
        cancel_grace=cancel_grace,
        backlog_threshold=backlog_threshold,
        backlog_interval=backlog_interval,
        starvation_threshold=starvation_threshold,
        dispatch_threshold=dispatch_threshold,
    )
    body_error: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            engine = Engine(config, nursery)
            await nursery.start(engine._dispatch_main)  # noqa: SLF001 - own factory
            try:
                yield engine
            except BaseException as exc:  # noqa: BLE001, ASYNC103 - re-raised after the nursery
                body_error = exc
                with trio.CancelScope(shield=True):
                    await engine._abort()  # noqa: SLF001 - own factory
            else:
                await engine.shutdown()
            nursery.cancel_scope.cancel(reason="phronomy runtime closed")
    except BaseExceptionGroup as group:
        _raise_keeping_context(_unwrap(group, body_error))
    if body_error is not None:
        _raise_keeping_context(body_error)


def _raise_keeping_context(error: BaseException) -> NoReturn:
    """Raise *error* as it is: its cause and context stay what they were.

    ``raise error from None`` would wipe the cause (and hide the context); a plain
    ``raise`` here would chain the nursery's exception group as its context.
    """
    context, cause = error.__context__, error.__cause__
    suppress = error.__suppress_context__
    try:
        raise error
    finally:
        error.__context__, error.__cause__ = context, cause
        error.__suppress_context__ = suppress
        del error, context, cause


def _unwrap(
    group: BaseExceptionGroup[BaseException], body_error: BaseException | None
) -> BaseException:
    """Pick what to raise for an exception group escaping the engine's nursery."""
    interrupts, _ = group.split((KeyboardInterrupt, SystemExit))
    if interrupts is not None:
        return interrupts.exceptions[0]
    _, rest = group.split(trio.Cancelled)
    if rest is None:
        # Only cancellations: the body's error (or the cancellation itself) is the story.
        return body_error if body_error is not None else group.exceptions[0]
    error = PhronomyInternalError(
        "an internal phronomy task failed; please report this bug"
    )
    error.__cause__ = rest
    return error
