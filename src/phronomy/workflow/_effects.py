"""Carrying out effect intents: supervised tasks, offloaded calls and timers of a segment."""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any, final

import msgspec
import trio

from phronomy.errors import InvalidInputError

from ._intents import CancelTimer, Offload, Schedule, StartSoon
from ._retries import (
    MAX_ERRORS,
    RetryPolicy,
    StoredEffect,
    describe_error,
    effect_ref,
    load_ref,
    retry_delay,
    retryable,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from phronomy._telemetry import SegmentTrace
    from phronomy.engine import Host, ResultHandle, Timer

    from ._intents import Intent

__all__ = [
    "CANCEL_READY",
    "EFFECT_FAILED",
    "RETRY_WAIT",
    "EffectRunner",
    "PendingTimer",
    "RetryWait",
]

logger = logging.getLogger(__name__)

EFFECT_FAILED = "__phronomy.effect_failed__"
"""Internal event: an effect without ``on_error`` failed; the segment fails with it."""

CANCEL_READY = "__phronomy.cancel_ready__"
"""Internal event: a cancelled segment's effects have all physically finished."""

RETRY_WAIT = "__phronomy.retry_wait__"
"""Internal event: a durable segment's only running effect failed and is tried again
later (its payload, a :class:`RetryWait`): the segment halts until then."""


@final
class RetryWait(msgspec.Struct, frozen=True, kw_only=True):
    """The next attempt of a retried effect, and how long before it runs."""

    effect: StoredEffect
    delay: float

    def stored(self) -> tuple[bytes, float]:
        """The retry timer's payload (JSON) and its delay."""
        return msgspec.json.encode(self.effect), self.delay


Effect = StartSoon | Offload

PendingTimer = tuple[str | None, Schedule, float]
"""A timer of the segment still pending: its key, what it posts, seconds left."""


@final
class EffectRunner:
    """Starts a segment's effects and turns their results into events for it.

    The work is owned by the segment: :meth:`close` (the segment ended) cancels trio
    work and timers; offloaded threads cannot be interrupted, so their late results
    are dropped (with a debug log) and never reach a later segment of the instance.
    """

    __slots__ = (
        "_closed",
        "_default_retry",
        "_durable",
        "_handles",
        "_host",
        "_instance",
        "_on_quiescent",
        "_post",
        "_retrying",
        "_running",
        "_timeout_visit",
        "_timeouts",
        "_timers",
        "touched",
        "trace",
    )

    def __init__(
        self,
        host: Host,
        post: Callable[[str, Any], bool],
        *,
        instance: str,
        durable: bool = False,
        default_retry: RetryPolicy | None = None,
    ) -> None:
        """Bind the runner to the segment's *post* (its event sink); a *durable*
        segment's retried effects wait between attempts halted (see
        :data:`RETRY_WAIT`)."""
        self._host = host
        self._post = post
        self._instance = instance
        self._durable = durable
        self._default_retry = default_retry
        self._retrying: dict[object, Timer] = {}  # waits between attempts, here
        self._timeouts: dict[int, Timer] = {}  # ms -> of the visit it waits in
        self._timeout_visit: int | None = -1
        # Ordered sets as dicts (an empty dict is a third of an empty set's size, and
        # a live segment holds these for as long as it waits).
        self._handles: dict[ResultHandle[Any], None] = {}
        self._running: dict[ResultHandle[Any], None] = {}  # not physically finished
        self._timers: dict[object, tuple[Timer, Schedule]] = {}  # key (or serial)
        self.touched: dict[str, None] = {}
        """Keys of timers scheduled or cancelled in this segment: a timer an
        earlier save stored under one of them is replaced (or cancelled)."""
        self._closed = False
        self._on_quiescent: Callable[[], object] | None = None
        self.trace: SegmentTrace | None = None  # the segment's span (telemetry on)

    @property
    def timing(self) -> bool:
        """Whether timeouts of a visit run (else a visit without any changes nothing)."""
        return bool(self._timeouts)

    @property
    def pending(self) -> int:
        """Effects started and not delivered yet."""
        return len(self._handles) + len(self._timers) + len(self._retrying)

    def launch(self, intents: Iterable[Intent]) -> None:
        """Start *intents* in order.

        Raises:
            BackpressureError: an offload pool's queue is full (the segment fails).
            RuntimeShutdownError: the runtime is closing.
        """
        for intent in intents:
            match intent:
                case StartSoon() | Offload():
                    policy = intent.retry or self._default_retry
                    storable = False  # its next attempt may run in another process
                    if policy is not None and policy.max_attempts > 1 and self._durable:
                        try:
                            _check_storable(intent)
                            storable = True
                        except InvalidInputError:
                            if intent.retry is not None:  # asked for by the effect
                                raise
                    self._attempt(intent, policy, 1, (), storable=storable)
                case Schedule():
                    self._schedule(intent)
                case CancelTimer(key=key):
                    self.touched[key] = None
                    cancelled = self._timers.pop(key, None)
                    if cancelled is not None:
                        cancelled[0].cancel()

    def run_timeouts(
        self,
        visit: int | None,
        delays: tuple[int, ...] = (),
        event: Callable[[int], str] = str,
    ) -> None:
        """Run the timeouts (*delays*, ms; each posts ``event(ms)`` with *visit* as
        its payload) of the state the segment waits in, entered as *visit*: those of
        the visit it left are cancelled (``None``: the segment ended). The same
        visit again keeps them running."""
        if visit == self._timeout_visit:
            return
        for timer in self._timeouts.values():
            timer.cancel()
        self._timeouts.clear()
        self._timeout_visit = visit
        if visit is None:
            return
        for ms in delays:
            self._timeouts[ms] = self._host.timers.schedule(
                ms / 1000, functools.partial(self._post, event(ms), visit)
            )

    def timeouts_left(self, visit: int) -> dict[int, float] | None:
        """The seconds the timeouts of *visit* have left (``None``: none run)."""
        if not self._timeouts or visit != self._timeout_visit:
            return None
        now = trio.current_time()
        return {ms: max(t.when - now, 0.0) for ms, t in self._timeouts.items()}

    def relaunch(self, stored: StoredEffect) -> None:
        """Run the next attempt of an effect an earlier segment stored with its retry
        timer (in this process or another).

        Raises:
            InvalidInputError: its function or an error type cannot be imported.
        """
        policy = stored.restore_policy()
        fields = {
            "fn": load_ref(stored.fn),
            "args": tuple(stored.args),
            "on_done": stored.on_done,
            "on_error": stored.on_error,
            "retry": policy,
        }
        intent: Effect = (
            StartSoon(**fields) if stored.kind == "start_soon" else Offload(**fields)
        )
        self._attempt(
            intent, policy, stored.attempt, tuple(stored.errors), storable=True
        )

    def when_quiescent(self, callback: Callable[[], object]) -> None:
        """Call *callback* once every effect started has physically finished (at once
        when none runs); trio work is cancelled first (:meth:`close`), threads are
        waited for, never abandoned."""
        self.close()
        if self._running:
            self._on_quiescent = callback
        else:
            callback()

    def close(self) -> None:
        """The segment ended: cancel trio work and timers; late results are dropped."""
        self._closed = True
        for handle in list(self._handles):
            handle.cancel()
        for timer, _ in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for timer in self._retrying.values():
            timer.cancel()
        self._retrying.clear()

    def pending_timers(self) -> list[PendingTimer]:
        """The segment's timers still pending, soonest first."""
        now = trio.current_time()
        return sorted(
            (
                (key if isinstance(key, str) else None, intent, max(t.when - now, 0.0))
                for key, (t, intent) in self._timers.items()
            ),
            key=lambda pending: pending[2],
        )

    def _schedule(self, intent: Schedule) -> None:
        name: object = intent.key if intent.key is not None else object()
        if intent.key is not None:
            self.touched[intent.key] = None
            replaced = self._timers.pop(intent.key, None)
            if replaced is not None:
                replaced[0].cancel()

        def fire() -> None:
            self._timers.pop(name, None)
            self._deliver(intent.event, intent.payload)

        timer = self._host.timers.schedule(intent.seconds, fire)
        self._timers[name] = (timer, intent)

    def _attempt(
        self,
        intent: Effect,
        policy: RetryPolicy | None,
        attempt: int,
        errors: tuple[str, ...],
        *,
        storable: bool,
    ) -> None:
        """Start attempt *attempt* of *intent* (*errors*: of the earlier ones); a
        *storable* one waits between attempts halted, when it can."""
        span = None if self.trace is None else self.trace.effect(intent.fn, attempt)
        fn = intent.fn
        if isinstance(intent, StartSoon):
            fn = fn if span is None else span.wrap_async(fn)
            if policy is not None and policy.timeout_per_attempt is not None:
                fn = functools.partial(_bounded, fn, policy.timeout_per_attempt)
            handle = self._host.start_task(fn, *intent.args)
        else:
            pool = intent.pool or self._host.default_pool
            fn = fn if span is None else span.wrap(fn)
            handle = pool.submit_nowait(fn, *intent.args)
        self._handles[handle] = None
        self._running[handle] = None
        handle.on_physical_complete(self._physically_finished)

        def settled(done: ResultHandle[Any]) -> None:
            self._handles.pop(done, None)
            if span is not None:
                span.settled(done)
            if done.status == "cancelled" and self._closed:
                return
            if done.status == "completed":
                self._deliver(intent.on_done, done.result_nowait())
                return
            error = done.error
            if policy is not None and error is not None:
                if retryable(policy, error, attempt):
                    kept = (*errors, describe_error(error))[-MAX_ERRORS:]
                    delay = retry_delay(policy, attempt)
                    self._retry(intent, policy, attempt + 1, kept, delay, storable)
                    return
                logger.info(
                    "effect %s of workflow instance %r failed at attempt %d of %d: %r",
                    getattr(intent.fn, "__qualname__", intent.fn),
                    self._instance,
                    attempt,
                    policy.max_attempts,
                    error,
                )
            self._deliver(intent.on_error or EFFECT_FAILED, error)

        handle.on_complete(settled)

    def _retry(
        self,
        intent: Effect,
        policy: RetryPolicy,
        attempt: int,
        errors: tuple[str, ...],
        delay: float,
        storable: bool,
    ) -> None:
        """Run attempt *attempt* after *delay*: halted, when the segment is durable,
        this is its only running work and it can be stored (a runtime-wide policy's
        effect that cannot waits here); else here, on a timer."""
        if self._closed:
            return
        if storable and self._durable and not self._handles and not self._retrying:
            stored = _stored(intent, policy, attempt, errors)
            self._deliver(RETRY_WAIT, RetryWait(effect=stored, delay=delay))
            return
        key = object()

        def again() -> None:
            self._retrying.pop(key, None)
            if self._closed:
                return
            try:
                self._attempt(intent, policy, attempt, errors, storable=storable)
            except Exception as exc:  # noqa: BLE001 - the pool refused: the effect failed
                self._deliver(intent.on_error or EFFECT_FAILED, exc)

        self._retrying[key] = self._host.timers.schedule(delay, again)

    def _physically_finished(self, handle: ResultHandle[Any]) -> None:
        self._running.pop(handle, None)
        callback = self._on_quiescent
        if callback is not None and not self._running:
            self._on_quiescent = None
            callback()

    def _deliver(self, event: str, payload: Any) -> None:
        if self._closed or not self._post(event, payload):
            logger.debug(
                "dropping late effect result %r for workflow instance %r: its segment "
                "ended",
                event,
                self._instance,
            )


async def _bounded(fn: Callable[..., Any], seconds: float, *args: Any) -> Any:
    """``await fn(*args)``, cancelled after *seconds* (then it raises TooSlowError)."""
    with trio.fail_after(seconds):
        return await fn(*args)


def _check_storable(intent: Effect) -> None:
    """A durable instance's retried effect must be runnable by another process.

    Raises:
        InvalidInputError: not a module-level function, arguments that are not JSON,
            or a pool of its own.
    """
    effect_ref(intent.fn)
    if isinstance(intent, Offload) and intent.pool is not None:
        raise InvalidInputError(
            "a retried effect of a durable instance runs in the default pool (its next "
            "attempt may run in another process): drop pool="
        )
    args = list(intent.args)
    try:
        same = msgspec.json.decode(msgspec.json.encode(args)) == args
    except (TypeError, msgspec.EncodeError):
        same = False
    if not same:
        raise InvalidInputError(
            "a retried effect of a durable instance needs JSON arguments (text, "
            "numbers, booleans, None, lists, dicts with text keys: its next attempt "
            f"may run in another process), got {intent.args!r}"
        )


def _stored(
    intent: Effect, policy: RetryPolicy, attempt: int, errors: tuple[str, ...]
) -> StoredEffect:
    numbers = msgspec.structs.asdict(policy)
    numbers.pop("non_retryable")
    return StoredEffect(
        kind="start_soon" if isinstance(intent, StartSoon) else "offload",
        fn=effect_ref(intent.fn),
        args=list(intent.args),
        on_done=intent.on_done,
        on_error=intent.on_error,
        attempt=attempt,
        errors=list(errors),
        policy=numbers,
        non_retryable=[effect_ref(kind) for kind in policy.non_retryable],
    )
