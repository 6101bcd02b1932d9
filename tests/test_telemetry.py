"""OpenTelemetry (the ``phronomy[otel]`` extra): spans, links across halts, metrics,
and nothing at all without a provider.

The runtimes here record to their own SDK providers (``TelemetryProviders``): the
global providers are never set, so no other test runs with telemetry on."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.testing
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)

import phronomy
from phronomy import _telemetry
from phronomy.lowlevel import TelemetryProviders
from phronomy.storage import (
    BeginOp,
    ClaimOp,
    LoadOp,
    Posting,
    PostOp,
    decode_snapshot_builtins,
)
from phronomy.testing import TestClock
from polling import until

if TYPE_CHECKING:
    from collections.abc import Callable


class Order(phronomy.State):
    item: str = ""
    steps: list[str] = []  # noqa: RUF012


SHIPPED_IN: list[int] = []  # the span ids current in the effect's thread


def _ship(item: str) -> str:
    import opentelemetry.trace

    SHIPPED_IN.append(opentelemetry.trace.get_current_span().get_span_context().span_id)
    return f"shipped {item}"


def order_flow() -> phronomy.WorkflowDefinition[Order]:
    """prepare -> awaiting (wait) -approve-> ship (an effect) -> FINISH."""
    wf = phronomy.Workflow(Order, name="orders")
    wf.state("prepare", entry=lambda s: s.merge(steps=[*s.steps, "prepared"]))
    wf.wait_state("awaiting")

    def ship(state: Order, event: Any, effects: phronomy.Effects) -> None:
        effects.offload(_ship, state.item, on_done="shipped")

    wf.state("ship", entry=ship)
    wf.transition("prepare", "awaiting")
    wf.transition("awaiting", "ship", on="approve")
    wf.transition(
        "ship",
        phronomy.FINISH,
        on="shipped",
        action=lambda s, e: s.merge(steps=[*s.steps, e.payload]),
    )
    return wf.build()


def failing_flow() -> phronomy.WorkflowDefinition[Order]:
    wf = phronomy.Workflow(Order, name="failing")

    def boom(state: Order) -> Order:
        raise RuntimeError("boom")

    wf.state("start", entry=boom)
    wf.transition("start", phronomy.FINISH)
    return wf.build()


class Otel:
    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.providers = TelemetryProviders(
            tracer_provider=self.tracer_provider, meter_provider=self.meter_provider
        )

    def finished(self, name: str | None = None) -> list[ReadableSpan]:
        spans = self.spans.get_finished_spans()
        return [s for s in spans if name is None or s.name == name]

    def metrics(self) -> dict[str, list[tuple[dict[str, Any], Any]]]:
        """name -> [(attributes, value or histogram (count, sum))]."""
        found: dict[str, list[tuple[dict[str, Any], Any]]] = {}
        data = self.reader.get_metrics_data()
        assert data is not None
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    points = found.setdefault(metric.name, [])
                    for point in metric.data.data_points:
                        value = getattr(point, "value", None)
                        if value is None:
                            value = (point.count, point.sum)  # type: ignore[union-attr]
                        points.append((dict(point.attributes or {}), value))
        return found


@pytest.fixture
def otel() -> Otel:
    return Otel()


def _children(spans: list[ReadableSpan], parent: ReadableSpan) -> list[str]:
    assert parent.context is not None
    return sorted(
        s.name
        for s in spans
        if s.parent is not None and s.parent.span_id == parent.context.span_id
    )


async def _halt_then_resume(
    otel: Otel, open_store: Callable[[], phronomy.storage.BaseStore[Any]]
) -> None:
    """Halt in one runtime, resume in a second one (inside a caller's span); check
    the span tree, the link, the stored traceparent and the metrics."""
    flow = order_flow()
    store = open_store()
    async with phronomy.open_runtime(store, telemetry=otel.providers) as runtime:
        halted = await runtime.workflows.invoke(
            flow, {"item": "lamp"}, workflow_instance_id="order-1"
        )
    assert halted.status == "halted"
    (first,) = otel.finished("phronomy.segment")
    assert first.context is not None
    assert first.parent is None  # nobody's span was active: a new trace
    assert first.attributes is not None
    assert dict(first.attributes) == {
        "phronomy.workflow": "orders",
        "phronomy.instance_id": "order-1",
        "phronomy.start": True,
        "phronomy.lease.epoch": 1,
        "phronomy.status": "halted",
        "phronomy.state": "awaiting",
        "phronomy.revision": 1,
    }
    spans = otel.finished()
    assert _children(spans, first) == ["phronomy.claim", "phronomy.transition"]

    # the snapshot holds the halted segment's traceparent
    record = store.execute([LoadOp(workflow_instance_id="order-1")])[0].unwrap()
    saved = decode_snapshot_builtins(
        record.snapshot, workflow_instance_id="order-1", revision=1
    )
    trace_id = f"{first.context.trace_id:032x}"
    assert saved.trace is not None
    assert saved.trace.startswith(f"00-{trace_id}-{first.context.span_id:016x}-")

    # a second runtime (another process, days later: nothing is shared but the store)
    store2 = open_store()
    request_tracer = otel.tracer_provider.get_tracer("web")
    async with phronomy.open_runtime(store2, telemetry=otel.providers) as runtime:
        with request_tracer.start_as_current_span("POST /approve") as request:
            done = await runtime.workflows.send_event(
                flow, "approve", workflow_instance_id="order-1"
            )
    assert done.status == "finished"
    assert done.state.steps == ["prepared", "shipped lamp"]
    segments = otel.finished("phronomy.segment")
    second = segments[1]
    assert second.context is not None
    assert second.parent is not None
    assert second.parent.span_id == request.get_span_context().span_id  # the caller's
    assert second.context.trace_id == request.get_span_context().trace_id
    (link,) = second.links
    assert link.context.trace_id == first.context.trace_id
    assert link.context.span_id == first.context.span_id
    spans = otel.finished()
    assert _children(spans, second) == [
        "phronomy.claim",
        "phronomy.effect",
        "phronomy.event",  # approve: awaiting -> ship (its child)
        "phronomy.transition",  # shipped (the effect's event): ship -> FINISH
    ]
    (event,) = otel.finished("phronomy.event")
    assert event.attributes is not None
    assert event.attributes["phronomy.event"] == "approve"
    assert _children(spans, event) == ["phronomy.transition"]
    (effect,) = otel.finished("phronomy.effect")
    assert effect.attributes is not None
    assert effect.attributes["phronomy.effect"] == "_ship"
    assert effect.attributes["phronomy.attempt"] == 1
    assert effect.attributes["phronomy.status"] == "completed"
    assert effect.context is not None
    assert SHIPPED_IN[-1] == effect.context.span_id  # the effect's spans: children

    commits = otel.finished("phronomy.store.commit")
    assert commits, "no store commit span"
    kinds = {k for s in commits for k in (s.attributes or {})["phronomy.batch.ops"]}  # type: ignore[union-attr]
    assert {"ClaimOp", "SaveOp"} <= kinds
    ops = sum((s.attributes or {})["phronomy.batch.size"] for s in commits)  # type: ignore[misc]

    metrics = otel.metrics()
    assert metrics["phronomy.runs.started"] == [({"phronomy.workflow": "orders"}, 1)]
    assert metrics["phronomy.runs.finished"] == [({"phronomy.workflow": "orders"}, 1)]
    assert "phronomy.runs.failed" not in metrics
    durations = {
        p[0]["phronomy.status"]: p[1][0] for p in metrics["phronomy.segment.duration"]
    }
    assert durations == {"halted": 1, "finished": 1}
    ((_, (batches, batch_ops)),) = metrics["phronomy.store.write_batch.size"]
    assert (batches, batch_ops) == (len(commits), ops)
    assert metrics["phronomy.leases.held"] == [({}, 0)]  # both runtimes closed


async def test_a_halt_and_its_resume_in_another_runtime_on_sqlite(
    otel: Otel, tmp_path: Any, open_sqlite: Callable[..., phronomy.SQLiteStore]
) -> None:
    await _halt_then_resume(otel, lambda: open_sqlite(tmp_path / "orders.db"))


async def test_a_halt_and_its_resume_in_another_runtime_on_postgres(
    otel: Otel, open_postgres: Callable[..., phronomy.PostgresStore]
) -> None:
    await _halt_then_resume(otel, open_postgres)


async def test_a_failed_segment_is_counted_and_marked(
    otel: Otel, tmp_path: Any, open_sqlite: Callable[..., phronomy.SQLiteStore]
) -> None:
    store = open_sqlite(tmp_path / "failing.db")
    async with phronomy.open_runtime(store, telemetry=otel.providers) as runtime:
        with pytest.raises(RuntimeError, match="boom"):
            await runtime.workflows.invoke(failing_flow(), workflow_instance_id="bad-1")
    (segment,) = otel.finished("phronomy.segment")
    assert segment.status.status_code.name == "ERROR"
    assert segment.attributes is not None
    assert segment.attributes["phronomy.status"] == "failed"
    assert [e.name for e in segment.events] == ["exception"]
    metrics = otel.metrics()
    assert metrics["phronomy.runs.failed"] == [({"phronomy.workflow": "failing"}, 1)]
    assert metrics["phronomy.runs.started"] == [({"phronomy.workflow": "failing"}, 1)]
    assert "phronomy.runs.finished" not in metrics


async def test_leases_held_and_a_sweep_takeover(
    otel: Otel, tmp_path: Any, open_sqlite: Callable[..., phronomy.SQLiteStore]
) -> None:
    flow = order_flow()
    store = open_sqlite(tmp_path / "sweep.db")
    async with phronomy.open_runtime(
        store, telemetry=otel.providers, sweep_interval=0
    ) as runtime:
        await runtime.workflows.invoke(flow, workflow_instance_id="o-1")
        # a runtime that stopped while running it: its lease (1 ms) expires at once
        claim = ClaimOp(
            workflow_instance_id="o-1",
            workflow="orders",
            lease_owner="a-stopped-runtime",
            ttl_ms=1,
            statuses=("halted",),
        )
        claimed = await trio.to_thread.run_sync(store.execute, [claim])
        assert claimed[0].unwrap().epoch == 2
        assert runtime.store is store
        gateway = _telemetry_of(runtime)

        claimed_at = time.time()
        await until(lambda: time.time() > claimed_at + 0.003)  # the store's clock
        await gateway.leases.sweep_once()
        handle = runtime.workflows.start(live_flow(), workflow_instance_id="live-1")
        await until(lambda: runtime.workflows.segment("live-1") is not None)
        await until(lambda: otel.metrics()["phronomy.leases.held"] == [({}, 1)])
        await runtime.workflows.deliver(live_flow(), "live-1", "finish")
        await handle.result()
    (takeover,) = otel.finished("phronomy.sweep.takeover")
    assert takeover.attributes is not None
    assert dict(takeover.attributes) == {
        "phronomy.instance_id": "o-1",
        "phronomy.status": "halted",
    }
    assert otel.metrics()["phronomy.takeovers"] == [({}, 1)]


def live_flow() -> phronomy.WorkflowDefinition[Order]:
    wf = phronomy.Workflow(Order, name="live")
    wf.state("waiting")
    wf.transition("waiting", phronomy.FINISH, on="finish")
    return wf.build()


def _telemetry_of(runtime: phronomy.Runtime) -> Any:
    coordinator = runtime.workflows._coordinator
    assert coordinator.telemetry is not None
    return coordinator.gateway


async def test_without_a_provider_nothing_of_opentelemetry_runs(
    tmp_path: Any,
    open_sqlite: Callable[..., phronomy.SQLiteStore],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[str] = []
    for name in ("Telemetry", "SegmentTrace", "EffectSpan"):
        cls = getattr(_telemetry, name)
        original = cls.__init__

        def counting(self: Any, *args: Any, _o: Any = original, _n: str = name) -> None:
            made.append(_n)
            _o(self, *args)

        monkeypatch.setattr(cls, "__init__", counting)
    import opentelemetry.trace

    def no_tracer(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a tracer was asked for")

    monkeypatch.setattr(opentelemetry.trace, "get_tracer", no_tracer)
    flow = order_flow()
    store = open_sqlite(tmp_path / "plain.db")
    async with phronomy.open_runtime(store) as runtime:  # the API's default providers
        assert runtime.workflows._coordinator.telemetry is None
        await runtime.workflows.invoke(flow, workflow_instance_id="p-1")
        done = await runtime.workflows.send_event(
            flow, "approve", workflow_instance_id="p-1"
        )
        assert done.status == "finished"
    assert made == []
    record = store.execute([LoadOp(workflow_instance_id="p-1")])[0].unwrap()
    assert b'"trace"' not in record.snapshot  # the snapshot is as before


class Expense(phronomy.State):
    escalated: bool = False


@pytest.fixture
def clock() -> trio.testing.MockClock:
    """Real time, plus the jumps the test makes (through its TestClock)."""
    return trio.testing.MockClock(rate=1)


async def test_a_timer_fired_late_is_measured_and_its_segment_linked(
    otel: Otel,
    tmp_path: Any,
    clock: trio.testing.MockClock,
    open_sqlite: Callable[..., phronomy.SQLiteStore],
) -> None:
    wf = phronomy.Workflow(Expense, name="expense")
    wf.wait_state("awaiting")
    wf.wait_state("escalated")
    wf.transition(
        "awaiting",
        "escalated",
        after=timedelta(days=2),
        action=lambda s: s.merge(escalated=True),
    )
    wf.transition("escalated", phronomy.FINISH, on="approve")
    flow = wf.build()
    test_clock = TestClock(clock)
    store = open_sqlite(tmp_path / "timers.db", clock=test_clock)
    async with phronomy.open_runtime(
        store, telemetry=otel.providers, workflows=[flow], inbox_poll_interval=0.02
    ) as runtime:
        started = test_clock()  # before the timer is armed
        await runtime.workflows.invoke(flow, workflow_instance_id="e-1")
        test_clock.skip(timedelta(days=2, minutes=5))  # the poll finds it 5 min late
        await until(lambda: len(otel.finished("phronomy.segment")) == 2)
        # then a poll interval, and the poll's and the segment's time (a loaded CI)
        waited = (test_clock() - started) / 1000 - 2 * 86400 - 300
    first, second = otel.finished("phronomy.segment")
    assert second.attributes is not None
    assert second.attributes["phronomy.state"] == "escalated"
    assert second.parent is None  # nobody asked: the poll found the fired timer
    assert [link.context.span_id for link in second.links] == [first.context.span_id]
    (timer,) = otel.finished("phronomy.timer")
    assert timer.attributes is not None
    assert timer.attributes["phronomy.timer"] == "after:172800000:awaiting"
    (fire,) = otel.finished("phronomy.timer.fire")
    assert fire.attributes is not None
    assert fire.attributes["phronomy.timers.fired"] == 1
    metrics = otel.metrics()
    ((_, (count, late)),) = metrics["phronomy.timer.lateness"]
    assert count == 1
    assert 300 <= late <= 300 + waited  # the skip's 5 minutes, plus the wait for it
    assert metrics["phronomy.timers.due"] == [({}, 1)]


async def test_what_is_pending_is_counted_in_the_store(
    otel: Otel,
    tmp_path: Any,
    open_sqlite: Callable[..., phronomy.SQLiteStore],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before: phronomy.events.pending was the number of entries the last poll read
    # (up to its limit, and none of an instance another runtime holds), and no metric
    # counted the armed timers (phronomy.timers.due is what the last firing moved).
    monkeypatch.setattr(_telemetry, "COUNT_INTERVAL", 0.05)
    wf = phronomy.Workflow(Expense, name="expense")
    wf.wait_state("awaiting")
    wf.transition("awaiting", phronomy.FINISH, after=timedelta(days=2))
    wf.transition("awaiting", phronomy.FINISH, on="approve")
    flow = wf.build()
    store = open_sqlite(tmp_path / "pending.db")
    # an instance another runtime holds, with two events it has not applied yet
    held = BeginOp(
        workflow_instance_id="x", workflow="expense", lease_owner="B", ttl_ms=60_000
    )
    assert store.run(held) == 1
    for n in (1, 2):
        posting = Posting(
            workflow_instance_id="x", event_id=f"e{n}", event="approve", payload=b"1"
        )
        assert store.run(PostOp(posting=posting)).outcome == "stored"
    async with phronomy.open_runtime(
        store, telemetry=otel.providers, workflows=[flow], inbox_poll_interval=0.02
    ) as runtime:
        for iid in ("e-1", "e-2", "e-3"):  # each halts with its timer armed
            await runtime.workflows.invoke(flow, workflow_instance_id=iid)

        def pending() -> tuple[Any, Any]:
            metrics = otel.metrics()
            return metrics["phronomy.events.pending"], metrics[
                "phronomy.timers.pending"
            ]

        await until(lambda: pending() == ([({}, 2)], [({}, 3)]))
        await runtime.workflows.send_event(
            flow, event="approve", workflow_instance_id="e-1"
        )  # finished: its timer is dropped
        await until(lambda: pending() == ([({}, 2)], [({}, 2)]))


async def test_an_unsampled_segment_records_no_spans_but_its_metrics(
    tmp_path: Any, open_sqlite: Callable[..., phronomy.SQLiteStore]
) -> None:
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    otel = Otel()
    otel.tracer_provider = TracerProvider(sampler=ALWAYS_OFF)
    otel.tracer_provider.add_span_processor(SimpleSpanProcessor(otel.spans))
    providers = TelemetryProviders(
        tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider
    )
    flow = order_flow()
    store = open_sqlite(tmp_path / "unsampled.db")
    async with phronomy.open_runtime(store, telemetry=providers) as runtime:
        await runtime.workflows.invoke(flow, workflow_instance_id="u-1")
        done = await runtime.workflows.send_event(
            flow, "approve", workflow_instance_id="u-1"
        )
    assert done.status == "finished"
    assert otel.finished() == []
    metrics = otel.metrics()
    assert metrics["phronomy.runs.finished"] == [({"phronomy.workflow": "orders"}, 1)]
    assert len(metrics["phronomy.segment.duration"]) == 2
