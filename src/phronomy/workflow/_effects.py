"""Carrying out effect intents: supervised tasks, offloaded calls and timers of a segment."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, final

import trio

from ._intents import CancelTimer, Offload, Schedule, StartSoon

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from phronomy.engine import Host, ResultHandle, Timer

    from ._intents import Intent

__all__ = ["CANCEL_READY", "EFFECT_FAILED", "EffectRunner", "PendingTimer"]

logger = logging.getLogger(__name__)

EFFECT_FAILED = "__phronomy.effect_failed__"
"""Internal event: an effect without ``on_error`` failed; the segment fails with it."""

CANCEL_READY = "__phronomy.cancel_ready__"
"""Internal event: a cancelled segment's effects have all physically finished."""


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
        "_handles",
        "_host",
        "_instance",
        "_on_quiescent",
        "_post",
        "_running",
        "_timers",
        "touched",
    )

    def __init__(
        self, host: Host, post: Callable[[str, Any], bool], *, instance: str
    ) -> None:
        """Bind the runner to the segment's *post* (its event sink)."""
        self._host = host
        self._post = post
        self._instance = instance
        self._handles: set[ResultHandle[Any]] = set()
        self._running: set[ResultHandle[Any]] = set()  # not physically finished
        self._timers: dict[object, tuple[Timer, Schedule]] = {}  # key (or serial)
        self.touched: set[str] = set()
        """Keys of timers scheduled or cancelled in this segment: a timer an
        earlier save stored under one of them is replaced (or cancelled)."""
        self._closed = False
        self._on_quiescent: Callable[[], object] | None = None

    @property
    def pending(self) -> int:
        """Effects started and not delivered yet."""
        return len(self._handles) + len(self._timers)

    def launch(self, intents: Iterable[Intent]) -> None:
        """Start *intents* in order.

        Raises:
            BackpressureError: an offload pool's queue is full (the segment fails).
            RuntimeShutdownError: the runtime is closing.
        """
        for intent in intents:
            match intent:
                case StartSoon():
                    handle = self._host.start_task(intent.fn, *intent.args)
                    self._watch(handle, intent.on_done, intent.on_error)
                case Offload():
                    pool = intent.pool or self._host.default_pool
                    handle = pool.submit_nowait(intent.fn, *intent.args)
                    self._watch(handle, intent.on_done, intent.on_error)
                case Schedule():
                    self._schedule(intent)
                case CancelTimer(key=key):
                    self.touched.add(key)
                    cancelled = self._timers.pop(key, None)
                    if cancelled is not None:
                        cancelled[0].cancel()

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
            self.touched.add(intent.key)
            replaced = self._timers.pop(intent.key, None)
            if replaced is not None:
                replaced[0].cancel()

        def fire() -> None:
            self._timers.pop(name, None)
            self._deliver(intent.event, intent.payload)

        timer = self._host.timers.schedule(intent.seconds, fire)
        self._timers[name] = (timer, intent)

    def _watch(
        self, handle: ResultHandle[Any], on_done: str, on_error: str | None
    ) -> None:
        self._handles.add(handle)
        self._running.add(handle)
        handle.on_physical_complete(self._physically_finished)

        def settled(done: ResultHandle[Any]) -> None:
            self._handles.discard(done)
            if done.status == "cancelled" and self._closed:
                return
            if done.status == "completed":
                self._deliver(on_done, done.result_nowait())
            else:
                self._deliver(on_error or EFFECT_FAILED, done.error)

        handle.on_complete(settled)

    def _physically_finished(self, handle: ResultHandle[Any]) -> None:
        self._running.discard(handle)
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
