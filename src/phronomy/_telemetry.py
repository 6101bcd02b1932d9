"""OpenTelemetry traces and metrics of a runtime (the optional extra ``phronomy[otel]``).

Nothing here is imported from ``opentelemetry`` unless a runtime opens with telemetry:
:func:`resolve` decides once, at ``open_runtime``, and returns ``None`` when the API is
not installed, no SDK provider is configured (automatic mode) or ``telemetry=False``.
The runtime's parts keep that ``None`` and test it (one attribute check) on their hot
paths, so a runtime without telemetry creates no OpenTelemetry object at all.

Segments across halts: a segment's W3C ``traceparent`` is saved with the snapshot its
terminal save writes; the next segment of the instance (in this process or another,
days later) carries a *link* to it. A link, not a parent: a workflow that waits for a
week would otherwise make one trace a week long, which backends neither show nor keep,
and the halted segment's trace is closed and exported long before. The caller's
context (a ``start``/``invoke``/``resume`` called in an active span) is the segment's
*parent*: the segment is part of the request that caused it.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import TYPE_CHECKING, Any, final

import msgspec

from phronomy.errors import InvalidInputError

from ._telemetry_names import EPOCH, INSTANCE, NS, STATUS, WORKFLOW
from ._telemetry_segment import EffectSpan, SegmentTrace

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence

    from opentelemetry.context import Context
    from opentelemetry.metrics import CallbackOptions, Observation
    from opentelemetry.trace import Span, Tracer

__all__ = ["EffectSpan", "SegmentTrace", "Telemetry", "TelemetryProviders", "resolve"]

COUNT_INTERVAL = 10.0
"""Seconds between two counts of what is pending (``phronomy.events.pending``,
``phronomy.timers.pending``): each reads every pending entry and timer of the
workflows served, in one read of the store's read lane."""

_STASH_LIMIT = 4096


def _configured(provider: object) -> bool:
    """Whether *provider* is a real one (the API's defaults are proxies and no-ops)."""
    name = type(provider).__name__
    return not name.startswith(("Proxy", "_Proxy", "NoOp", "_DefaultTracer"))


@final
class TelemetryProviders(msgspec.Struct, frozen=True, kw_only=True):
    """The OpenTelemetry providers a runtime records to instead of the global ones
    (``open_runtime(telemetry=TelemetryProviders(...))``; tests, or an application
    that keeps several).

    Attributes:
        tracer_provider: an ``opentelemetry.trace.TracerProvider`` (``None``: the
            global one).
        meter_provider: an ``opentelemetry.metrics.MeterProvider`` (``None``: the
            global one).
    """

    tracer_provider: Any = None
    meter_provider: Any = None


def resolve(setting: object) -> Telemetry | None:
    """The runtime's telemetry for ``open_runtime(telemetry=setting)``.

    ``None`` (the default): on when ``opentelemetry-api`` is installed and a real
    tracer or meter provider is set at that moment; ``True``: on with the global
    providers (set them before or after); ``False``: off; a
    :class:`TelemetryProviders`: on with those.

    Raises:
        InvalidInputError: *setting* is none of these, or telemetry is asked for
            without the ``opentelemetry-api`` package.
    """
    if setting is False:
        return None
    given = isinstance(setting, TelemetryProviders)
    if setting is not None and setting is not True and not given:
        raise InvalidInputError(
            "telemetry must be None (automatic), True, False or a "
            f"phronomy.lowlevel.TelemetryProviders, got {setting!r}"
        )
    try:
        from opentelemetry import metrics, trace
    except ImportError:
        if setting:
            raise InvalidInputError(
                "telemetry needs the opentelemetry-api package "
                "(pip install 'phronomy[otel]')"
            ) from None
        return None
    if isinstance(setting, TelemetryProviders):
        return Telemetry(setting.tracer_provider, setting.meter_provider)
    tracers, meters = trace.get_tracer_provider(), metrics.get_meter_provider()
    if setting is None and not (_configured(tracers) or _configured(meters)):
        return None
    return Telemetry()


@final
class Telemetry:
    """The runtime's tracer, meter and instruments (on when :func:`resolve` says)."""

    def __init__(self, tracer_provider: Any = None, meter_provider: Any = None) -> None:
        """Create the instruments on the given providers (default: the global ones)."""
        from opentelemetry import metrics, trace
        from opentelemetry.context import Context
        from opentelemetry.trace.propagation.tracecontext import (
            TraceContextTextMapPropagator,
        )

        self._trace = trace
        self._root = Context()
        self.error_code = trace.StatusCode.ERROR
        self._observation = metrics.Observation
        """The context of spans of no segment (a store batch serves many)."""
        self._propagator = TraceContextTextMapPropagator()
        self.tracer: Tracer = trace.get_tracer(
            "phronomy", tracer_provider=tracer_provider
        )
        meter = metrics.get_meter("phronomy", meter_provider=meter_provider)
        self.started = meter.create_counter(
            "phronomy.runs.started", unit="{run}", description="instances started"
        )
        self.finished = meter.create_counter(
            "phronomy.runs.finished", unit="{run}", description="instances finished"
        )
        self.failed = meter.create_counter(
            "phronomy.runs.failed", unit="{run}", description="segments that failed"
        )
        self.latency = meter.create_histogram(
            "phronomy.segment.duration", unit="s", description="segment latency"
        )
        self.lateness = meter.create_histogram(
            "phronomy.timer.lateness",
            unit="s",
            description="how late the most overdue timer of a firing was fired",
        )
        self.batch_size = meter.create_histogram(
            "phronomy.store.write_batch.size",
            unit="{op}",
            description="operations per write transaction (group commit)",
        )
        self.takeovers = meter.create_counter(
            "phronomy.takeovers",
            unit="{instance}",
            description="instances the recovery sweep put back (lease expired)",
        )
        self.events_pending = 0
        self.timers_pending = 0
        self.timers_due = 0
        self.counted_at = -math.inf  # (trio's clock) when the pending were counted
        self.leases: list[Any] = []  # the Leases objects whose held leases are counted
        meter.create_observable_gauge(
            "phronomy.events.pending",
            [self._observe_events],
            unit="{event}",
            description="pending inbox entries of the workflows the runtime serves "
            f"(counted in the store at most every {COUNT_INTERVAL:g} s)",
        )
        meter.create_observable_gauge(
            "phronomy.timers.pending",
            [self._observe_pending_timers],
            unit="{timer}",
            description="armed timers of the workflows the runtime serves (counted "
            f"in the store at most every {COUNT_INTERVAL:g} s)",
        )
        meter.create_observable_gauge(
            "phronomy.timers.due",
            [self._observe_timers],
            unit="{timer}",
            description="due timers the last poll fired",
        )
        meter.create_observable_up_down_counter(
            "phronomy.leases.held",
            [self._observe_leases],
            unit="{lease}",
            description="instance leases this runtime holds",
        )
        self._claims: dict[str, tuple[str | None, int, int, int]] = {}

    # --- observable instruments ------------------------------------------------------

    def _observe_events(self, options: CallbackOptions) -> Iterable[Observation]:
        return [self._observation(self.events_pending)]

    def _observe_timers(self, options: CallbackOptions) -> Iterable[Observation]:
        return [self._observation(self.timers_due)]

    def _observe_pending_timers(
        self, options: CallbackOptions
    ) -> Iterable[Observation]:
        return [self._observation(self.timers_pending)]

    def counts_due(self, now: float) -> bool:
        """Whether a poll at *now* (trio's clock) should count what is pending (at
        most every :data:`COUNT_INTERVAL` seconds: a count reads every pending entry
        and timer of the workflows served)."""
        if now - self.counted_at < COUNT_INTERVAL:
            return False
        self.counted_at = now
        return True

    def pending(self, events: int, timers: int) -> None:
        """The store counted *events* pending inbox entries and *timers* armed timers
        of the workflows served (:class:`~phronomy.storage.PendingOp`)."""
        self.events_pending, self.timers_pending = events, timers

    def _observe_leases(self, options: CallbackOptions) -> Iterable[Observation]:
        return [self._observation(sum(each.held_count for each in self.leases))]

    def install_store(self, gateway: Any) -> None:
        """Hook the runtime's durability service (store commits, leases, the sweep)."""
        gateway.telemetry = gateway.leases.telemetry = self
        self.leases.append(gateway.leases)

    def install(self, coordinator: Any) -> None:
        """Hook the runtime's workflow coordinator (segments and what they do).

        The commands posted to the coordinator (``start``, ``invoke``, ``resume``: the
        messages with a ``trace`` field) take the caller's context with them: the
        coordinator's ``post_message`` is wrapped on this runtime's object only, so a
        runtime without telemetry runs the original method."""
        import msgspec

        coordinator.telemetry = self
        post, capture = coordinator.post_message, self.capture

        def post_message(message: Any, **options: Any) -> Any:
            if getattr(message, "trace", False) is None:
                message = msgspec.structs.replace(message, trace=capture())
            return post(message, **options)

        setattr(coordinator, "post_message", post_message)  # noqa: B010 - see above

    def close(self) -> None:
        """The runtime closed: its leases are no longer counted."""
        self.leases.clear()

    # --- context -----------------------------------------------------------------------

    def capture(self) -> Context | None:
        """The caller's context when a span is active in it (``None`` otherwise)."""
        from opentelemetry import context

        if not self._trace.get_current_span().get_span_context().is_valid:
            return None
        return context.get_current()

    def traceparent(self, span: Span) -> str | None:
        """*span*'s W3C ``traceparent`` (``None`` for a span that is not sampled)."""
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, self._trace.set_span_in_context(span))
        return carrier.get("traceparent")

    def _link(self, traceparent: str | None) -> list[Any]:
        if not traceparent:
            return []
        ctx = self._propagator.extract({"traceparent": traceparent})
        linked = self._trace.get_current_span(ctx).get_span_context()
        if not linked.is_valid:
            return []
        return [self._trace.Link(linked, {NS + "link": "previous_segment"})]

    # --- segments ----------------------------------------------------------------------

    def claimed(self, iid: str, loaded: Any, sent: float) -> None:
        """A load (sent at trio time *sent*) claimed *iid*: the segment about to run
        links to the one that saved the snapshot it loaded (see :meth:`segment`)."""
        import trio

        now = time.time_ns()
        started = now - int((trio.current_time() - sent) * 1e9)
        if len(self._claims) >= _STASH_LIMIT:  # claims no segment followed (refused)
            self._claims.clear()
        decoded = loaded.decoded
        trace = None if decoded is None else decoded.trace
        self._claims[iid] = (trace, started, now, loaded.epoch)

    def segment(self, command: Any, *, start: bool) -> SegmentTrace:
        """Start the span of the segment *command* runs: a child of its caller's
        context, linked to the segment that saved the snapshot its claim loaded;
        *start*: the first segment of a run (counted)."""
        iid, workflow = command.workflow_instance_id, command.definition.name
        parent: Context | None = command.trace
        trace, begun, claim_end, epoch = self._claims.pop(iid, (None, None, 0, None))
        attributes: dict[str, Any] = {
            WORKFLOW: workflow,
            INSTANCE: iid,
            NS + "start": start,
        }
        if epoch is not None:
            attributes[EPOCH] = epoch
        span = self.tracer.start_span(
            "phronomy.segment",
            context=parent,
            links=self._link(trace),
            attributes=attributes,
            start_time=begun,
        )
        if begun is not None and span.is_recording():
            self.tracer.start_span(
                "phronomy.claim",
                context=self._trace.set_span_in_context(span),
                attributes={INSTANCE: iid, EPOCH: epoch or 0},
                start_time=begun,
            ).end(end_time=claim_end)
        elif begun is None:
            begun = time.time_ns()
        if start:
            self.started.add(1, {WORKFLOW: workflow})
        return SegmentTrace(self, span, workflow, begun)

    # --- the store, the poll, the sweep -------------------------------------------------

    @contextlib.contextmanager
    def commit(self, ops: Sequence[object]) -> Iterator[None]:
        """One write batch (one transaction of the store) in a span, in the store's
        worker thread: its size and the kinds of its operations."""
        kinds = sorted({type(op).__name__ for op in ops})
        self.batch_size.record(len(ops))
        span = self.tracer.start_span(
            "phronomy.store.commit",
            context=self._root,
            attributes={NS + "batch.size": len(ops), NS + "batch.ops": kinds},
        )
        try:
            yield
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(self.error_code, repr(exc)[:200])
            raise
        finally:
            span.end()

    def fired(self, late_ms: int, fired: int) -> None:
        """A poll fired *fired* due timers; the most overdue one was *late_ms* late."""
        self.timers_due = fired
        self.lateness.record(max(late_ms, 0) / 1000)
        span = self.tracer.start_span(
            "phronomy.timer.fire",
            context=self._root,
            attributes={NS + "timers.fired": fired, NS + "timer.late_ms": late_ms},
        )
        span.end()

    def took_over(self, iid: str, status: str) -> None:
        """The sweep put *iid* back as *status* (its runtime stopped)."""
        self.takeovers.add(1)
        self.tracer.start_span(
            "phronomy.sweep.takeover",
            context=self._root,
            attributes={INSTANCE: iid, STATUS: status},
        ).end()
