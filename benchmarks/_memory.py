"""Memory of live durable instances, and latency while their leases are renewed.

Each instance is started at a state that is no wait state but waits for an external
event: its segment stays live in the runtime and holds its lease (a wait state would
halt the segment, save the instance and release the lease). Once every claim is
committed, the child process reports its RSS and, while the heartbeat renews all the
leases (in chunks of ``RENEW_CHUNK``), the latency of new durable runs (a claim and a
fenced save each) and of saves of live instances (an event that finishes one), split
by whether they overlapped a renewal pass. A second child measures the Python bytes
per instance under ``tracemalloc`` (traced allocations inflate RSS, so the RSS child
runs untraced). Children, so that the RSS is the runtime's alone.
"""

from __future__ import annotations

import gc
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import time
import tracemalloc
from typing import TYPE_CHECKING, Any

import trio
import trio.lowlevel

import phronomy
from phronomy.storage import RenewOp

if TYPE_CHECKING:
    from pathlib import Path

HEARTBEAT = 4.0
"""Seconds between renewals in the child: frequent, so the probes meet several."""


class Waiting(phronomy.State):
    n: int = 0


def _waiting() -> phronomy.WorkflowDefinition[Waiting]:
    wf = phronomy.Workflow(Waiting, name="live")
    wf.state("waiting")  # no wait state: the segment stays live, holding its lease
    wf.transition("waiting", phronomy.FINISH, on="go")
    return wf.build()


def _three_steps() -> phronomy.WorkflowDefinition[Waiting]:
    wf = phronomy.Workflow(Waiting, name="probe")
    for state in ("a", "b", "c"):
        wf.state(state, entry=lambda s: s.merge(n=s.n + 1))
    wf.transition("a", "b").transition("b", "c").transition("c", phronomy.FINISH)
    return wf.build()


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _renewals(store: phronomy.SQLiteStore) -> list[tuple[float, float]]:
    """Record when each batch holding a renewal ran (perf_counter spans)."""
    spans: list[tuple[float, float]] = []
    execute = store.execute

    def timed(ops: Any) -> Any:
        if not any(isinstance(op, RenewOp) for op in ops):
            return execute(ops)
        started = time.perf_counter()
        try:
            return execute(ops)
        finally:
            spans.append((started, time.perf_counter()))

    store.execute = timed  # type: ignore[method-assign]
    return spans


def _passes(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The renewal passes: chunks less than half a heartbeat apart form one."""
    passes: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if passes and start - passes[-1][1] < HEARTBEAT / 2:
            passes[-1] = (passes[-1][0], end)
        else:
            passes.append((start, end))
    return passes


async def _all_claimed(path: str, count: int) -> None:
    conn = sqlite3.connect(path)
    try:
        while True:
            (held,) = conn.execute(
                "SELECT count(*) FROM phronomy_workflow_instances "
                "WHERE workflow = 'live' AND lease_owner IS NOT NULL"
            ).fetchone()
            if held >= count:
                return
            await trio.sleep(0.2)
    finally:
        conn.close()


async def _live(
    runtime: phronomy.Runtime,
    path: str,
    count: int,
    prefix: str = "live",
    held: int = 0,
) -> list[phronomy.ResultHandle[Any]]:
    """Start *count* live instances; return once the store holds *held* more leases."""
    flow = _waiting()
    handles = []
    for i in range(count):
        handles.append(
            runtime.workflows.start(flow, workflow_instance_id=f"{prefix}-{i}")
        )
        if i % 500 == 499:
            await trio.lowlevel.checkpoint()
    await _all_claimed(path, held + count)
    return handles


async def _probe(
    runtime: phronomy.Runtime, handles: list[Any], seconds: float
) -> dict[str, list[tuple[float, float]]]:
    """Alternate a new durable run and the save of a live instance for *seconds*."""
    probe, flow = _three_steps(), _waiting()
    spans: dict[str, list[tuple[float, float]]] = {"start": [], "save": []}
    until = time.perf_counter() + seconds
    k = 0
    while time.perf_counter() < until:
        started = time.perf_counter()
        await runtime.workflows.invoke(probe, workflow_instance_id=f"probe-{k}")
        spans["start"].append((started, time.perf_counter()))
        started = time.perf_counter()
        assert runtime.workflows.signal(flow, f"live-{k}", "go")
        await handles[k].result()
        spans["save"].append((started, time.perf_counter()))
        k += 1
        await trio.sleep(0.005)
    return spans


def _split(
    spans: list[tuple[float, float]], passes: list[tuple[float, float]]
) -> dict[str, list[float]]:
    during: list[float] = []
    outside: list[float] = []
    for start, end in spans:
        overlaps = any(start < p_end and end > p_start for p_start, p_end in passes)
        (during if overlaps else outside).append(end - start)
    return {"during": during, "outside": outside}


async def _rss_child(path: str, count: int, seconds: float) -> dict[str, Any]:
    store = phronomy.SQLiteStore(path)
    renewals = _renewals(store)
    before = _rss()
    async with phronomy.open_runtime(
        store=store, heartbeat_interval=HEARTBEAT, shutdown_timeout=0.1
    ) as runtime:
        started = time.perf_counter()
        handles = await _live(runtime, path, count)
        claimed = time.perf_counter() - started
        gc.collect()
        rss = _rss()
        renewals.clear()  # the passes while claims were committed
        probes = await _probe(runtime, handles, seconds)
        passes = _passes(renewals)
        result = {
            "count": count,
            "rss": rss,
            "rss_before": before,
            "claimed_s": claimed,
            "passes": [end - start for start, end in passes],
            "chunk_max": max((end - start for start, end in renewals), default=0.0),
            **{kind: _split(spans, passes) for kind, spans in probes.items()},
        }
    return result


async def _traced_child(path: str, count: int) -> dict[str, Any]:
    store = phronomy.SQLiteStore(path)
    async with phronomy.open_runtime(store=store, shutdown_timeout=0.1) as runtime:
        await _live(runtime, path, 10)  # warm: imports, caches, the first batches
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        handles = await _live(runtime, path, count, "traced", held=10)
        gc.collect()
        traced = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        del handles
    return {"count": count, "python_bytes": traced}


def _child(directory: Path, *args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, str(directory), *args],
        check=True,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    result: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
    return result


def _latency_line(name: str, split: dict[str, list[float]]) -> str:
    def figures(values: list[float]) -> str:
        if len(values) < 2:
            return f"{len(values)} probes"
        p99 = statistics.quantiles(values, n=100, method="inclusive")[98]
        return (
            f"p50 {statistics.median(values) * 1e3:6.1f}  p99 {p99 * 1e3:6.1f}  "
            f"max {max(values) * 1e3:6.1f} ms ({len(values)})"
        )

    return (
        f"  {name:<32} during renewals: {figures(split['during'])}"
        f"   | outside: {figures(split['outside'])}"
    )


def bench(directory: Path, quick: bool) -> None:
    """Print the memory of live durable instances and the latency during renewals."""
    count = 5_000 if quick else 100_000
    traced_count = 2_000 if quick else 10_000
    seconds = 2.5 * HEARTBEAT if quick else 3.5 * HEARTBEAT
    live = _child(directory / "live.db", "rss", str(count), str(seconds))
    traced = _child(directory / "traced.db", "traced", str(traced_count))
    per = (live["rss"] - live["rss_before"]) / count
    python = traced["python_bytes"] / traced_count
    at_100k = live["rss_before"] + per * 100_000
    scale = "" if count == 100_000 else f" (extrapolated from {count:,})"
    print(
        f"{'live durable instances':<34} {count:>14,}      | RSS {live['rss'] / 1e6:,.0f} "
        f"MB ({live['rss_before'] / 1e6:,.0f} MB before the first), claimed in "
        f"{live['claimed_s']:.1f} s",
        flush=True,
    )
    print(
        f"{'  RSS per live instance':<34} {per:>14,.0f} B    | Python (tracemalloc): "
        f"{python:,.0f} B   100k: {at_100k / 1e6:,.0f} MB{scale}   "
        f"[target 100k <= 600 MB: ratio {at_100k / 600e6:.2f}]",
        flush=True,
    )
    passes = live["passes"]
    print(
        f"{'  renewal of every lease':<34} {statistics.median(passes) if passes else 0:>14.3f} s    "
        f"| {len(passes)} passes, the longest chunk {live['chunk_max'] * 1e3:.1f} ms",
        flush=True,
    )
    print(_latency_line("new durable run (claim + save)", live["start"]), flush=True)
    print(_latency_line("save of a live instance", live["save"]), flush=True)
    worst = max(live["start"]["during"] + live["save"]["during"], default=0.0)
    typical = statistics.median(
        live["start"]["outside"] + live["save"]["outside"] or [0.0]
    )
    print(
        f"  the worst delay behind renewals: {(worst - typical) * 1e3:.1f} ms over the "
        "typical latency   [target <= ~50 ms]",
        flush=True,
    )


def main(argv: list[str]) -> None:
    """The child: ``PATH rss COUNT SECONDS`` or ``PATH traced COUNT``."""
    path, kind, count = argv[0], argv[1], int(argv[2])
    if kind == "rss":
        result = trio.run(_rss_child, path, count, float(argv[3]))
    else:
        result = trio.run(_traced_child, path, count)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
