"""The spans of one running segment: its transitions, inbox entries and effect
attempts (see :mod:`phronomy._telemetry`)."""

from __future__ import annotations

import contextlib
import functools
import time
from typing import TYPE_CHECKING, Any, final

from phronomy.storage import fired_timer

from ._telemetry_names import NS, REVISION, STATE, STATUS, WORKFLOW

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from opentelemetry.trace import Span

__all__ = ["EffectSpan", "SegmentTrace"]


@final
class SegmentTrace:
    """The span of one running segment and its children (on the dispatcher)."""

    __slots__ = (
        "_off",
        "_parent",
        "_pending",
        "_resumed",
        "_start",
        "_telemetry",
        "_workflow",
        "span",
        "traceparent",
    )

    def __init__(self, telemetry: Any, span: Span, workflow: str, start: int) -> None:
        """Wrap *span* (started at *start*, wall-clock ns)."""
        self._telemetry = telemetry
        self.span = span
        self._workflow = workflow
        self._start = start
        self._parent = span  # the span children start in (an inbox entry's, or this)
        self._pending: tuple[str, str, int] = ("", "", 0)
        self._resumed: Span | None = None  # the entry a resume applies (its span)
        self._off = not span.is_recording()  # not sampled: no children (metrics only)
        self.traceparent = telemetry.traceparent(span)
        """What the segment's terminal save stores with the snapshot."""

    def child(
        self,
        name: str,
        attributes: dict[str, Any],
        start: int | None = None,
        parent: Span | None = None,
    ) -> Span:
        """Start a child span of the segment, or of *parent* (the caller ends it)."""
        telemetry = self._telemetry
        span: Span = telemetry.tracer.start_span(
            name,
            context=telemetry._trace.set_span_in_context(parent or self._parent),  # noqa: SLF001
            attributes=attributes,
            start_time=start,
        )
        return span

    def before(self, event: str, source: str) -> None:
        """The machine is about to handle *event* in state *source*."""
        if self._off:
            return
        self._pending = (event, source, time.time_ns())

    def resuming(self, event: str, source: str, feed: Any) -> None:
        """The segment resumes with *event* at *source*: the inbox entry it applies
        (*feed*'s current one, if any) gets its span, which :meth:`after` ends."""
        entry = None if feed is None or self._off else feed.current
        if entry is not None:
            self._resumed = self._entry_span(entry)
            self._parent = self._resumed
        self.before(event, source)

    def after(self, outcome: str, target: str) -> None:
        """The machine handled the event :meth:`before` named (*outcome*: its step's
        ``next``; *target*: the state it is in now): one transition span."""
        if self._off:
            return
        event, source, start = self._pending
        resumed, self._resumed = self._resumed, None
        if resumed is not None:  # ends after its transition, below
            self._parent = self.span
        self.child(
            "phronomy.transition",
            {
                NS + "event": event,
                NS + "source": source,
                STATE: target,
                NS + "outcome": outcome,
            },
            start,
            resumed,
        ).end()
        if resumed is not None:
            resumed.end()

    @contextlib.contextmanager
    def consuming(self, entry: Any) -> Iterator[None]:
        """Apply inbox *entry* in a span (its transitions are its children): a fired
        timer's is ``phronomy.timer``, an event's ``phronomy.event``."""
        if self._off:
            yield
            return
        span = self._entry_span(entry)
        outer, self._parent = self._parent, span
        try:
            yield
        finally:
            self._parent = outer
            span.end()

    def _entry_span(self, entry: Any) -> Span:
        timer = fired_timer(entry.event_id)
        attributes: dict[str, Any] = {
            NS + "event": entry.event,
            NS + "inbox.seq": entry.seq,
            NS + "event_id": entry.event_id,
            NS + "event.age_ms": max(
                time.time_ns() // 1_000_000 - entry.stored_at_ms, 0
            ),
        }
        if timer is not None:
            attributes[NS + "timer"] = timer[0]
        return self.child(
            "phronomy.event" if timer is None else "phronomy.timer", attributes
        )

    def effect(self, fn: object, attempt: int) -> EffectSpan | None:
        """Start the span of attempt *attempt* of the effect that calls *fn* (none
        when the segment is not sampled)."""
        if self._off:
            return None
        name = getattr(fn, "__qualname__", None) or repr(fn)
        return EffectSpan(
            self.child(
                "phronomy.effect", {NS + "effect": name, NS + "attempt": attempt}
            ),
            self._telemetry,
        )

    def ended(self, result: Any, error: BaseException | None) -> None:
        """End the segment's span (its session's *result*, or the *error* it failed
        with) and count how it ended."""
        status, state, revision = "failed", None, None
        if error is None:
            status, state, revision = result.status, result.phase, result.revision
        if self._resumed is not None:  # its event's transition raised
            self._resumed.end()
        telemetry, span = self._telemetry, self.span
        attributes = {WORKFLOW: self._workflow}
        span.set_attribute(STATUS, status)
        if state is not None:
            span.set_attribute(STATE, state)
        if revision is not None:
            span.set_attribute(REVISION, revision)
        if error is not None:
            span.record_exception(error)
            span.set_status(telemetry.error_code, repr(error)[:200])
            telemetry.failed.add(1, attributes)
        elif status == "finished":
            telemetry.finished.add(1, attributes)
        span.end()
        elapsed = (time.time_ns() - self._start) / 1e9
        telemetry.latency.record(elapsed, {**attributes, STATUS: status})


@final
class EffectSpan:
    """The span of one effect attempt, ended when the attempt settles."""

    __slots__ = ("_span", "_telemetry")

    def __init__(self, span: Span, telemetry: Any) -> None:
        """Wrap *span*."""
        self._span = span
        self._telemetry = telemetry

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """*fn* (an offloaded effect) run in the attempt's context: the spans it
        starts are the attempt's children."""
        from opentelemetry import context, trace

        current = trace.set_span_in_context(self._span)

        @functools.wraps(fn)
        def run(*args: Any) -> Any:
            token = context.attach(current)
            try:
                return fn(*args)
            finally:
                context.detach(token)

        return run

    def wrap_async(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """*fn* (an async effect, run as a trio task) in the attempt's context."""
        from opentelemetry import context, trace

        current = trace.set_span_in_context(self._span)

        @functools.wraps(fn)
        async def run(*args: Any) -> Any:
            token = context.attach(current)
            try:
                return await fn(*args)
            finally:
                context.detach(token)

        return run

    def settled(self, done: Any) -> None:
        """End the span: *done* is the attempt's settled handle."""
        span = self._span
        span.set_attribute(STATUS, done.status)
        if done.error is not None:
            span.record_exception(done.error)
            span.set_status(self._telemetry.error_code, repr(done.error)[:200])
        span.end()
