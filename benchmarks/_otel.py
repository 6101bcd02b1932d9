"""What OpenTelemetry costs a durable run: runs/s of the durable benchmark's workflow
(SQLite, synchronous=FULL, 3 transitions, 64 concurrent callers) in three modes, run
interleaved three times each (the median is reported):

* ``off``: the ``opentelemetry`` package cannot be imported (as without the extra);
* ``api, no provider``: the extra is installed, no provider is set (the default);
* ``sdk``: an SDK ``TracerProvider`` with a ``BatchSpanProcessor`` to an in-memory
  exporter and a ``MeterProvider`` with an in-memory reader, every span sampled;
* ``sdk, 1% sampled``: the same with a ``TraceIdRatioBased(0.01)`` sampler (the
  metrics are all recorded).
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
from typing import TYPE_CHECKING, Any

import trio

import phronomy
from phronomy.lowlevel import TelemetryProviders

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path


@contextlib.contextmanager
def _no_extra() -> Iterator[None]:
    saved = {k: v for k, v in sys.modules.items() if k.startswith("opentelemetry")}
    sys.modules["opentelemetry"] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        del sys.modules["opentelemetry"]
        sys.modules.update(saved)


def _sdk(ratio: float = 1.0) -> tuple[TelemetryProviders, Callable[[], int]]:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
        InMemorySpanExporter,
    )
    from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

    exporter = InMemorySpanExporter()
    tracers = TracerProvider(sampler=TraceIdRatioBased(ratio))
    tracers.add_span_processor(BatchSpanProcessor(exporter))
    meters = MeterProvider(metric_readers=[InMemoryMetricReader()])

    def spans() -> int:
        tracers.force_flush()
        count = len(exporter.get_finished_spans())
        tracers.shutdown()
        meters.shutdown()
        return count

    return TelemetryProviders(tracer_provider=tracers, meter_provider=meters), spans


async def _durable(path: str, flow: Any, total: int, telemetry: Any) -> float:
    store = phronomy.SQLiteStore(path)
    async with phronomy.open_runtime(store=store, telemetry=telemetry) as runtime:
        numbers = iter(range(total))

        async def worker() -> None:
            for i in numbers:
                await runtime.workflows.invoke(flow, workflow_instance_id=f"run-{i}")

        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(64):
                nursery.start_soon(worker)
        return total / (time.perf_counter() - started)


def bench(directory: Path, flow: Any, total: int) -> None:
    """Print the three modes' runs/s and the ratios to ``off``."""
    rates: dict[str, list[float]] = {
        "off": [],
        "api, no provider": [],
        "sdk": [],
        "sdk, 1% sampled": [],
    }
    spans = 0
    for round_ in range(3):
        for index, mode in enumerate(rates):
            path = str(directory / f"otel-{round_}-{index}.db")
            if mode == "off":
                with _no_extra():
                    rate = trio.run(_durable, path, flow, total, None)
            elif mode.startswith("sdk"):
                providers, count = _sdk(1.0 if mode == "sdk" else 0.01)
                rate = trio.run(_durable, path, flow, total, providers)
                if mode == "sdk":
                    spans = count()
                else:
                    count()
            else:
                rate = trio.run(_durable, path, flow, total, None)
            rates[mode].append(rate)
    off = statistics.median(rates["off"])
    for mode, values in rates.items():
        median = statistics.median(values)
        runs = ", ".join(f"{v:,.0f}" for v in values)
        print(
            f"{'durable runs/s, otel ' + mode:<34} {median:>14,.0f} runs/s   "
            f"| ratio to off {median / off:.3f}   (runs: {runs})",
            flush=True,
        )
    print(f"{'  spans per run (sdk)':<34} {spans / total:>14,.1f}", flush=True)
