"""Values the engine exchanges: events, deliveries, management messages, statistics."""

from __future__ import annotations

from collections.abc import Callable  # msgspec reads the annotations at run time
from typing import Any, ClassVar, Literal, final

import msgspec

from ._handle import ResultHandle

__all__ = [
    "Continuation",
    "DispatcherStatus",
    "EngineStatistics",
    "Event",
    "LifecycleState",
    "PoolStatistics",
    "SessionEnded",
    "SessionOutcome",
    "SessionStart",
    "ShutdownResult",
]

LifecycleState = Literal["running", "draining", "stopping", "terminated", "failed"]
DispatcherStatus = Literal["not_started", "terminated", "failed", "cancel_timeout"]


@final
class Event(msgspec.Struct, frozen=True, kw_only=True):
    """An event for a live session, delivered by the dispatcher in FIFO order.

    Attributes:
        type: the event name.
        target_id: the session's id.
        payload: any application value, passed unchanged.
        caller: the handle of a caller waiting to learn what happened to the event:
            the session settles it; the engine completes it with ``None`` when no live
            session took the event, and fails it when the runtime shuts down first.
    """

    type: str
    target_id: str
    payload: Any = None
    caller: ResultHandle[Any] | None = None


SessionOutcome = Literal["finished", "halted", "cancelled", "error", "retired"]
"""How a session ended: ``retired`` means its terminal outcome is unknown."""


@final
class Continuation(msgspec.Struct, frozen=True, kw_only=True, eq=False):
    """Management: run *call* on the dispatcher, in FIFO order (see
    :meth:`Engine.call_soon <phronomy.lowlevel.Engine.call_soon>`); one queued when
    the engine stopped runs at its teardown."""

    target_id: ClassVar[str] = ""  # never a session's id: the dispatcher routes it

    call: Callable[[], object]


@final
class SessionStart(msgspec.Struct, frozen=True, kw_only=True):
    """Management: start the registered session *session_id* (in FIFO order)."""

    target_id: ClassVar[str] = ""  # never a session's id: the dispatcher routes it

    session_id: str


@final
class SessionEnded(msgspec.Struct, frozen=True, kw_only=True):
    """Management: a session ended; its waiter settles (or its owner takes over).

    Attributes:
        session_id: the session.
        outcome: how it ended.
        result: its result (``finished``, ``halted``).
        error: the error (``error``), or why the outcome is unknown (``retired``).
    """

    target_id: ClassVar[str] = ""  # never a session's id: the dispatcher routes it

    session_id: str
    outcome: SessionOutcome
    result: Any = None
    error: BaseException | None = None


@final
class PoolStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot of one offload pool.

    Attributes:
        name: the pool's name.
        pool_size: worker threads it may run at once.
        queue_size: operations it admits beyond the running ones.
        active_count: worker threads running now (abandoned ones included).
        queue_depth: admitted operations not started yet.
        submitted_total: operations admitted since creation.
        completed_total: operations whose worker returned.
        abandoned_total: operations whose caller gave up (timeout/cancel) after start.
        abandoned_active_count: abandoned operations whose worker still runs.
        average_wait_seconds: mean time from submission to start.
        closed: whether the pool refuses new submissions.
    """

    name: str
    pool_size: int
    queue_size: int
    active_count: int
    queue_depth: int
    submitted_total: int
    completed_total: int
    abandoned_total: int
    abandoned_active_count: int
    average_wait_seconds: float
    closed: bool


@final
class EngineStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot of the engine, from :meth:`~phronomy.lowlevel.Engine.statistics`.

    Attributes:
        state: lifecycle state.
        queue_depth: events posted and not dispatched yet.
        max_queue_depth: the largest depth seen.
        dispatched_total: events dispatched.
        dropped_total: events dropped because their target session was unknown.
        last_lag_seconds: queue lag of the last dispatched event.
        max_lag_seconds: the largest queue lag seen.
        average_lag_seconds: mean queue lag.
        sessions: registered sessions not finished yet.
        pending_deliveries: receiver deliveries queued or dispatching.
        timers_pending: scheduled timers.
        supervised_tasks: supervised trio tasks still running.
        pools: one entry per offload pool.
    """

    state: LifecycleState
    queue_depth: int
    max_queue_depth: int
    dispatched_total: int
    dropped_total: int
    last_lag_seconds: float
    max_lag_seconds: float
    average_lag_seconds: float
    sessions: int
    pending_deliveries: int
    timers_pending: int
    supervised_tasks: int
    pools: tuple[PoolStatistics, ...]


@final
class ShutdownResult(msgspec.Struct, frozen=True, kw_only=True):
    """How a runtime shut down.

    Attributes:
        outcome: ``"terminated"``, or ``"failed"`` when the dispatcher, a receiver, a
            participant or a pool failed.
        cleanup_complete: every worker thread and supervised task had finished and
            every receiver and participant shut down cleanly.
        dispatcher_status: ``"not_started"``, ``"terminated"``, ``"failed"``, or
            ``"cancel_timeout"`` when live work had to be cut off at the deadline.
        error: the first failure recorded, if any.
        cut_off: live work that was cut off at the deadline (its callers got
            :class:`~phronomy.RuntimeShutdownError` or, for uncertain saves,
            :class:`~phronomy.RecoveryRequiredError`).
        threads_running: offloaded worker threads still running when the result was
            made (each makes cleanup incomplete).
    """

    outcome: Literal["terminated", "failed"]
    cleanup_complete: bool
    dispatcher_status: DispatcherStatus
    error: BaseException | None = None
    cut_off: tuple[str, ...] = ()
    threads_running: int = 0

    @property
    def clean(self) -> bool:
        """Terminated, cleanup complete, nothing cut off."""
        return (
            self.outcome == "terminated"
            and self.cleanup_complete
            and self.dispatcher_status in ("not_started", "terminated")
            and not self.cut_off
        )
