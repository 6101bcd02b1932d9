"""Effects as intents: what an action asks to start, recorded without doing any I/O.

The machine hands actions an :class:`Effects`; it only records requests. The session
starts them once the transition's callbacks have all returned, so an action that
raises after a request starts nothing.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any, final

import msgspec

from phronomy.errors import InstanceStateError, InvalidInputError
from phronomy.storage import MAX_DELAY_MS

from ._retries import RetryPolicy

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

__all__ = ["CancelTimer", "Effects", "Intent", "Offload", "Schedule", "StartSoon"]


@final
class StartSoon(msgspec.Struct, frozen=True, kw_only=True):
    """Run ``await fn(*args)`` as a supervised trio task owned by the segment."""

    fn: Any
    args: tuple[Any, ...]
    on_done: str
    on_error: str | None
    retry: RetryPolicy | None = None


@final
class Offload(msgspec.Struct, frozen=True, kw_only=True):
    """Run blocking ``fn(*args)`` in a worker thread (*pool*, or the default pool)."""

    fn: Any
    args: tuple[Any, ...]
    on_done: str
    on_error: str | None
    pool: Any = None
    retry: RetryPolicy | None = None


@final
class Schedule(msgspec.Struct, frozen=True, kw_only=True):
    """Post *event* with *payload* to the instance after *seconds* (a timer named
    *key*: scheduling the key again replaces it)."""

    seconds: float
    event: str
    payload: Any = None
    key: str | None = None


@final
class CancelTimer(msgspec.Struct, frozen=True, kw_only=True):
    """Cancel the timer named *key* (live, or stored by an earlier save)."""

    key: str


Intent = StartSoon | Offload | Schedule | CancelTimer
"""One effect an action asked for."""


@final
class Effects:
    """Start work from an action and get its result back as an event.

    An action that takes a third argument receives the segment's ``Effects``::

        def start_payment(state, event, effects):
            effects.offload(charge_card, state.card, on_done="charged", on_error="declined")

    Requests take effect once the transition's callbacks have all returned (an action
    that raises after a request starts nothing). The work is owned by the segment:
    when the segment ends (halted, finished, failed or cut off at shutdown), trio work
    is cancelled and pending timers are dropped; offloaded threads cannot be
    interrupted, so their results are discarded and never reach a later segment of the
    same instance. Shutdown still waits for those threads physically.

    Effects can only be requested while the action that received them runs.
    """

    __slots__ = ("_events", "_open", "_requested", "_workflow")

    def __init__(self, *, workflow: str, events: frozenset[str]) -> None:
        """Create a closed recorder (the machine opens it around callbacks).

        Args:
            workflow: the workflow's name (for messages).
            events: the event names the workflow declares.
        """
        self._workflow = workflow
        self._events = events
        self._requested: list[Intent] | None = None  # a list once one comes
        self._open = False

    def start_soon(
        self,
        fn: Callable[..., Awaitable[Any]],
        *args: Any,
        on_done: str,
        on_error: str | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        """Run ``await fn(*args)`` as a supervised trio task.

        Args:
            fn: an async function (keyword arguments through ``functools.partial``).
            *args: its positional arguments.
            on_done: the event posted with the return value as payload.
            on_error: the event posted with the exception as payload (after the
                last attempt); without it, a failure fails the segment.
            retry: try it again when it fails (default: the runtime's
                ``open_runtime(retry=...)``, else once). A durable instance's retried
                effect must be a module-level function with JSON arguments: its next
                attempt may run in another process.

        Raises:
            InstanceStateError: called outside the action that received the effects.
            InvalidInputError: *fn* is not callable, an event name is not one the
                workflow declares, or *retry* is not a RetryPolicy.
        """
        self._record(
            StartSoon(
                fn=_callable(fn),
                args=args,
                on_done=self._event(on_done),
                on_error=self._optional_event(on_error),
                retry=_policy(retry, threads=False),
            )
        )

    def offload(
        self,
        fn: Callable[..., Any],
        *args: Any,
        on_done: str,
        on_error: str | None = None,
        pool: Any = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        """Run blocking ``fn(*args)`` in a worker thread (the default pool unless *pool*).

        A full pool fails the segment with :class:`~phronomy.BackpressureError`.
        *retry* tries it again when it fails (as for :meth:`start_soon`; a policy
        with ``timeout_per_attempt`` is refused: a thread cannot be stopped).

        Raises:
            InstanceStateError: called outside the action that received the effects.
            InvalidInputError: *fn* is not callable, an event name is not one the
                workflow declares, or *retry* is not a RetryPolicy (or has a
                timeout per attempt).
        """
        self._record(
            Offload(
                fn=_callable(fn),
                args=args,
                on_done=self._event(on_done),
                on_error=self._optional_event(on_error),
                pool=pool,
                retry=_policy(retry, threads=True),
            )
        )

    def schedule(
        self,
        delay: float | timedelta,
        event: str,
        payload: Any = None,
        *,
        key: str | None = None,
    ) -> None:
        """Post *event* (with *payload*) to this instance after *delay*.

        In a segment that is still running, the timer runs in it. When a durable
        instance halts (a wait state), its timers still pending are stored with the
        save that halts it: they survive restarts and fire into the instance
        wherever it is held then (they are dropped when it finishes or is
        cancelled). An in-memory instance drops them when its segment ends.

        Args:
            delay: seconds, or a :class:`~datetime.timedelta`.
            event: an event the workflow declares.
            payload: the event's payload (stored as JSON once durable).
            key: names the timer: scheduling the same key again replaces it, and
                :meth:`cancel_timer` cancels it.

        Raises:
            InstanceStateError: called outside the action that received the effects.
            InvalidInputError: a negative, non-numeric or longer than 100 years
                delay, an event name the workflow does not declare, or a key that
                is not a non-empty string.
        """
        seconds: object = (
            delay.total_seconds() if isinstance(delay, timedelta) else delay
        )  # checked at run time: callers are not type-checked
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, (int, float))
            or not 0 <= seconds <= MAX_DELAY_MS / 1000
        ):
            raise InvalidInputError(
                "effects.schedule() needs a delay from 0 seconds to 100 years, not "
                f"{delay!r}"
            )
        self._record(
            Schedule(
                seconds=float(seconds),
                event=self._event(event),
                payload=payload,
                key=None if key is None else _key(key),
            )
        )

    def cancel_timer(self, key: str) -> None:
        """Cancel the timer scheduled with *key* (:meth:`schedule`), whether it runs
        in this segment or was stored by an earlier save; a timer that has fired but
        was not applied yet is not applied. Unknown keys are ignored.

        Raises:
            InstanceStateError: called outside the action that received the effects.
            InvalidInputError: *key* is not a non-empty string.
        """
        self._record(CancelTimer(key=_key(key)))

    # --- the machine's side -------------------------------------------------------------

    def open(self) -> None:
        """Accept requests (the machine calls this before running callbacks).

        :meta private:
        """
        self._open = True

    def take(self) -> tuple[Intent, ...]:
        """Close the recorder and return what was requested since it opened.

        :meta private:
        """
        self._open = False
        requested, self._requested = self._requested, None
        return () if requested is None else tuple(requested)

    def discard(self) -> None:
        """Close the recorder and forget the requests (a callback raised).

        :meta private:
        """
        self._open = False
        self._requested = None

    def _event(self, name: Any) -> str:
        if not isinstance(name, str) or name not in self._events:
            raise InvalidInputError(
                f"workflow {self._workflow!r} declares no event {name!r} for an effect "
                f"to post (it declares {sorted(self._events)})"
            )
        return name

    def _optional_event(self, name: Any) -> str | None:
        return None if name is None else self._event(name)

    def _record(self, intent: Intent) -> None:
        if not self._open:
            raise InstanceStateError(
                "effects can only be requested while the action that received them "
                "runs; start the work from an action instead"
            )
        if self._requested is None:
            self._requested = [intent]
        else:
            self._requested.append(intent)


def _policy(retry: object, *, threads: bool) -> RetryPolicy | None:
    if retry is None:
        return None
    if not isinstance(retry, RetryPolicy):
        raise InvalidInputError(f"retry must be a RetryPolicy, got {retry!r}")
    if threads and retry.timeout_per_attempt is not None:
        raise InvalidInputError(
            "offload() cannot bound an attempt's time (a thread cannot be stopped): "
            "drop timeout_per_attempt, or run the work with start_soon()"
        )
    return retry


def _key(key: object) -> str:
    if not isinstance(key, str) or not key or len(key) > 200 or "@" in key:
        raise InvalidInputError(
            "a timer key must be a non-empty string of at most 200 characters, "
            f"without '@', not {key!r}"
        )
    return key


def _callable(fn: Any) -> Any:
    if not callable(fn):
        raise InvalidInputError(f"effects need a callable, not {type(fn).__name__}")
    return fn
