"""phronomy benchmarks: each figure beside a limit measured in the same run.

    python benchmarks/run.py [--quick] [--only NAME ...]

* dispatcher   events/s through the dispatcher vs a raw batch-drained trio memory channel
* workflows    in-memory runs/s: 3 automatic transitions, 64 concurrent invocations
* durable      SQLite (synchronous=FULL) runs/s of 3-transition workflows, 64 concurrent,
               vs the honest limit: a raw trio + sqlite3 loop doing exactly a durable
               run's store work (the claim and the fenced save, both group-committed, 64
               clients, a batch of claims committed without its own sync as the store's
               lease lane is; see _limits.py), nine rounds alternating with it, the ratio
               the median of the rounds' ratios; CPU per run and the median write batch
               beside it; the last release's limit (claims synced too) beside that and,
               in passes of their own (_profile.py), CPU per run on the trio and the
               store threads, Python calls and cyclic GC per run, beside the limit's
* resume       durable halt + resume-by-id pairs/s, 64 concurrent, vs the same loop with
               two claim + save pairs per instance (the resuming claim storing the event,
               its save consuming it)
* postgres     the durable runs on PostgresStore (a server from PHRONOMY_BENCH_POSTGRES_DSN
               or PHRONOMY_TEST_POSTGRES_DSN) vs the same store work in a raw trio +
               psycopg loop, one pipelined transaction per batch; the same profile
* processes    durable runs/s of 1, 2 and 4 processes sharing one SQLite file (and one
               PostgreSQL schema when configured): leases keep their instances apart;
               what limits them (the children's CPU, their time in write batches)
* executions   durable 3-step executions/s (SQLite, a checkpoint per step) vs durable runs
               at the same store writes; 1,000 trivial supervised executions vs 1,000 raw
               trio.to_thread round trips; time from cancel to settlement with a 0.5 s
               blocking tool
* inbox        durable posts/s (64 posters, SQLite) vs the raw insert limit (the same
               numbering and insert in a raw trio + sqlite3 group-commit loop); post to
               application p50/p99 in this process, from another process on SQLite (the
               default poll interval) and on PostgreSQL (notifications); durable runs/s
               that receive no events, with the inbox poll on and off
* timers       100,000 pending timers: an idle runtime's CPU per second and per poll, its
               memory, vs none (and 1,000); the size they take and the plans of the
               timer queries; 10,000 timers due at one instant (5,000 on PostgreSQL):
               applied/s vs as many events posted at once, lateness p50/p99 (SQLite,
               and PostgreSQL when configured)
* retries      a retry policy on an effect that succeeds at once: what it adds to a
               durable run, as a share of what the effect costs (target <= 5%)
* telemetry    durable runs/s with OpenTelemetry off (no extra), installed without a
               provider, and with an SDK provider (batch span processor, in-memory
               exporter and metric reader; every trace, and 1% of them, sampled),
               interleaved three times
* memory       100,000 live durable instances (SQLite; 5,000 with --quick, per instance
               extrapolated): RSS and Python bytes per instance vs 600 MB; the latency
               of new durable runs and saves while their leases are renewed
* lifecycle    the cost of a watcher per stable state (1,000-step runs with and without
               one); thread-portal calls vs raw trio.from_thread.run_sync
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import _inbox
import _limits
import _memory
import _otel
import _processes
import _profile
import _timers
import trio
import trio.lowlevel

import phronomy
from phronomy.lowlevel import Event, open_engine
from phronomy.storage import READ_OPS

if TYPE_CHECKING:
    from collections.abc import Callable

QUICK = False


def _n(full: int, quick: int) -> int:
    return quick if QUICK else full


def _report(
    name: str,
    ours: float,
    unit: str,
    limit: float | None = None,
    limit_name: str = "",
    target: str = "",
) -> None:
    line = f"{name:<34} {ours:>14,.0f} {unit}"
    if limit is not None:
        line += f"   | {limit_name}: {limit:,.0f} {unit}   ratio {ours / limit:.2f}"
    if target:
        line += f"   [{target}]"
    print(line, flush=True)


# --- dispatcher --------------------------------------------------------------------------------


class _Counter:
    def __init__(self, total: int) -> None:
        self.id = "counter"
        self.total = total
        self.seen = 0
        self.done = trio.Event()

    def start(self) -> None:
        pass

    def handle(self, event: Event) -> None:
        self.seen += 1
        if self.seen == self.total:
            self.done.set()

    def cut_off(self) -> BaseException:
        return RuntimeError("cut off")


async def _raw_channel(total: int, chunk: int) -> float:
    send, receive = trio.open_memory_channel[int](math.inf)
    done = trio.Event()

    async def consumer() -> None:
        seen = 0
        while seen < total:
            await receive.receive()
            seen += 1
            while True:
                try:
                    receive.receive_nowait()
                except trio.WouldBlock:
                    break
                seen += 1
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(consumer)
        await trio.lowlevel.checkpoint()
        started = time.perf_counter()
        for _ in range(0, total, chunk):
            for i in range(chunk):
                send.send_nowait(i)
            await trio.lowlevel.checkpoint()
        await done.wait()
        return total / (time.perf_counter() - started)


async def _our_dispatcher(total: int, chunk: int) -> float:
    # (its counting session never ends: the engine's exit does not wait for it)
    async with open_engine(backlog_threshold=10**9, shutdown_timeout=0.01) as engine:
        counter = _Counter(total)
        engine.register_session(counter)
        await trio.sleep(0.01)
        event = Event(type="tick", target_id=counter.id)
        post = engine.post_nowait
        started = time.perf_counter()
        for _ in range(0, total, chunk):
            for _ in range(chunk):
                post(event)
            await trio.lowlevel.checkpoint()
        await counter.done.wait()
        return total / (time.perf_counter() - started)


def bench_dispatcher() -> None:
    total, chunk = _n(400_000, 20_000), 1000
    raw, ours = _interleaved(
        lambda i: (trio.run(_raw_channel, total, chunk), 0.0, 0.0),
        lambda i: (trio.run(_our_dispatcher, total, chunk), 0.0, 0.0),
    )
    print(
        f"{'dispatcher events/s':<34} {_median_run(ours)[0]:>14,.0f} events/s   | raw "
        f"trio channel: {_median_run(raw)[0]:,.0f} events/s   {_paired(ours, raw)}   "
        "[target ratio >= 0.50]",
        flush=True,
    )


# --- workflows ---------------------------------------------------------------------------------


class Counter(phronomy.State):
    n: int = 0


def three_steps(name: str = "bench") -> phronomy.WorkflowDefinition[Counter]:
    wf = phronomy.Workflow(Counter, name=name)
    for state in ("a", "b", "c"):
        wf.state(state, entry=lambda s: s.merge(n=s.n + 1))
    wf.transition("a", "b").transition("b", "c").transition("c", phronomy.FINISH)
    return wf.build()


async def _runs(
    runtime: phronomy.Runtime, flow: Any, total: int, concurrency: int, ids: str | None
) -> float:
    numbers = iter(range(total))

    async def worker() -> None:
        for i in numbers:
            await runtime.workflows.invoke(
                flow, workflow_instance_id=f"{ids}-{i}" if ids else None
            )

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)
    return total / (time.perf_counter() - started)


async def _memory_runs(total: int) -> float:
    async with phronomy.open_runtime() as runtime:
        return await _runs(runtime, three_steps(), total, 64, None)


def bench_workflows() -> None:
    total = _n(40_000, 2_000)
    ours = statistics.median(trio.run(_memory_runs, total) for _ in range(3))
    _report("in-memory workflow runs/s", ours, "runs/s", target="target >= 20,000")


# --- durable -----------------------------------------------------------------------------------


def _write_batches(store: phronomy.SQLiteStore | phronomy.PostgresStore) -> list[int]:
    """Record the size of every write batch the store runs (its group commits)."""
    sizes: list[int] = []
    execute = store.execute

    def counting(ops: Any) -> Any:
        writes = sum(not isinstance(op, READ_OPS) for op in ops)
        if writes:
            sizes.append(writes)
        return execute(ops)

    store.execute = counting  # type: ignore[method-assign]
    return sizes


async def _durable_runs(
    path: str, total: int, poll: float = 0.1
) -> tuple[float, float, float]:
    store = phronomy.SQLiteStore(path)
    sizes = _write_batches(store)
    async with phronomy.open_runtime(store=store, inbox_poll_interval=poll) as runtime:
        cpu = time.process_time()
        rate = await _runs(runtime, three_steps(), total, 64, "run")
        cpu = time.process_time() - cpu
    return rate, cpu / total, statistics.median(sizes)


def halting(name: str = "approvals") -> phronomy.WorkflowDefinition[Counter]:
    wf = phronomy.Workflow(Counter, name=name)
    wf.state("draft", entry=lambda s: s.merge(n=s.n + 1))
    wf.wait_state("awaiting")
    wf.transition("draft", "awaiting")
    wf.transition(
        "awaiting", phronomy.FINISH, on="approve", action=lambda s: s.merge(n=s.n + 1)
    )
    return wf.build()


async def _halt_resume_pairs(path: str, total: int) -> tuple[float, float, float]:
    flow = halting()
    store = phronomy.SQLiteStore(path)
    sizes = _write_batches(store)
    async with phronomy.open_runtime(store=store) as runtime:
        numbers = iter(range(total))

        async def worker() -> None:
            for i in numbers:
                await runtime.workflows.invoke(flow, workflow_instance_id=f"pair-{i}")
                await runtime.workflows.send_event(
                    flow, event="approve", workflow_instance_id=f"pair-{i}"
                )

        cpu, started = time.process_time(), time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(64):
                nursery.start_soon(worker)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    return total / elapsed, cpu / total, statistics.median(sizes)


Figures = tuple[float, float, float]
"""One pass: units/s, CPU seconds per unit (all threads), the median write batch."""


def _median_run(results: list[Figures]) -> Figures:
    return sorted(results)[len(results) // 2]


def _paired(ours: list[Figures], limit: list[Figures]) -> str:
    """The median of the rounds' ratios (each round's pass against the limit's pass of
    the same round, run just before it) and their range: the machine's speed drifts
    within a minute (CPU steal, disk), and a ratio of two medians taken at different
    moments moves with it."""
    ratios = sorted(a[0] / b[0] for a, b in zip(ours, limit, strict=True))
    median = statistics.median(ratios)
    if len(ratios) < 2:
        return f"ratio {median:.2f}"
    return (
        f"ratio {median:.2f} [{ratios[0]:.2f}-{ratios[-1]:.2f} over {len(ratios)} "
        "rounds]"
    )


def _report_durable(
    name: str,
    unit: str,
    ours: list[Figures],
    limit: list[Figures],
    limit_name: str,
    target: float = 0.60,
) -> None:
    """*ours* beside the *limit* (their rounds' medians), the rounds' paired ratio, the
    CPU per unit and the median write batch."""
    mine, theirs = _median_run(ours), _median_run(limit)
    print(
        f"{name:<34} {mine[0]:>14,.0f} {unit}   | {limit_name}: {theirs[0]:,.0f} "
        f"{unit}   {_paired(ours, limit)}   [target ratio >= {target:.2f}]",
        flush=True,
    )
    print(
        f"{'  CPU per ' + unit.split('/')[0].rstrip('s'):<34} {mine[1] * 1e6:>14,.0f} us   | "
        f"limit: {theirs[1] * 1e6:,.0f} us",
        flush=True,
    )
    print(
        f"{'  median write batch':<34} {mine[2]:>14,.0f} ops  | "
        f"limit: {theirs[2]:,.0f} ops",
        flush=True,
    )


HONEST = "honest limit (raw claim + fenced save)"
"""The limit a durable run's store work has (``_limits``)."""
SYNCED_CLAIMS = (
    "the honest limit of the last release: the claims synced too, two fsyncs per run"
)


def _interleaved(*runs: Callable[[int], Figures]) -> list[list[Figures]]:
    """Each of *runs* (callables of the round number) once per round, the rounds
    alternating between them (the machine's drift shared fairly): every pass of each,
    in round order."""
    rounds: list[list[Figures]] = [[] for _ in runs]
    for i in range(_n(9, 2)):
        for results, run in zip(rounds, runs, strict=True):
            results.append(run(i))
    return rounds


def _report_old_limit(
    ours: list[Figures], old: list[Figures], name: str, what: str
) -> None:
    print(
        f"{'  ' + name:<34} {_median_run(old)[0]:>14,.0f}       | "
        f"{_paired(ours, old)} ({what})",
        flush=True,
    )


def bench_durable(directory: Path) -> None:
    total = _n(10_000, 1_000)
    limit, synced, runs = _interleaved(
        lambda i: trio.run(
            _limits.sqlite_claim_save_limit, str(directory / f"claim{i}.db"), total
        ),
        lambda i: trio.run(
            functools.partial(_limits.sqlite_claim_save_limit, claims_sync="FULL"),
            str(directory / f"synced{i}.db"),
            total,
        ),
        lambda i: trio.run(_durable_runs, str(directory / f"durable{i}.db"), total),
    )
    _report_durable(
        "durable runs/s (SQLite, FULL)", "runs/s", runs, limit, HONEST, 0.65
    )
    _report_old_limit(runs, synced, "limit, claims synced", SYNCED_CLAIMS)
    each = total // 2  # the profile's own passes, after the timed ones
    _profile.report(
        "run",
        _profile.measure(
            lambda i: trio.run(_durable_runs, str(directory / f"prof{i}.db"), each),
            each,
        ),
        _profile.measure(
            lambda i: trio.run(
                _limits.sqlite_claim_save_limit, str(directory / f"profl{i}.db"), each
            ),
            each,
        ),
        "limit",
    )


def bench_resume(directory: Path) -> None:
    """Halt + resume pairs against the limit doing a pair's store work: two claims
    and two fenced saves, the resuming claim storing the event (the durable inbox)
    and the save that applies it consuming it."""
    total = _n(5_000, 500)
    limit, synced, pairs = _interleaved(
        lambda i: trio.run(
            functools.partial(_limits.sqlite_claim_save_limit, events=True),
            str(directory / f"claimpe{i}.db"),
            total,
            2,
        ),
        lambda i: trio.run(
            functools.partial(
                _limits.sqlite_claim_save_limit, events=True, claims_sync="FULL"
            ),
            str(directory / f"syncedp{i}.db"),
            total,
            2,
        ),
        lambda i: trio.run(_halt_resume_pairs, str(directory / f"pairs{i}.db"), total),
    )
    _report_durable(
        "durable halt + resume pairs/s",
        "pairs/s",
        pairs,
        limit,
        "honest limit (+ the event stored, consumed)",
    )
    _report_old_limit(pairs, synced, "limit, claims synced", SYNCED_CLAIMS)


# --- PostgreSQL --------------------------------------------------------------------------------


def _postgres_dsn() -> str | None:
    return os.environ.get("PHRONOMY_BENCH_POSTGRES_DSN") or os.environ.get(
        "PHRONOMY_TEST_POSTGRES_DSN"
    )


async def _postgres_runs(
    dsn: str, schema: str, total: int
) -> tuple[float, float, float]:
    store = phronomy.PostgresStore(dsn, schema=schema)
    sizes = _write_batches(store)
    try:
        async with phronomy.open_runtime(store=store) as runtime:
            cpu = time.process_time()
            rate = await _runs(runtime, three_steps(), total, 64, "run")
            cpu = time.process_time() - cpu
    finally:
        store.close()
        import psycopg

        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
    return rate, cpu / total, statistics.median(sizes)


def bench_postgres() -> None:
    dsn = _postgres_dsn()
    if dsn is None:
        print(
            "durable runs/s (PostgreSQL)        skipped: set PHRONOMY_BENCH_POSTGRES_DSN "
            '(or eval "$(scripts/postgres-test-server start)")',
            flush=True,
        )
        return
    total = _n(6_000, 500)
    tag = f"{os.getpid()}_{time.monotonic_ns()}"
    limit, runs = _interleaved(
        lambda i: trio.run(
            _limits.postgres_claim_save_limit, dsn, f"bench_claim_{tag}_{i}", total
        ),
        lambda i: trio.run(_postgres_runs, dsn, f"bench_{tag}_{i}", total),
    )
    _report_durable(
        "durable runs/s (PostgreSQL)",
        "runs/s",
        runs,
        limit,
        "honest limit (pipelined claim + fenced save)",
    )
    each = total // 2  # the profile's own passes, after the timed ones
    _profile.report(
        "run",
        _profile.measure(
            lambda i: trio.run(_postgres_runs, dsn, f"bench_prof_{tag}_{i}", each),
            each,
        ),
        _profile.measure(
            lambda i: trio.run(
                _limits.postgres_claim_save_limit, dsn, f"bench_profl_{tag}_{i}", each
            ),
            each,
        ),
        "limit",
    )


# --- several processes -------------------------------------------------------------------------


def bench_processes(directory: Path) -> None:
    """Durable runs/s with 1, 2 and 4 processes on one SQLite file (and on PostgreSQL
    when a server is configured), beside the single-process raw limits."""
    total = _n(8_000, 800)
    limit = _median_run(
        [
            trio.run(
                _limits.sqlite_claim_save_limit, str(directory / f"rawm{i}.db"), total
            )
            for i in range(3)
        ]
    )
    for processes in (1, 2, 4):
        ours = _processes.runs_per_second(
            str(directory / f"procs{processes}.db"), processes, total
        )
        _report(
            f"durable runs/s, {processes} process(es), SQLite",
            ours.rate,
            "runs/s",
            limit[0],
            "honest limit (raw trio + sqlite3, 1 process)",
        )
        print(ours.limits(), flush=True)
    dsn = _postgres_dsn()
    if dsn is None:
        return
    import psycopg

    tag = f"{os.getpid()}_{time.monotonic_ns()}"
    raw = trio.run(_limits.postgres_claim_save_limit, dsn, f"bench_rawm_{tag}", total)
    for processes in (1, 2, 4):
        schema = f"bench_procs_{tag}_{processes}"
        try:
            ours = _processes.runs_per_second(dsn, processes, total, schema)
        finally:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        _report(
            f"durable runs/s, {processes} process(es), PostgreSQL",
            ours.rate,
            "runs/s",
            raw[0],
            "honest limit (pipelined psycopg, 1 process)",
        )
        print(ours.limits(), flush=True)


# --- inbox -------------------------------------------------------------------------------------


def _report_latency(name: str, seconds: list[float], target: str = "") -> None:
    p50, p99 = _inbox.percentiles(seconds)
    line = (
        f"{name:<34} p50 {p50:>7.1f} ms   p99 {p99:>7.1f} ms   ({len(seconds)} posts)"
    )
    print(line + (f"   [{target}]" if target else ""), flush=True)


def bench_inbox(directory: Path) -> None:
    total = _n(20_000, 1_000)
    limit = sorted(
        trio.run(_inbox.raw_post_limit, str(directory / f"rawpost{i}.db"), total)
        for i in range(3)
    )[1]
    ours = sorted(
        trio.run(
            _inbox.posts_per_second,
            phronomy.SQLiteStore(directory / f"posts{i}.db"),
            total,
        )
        for i in range(3)
    )[1]
    _report(
        "durable posts/s (SQLite, 64)",
        ours,
        "posts/s",
        limit,
        "raw limit (trio + sqlite3 insert)",
        "target ratio >= 0.50",
    )
    count = _n(400, 40)
    here = str(Path(__file__).parent)
    _report_latency(
        "post to applied, same process",
        trio.run(
            _inbox.latency_here, phronomy.SQLiteStore(directory / "lat.db"), count
        ),
    )
    _report_latency(
        "post to applied, other process",
        _inbox.latency_across(f"sqlite:{directory / 'latx.db'}", count, here),
        "SQLite: poll every 0.1 s",
    )
    dsn = _postgres_dsn()
    if dsn is not None:
        import psycopg

        schema = f"bench_inbox_{os.getpid()}_{time.monotonic_ns()}"
        try:
            _report_latency(
                "post to applied, other process",
                _inbox.latency_across(f"postgres:{schema}:{dsn}", count, here),
                "PostgreSQL, NOTIFY: target p99 <= 20 ms",
            )
        finally:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    runs = _n(10_000, 1_000)
    on, off = (
        _median_run(
            [
                trio.run(
                    _durable_runs, str(directory / f"quiet{poll}{i}.db"), runs, poll
                )
                for i in range(3)
            ]
        )
        for poll in (0.1, 0.0)
    )
    _report(
        "durable runs/s, inbox poll on",
        on[0],
        "runs/s",
        off[0],
        "poll off",
        "no events: target ratio >= 0.95",
    )


# --- timers ------------------------------------------------------------------------------------


def bench_timers(directory: Path) -> None:
    _timers.bench(directory, _n, _report, _postgres_dsn())


# --- retries -------------------------------------------------------------------------------------


def succeed(value: int) -> int:
    """An effect that succeeds at once (its first attempt)."""
    return value


def _effect_flow(effect: bool, policy: phronomy.RetryPolicy | None) -> Any:
    name = f"retry-bench-{effect}-{policy is not None}"
    wf = phronomy.Workflow(Counter, name=name)
    if effect:
        wf.state(
            "run",
            entry=lambda s, e, fx: fx.offload(succeed, 1, on_done="done", retry=policy),
        )
        wf.transition("run", phronomy.FINISH, on="done")
    else:
        wf.state("run", entry=lambda s: s.merge(n=1))
        wf.transition("run", phronomy.FINISH)
    return wf.build()


async def _effect_runs(path: Path, flow: Any, total: int) -> float:
    async with phronomy.open_runtime(store=phronomy.SQLiteStore(path)) as runtime:
        return await _runs(runtime, flow, total, 64, path.stem)


def bench_retries(directory: Path) -> None:
    """A retry policy on an effect that succeeds at once, against the same effect
    without one and against no effect (durable runs on SQLite, 64 callers, three
    interleaved passes): what the policy adds, as a share of the effect's cost."""
    total = _n(4_000, 400)
    policy = phronomy.RetryPolicy(max_attempts=5, initial_interval=1.0)
    variants = {
        "none": _effect_flow(False, None),
        "effect": _effect_flow(True, None),
        "policy": _effect_flow(True, policy),
    }
    rates: dict[str, list[float]] = {name: [] for name in variants}
    for attempt in range(3):
        for name, flow in variants.items():
            path = directory / f"retries-{name}-{attempt}.db"
            rates[name].append(trio.run(_effect_runs, path, flow, total))
    per_run = {name: 1e6 / statistics.median(r) for name, r in rates.items()}
    effect_cost = per_run["effect"] - per_run["none"]
    policy_cost = per_run["policy"] - per_run["effect"]
    _report(
        "durable runs/s, effect with a policy",
        statistics.median(rates["policy"]),
        "runs/s",
        statistics.median(rates["effect"]),
        "the same effect without one",
    )
    print(
        f"  a policy on an effect that succeeds adds {policy_cost:+.1f} us per run; "
        f"the effect costs {effect_cost:.1f} us: {policy_cost / effect_cost:+.1%} "
        "of it   [target <= 5%]",
        flush=True,
    )


# --- executions --------------------------------------------------------------------------------


async def _executions(total: int) -> tuple[float, float, float]:
    async with phronomy.open_runtime() as runtime:
        numbers = iter(range(total))

        async def worker() -> None:
            for i in numbers:
                await runtime.executions.invoke(f"agent-{i}", [int], "1")

        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(16):
                nursery.start_soon(worker)
        ours = total / (time.perf_counter() - started)

        raw_numbers = iter(range(total))

        async def raw_worker() -> None:
            for _ in raw_numbers:
                await trio.to_thread.run_sync(int, "1")

        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(16):
                nursery.start_soon(raw_worker)
        raw = total / (time.perf_counter() - started)

        execution = runtime.executions.start("slow", [lambda v: time.sleep(0.5)])
        await trio.sleep(0.05)
        cancelled_at = trio.current_time()
        execution.cancel()
        with contextlib.suppress(phronomy.CancellationError):
            await execution.result()
        latency = trio.current_time() - cancelled_at
        return ours, raw, latency


def _step(value: int) -> int:
    return value + 1


async def _durable_executions(path: str, total: int) -> float:
    """Durable 3-step executions/s on SQLite, 64 concurrent callers (one claim and
    one fenced save per step: each step's result is durable before the next runs)."""
    async with phronomy.open_runtime(store=phronomy.SQLiteStore(path)) as runtime:
        numbers = iter(range(total))

        async def worker() -> None:
            for i in numbers:
                result = await runtime.executions.invoke(f"agent-{i}", [_step] * 3, 0)
                assert result.value == 3, result

        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(64):
                nursery.start_soon(worker)
        return total / (time.perf_counter() - started)


def bench_executions(directory: Path) -> None:
    total = _n(3_000, 500)
    durable, runs = (
        statistics.median(results)
        for results in zip(
            *(
                (
                    trio.run(
                        _durable_executions, str(directory / f"exec{i}.db"), total
                    ),
                    trio.run(_durable_runs, str(directory / f"execr{i}.db"), total)[0],
                )
                for i in range(3)
            ),
            strict=True,
        )
    )
    _report(
        "durable 3-step executions/s (SQLite)",
        durable,
        "exec/s",
        runs / 2,
        "durable runs/s x 2 writes / 4 writes (1 claim + 3 saves per execution)",
    )
    ours, raw, latency = trio.run(_executions, 1000)
    _report(
        "trivial executions/s (1,000)", ours, "exec/s", raw, "raw to_thread round trips"
    )
    print(
        f"{'  per execution':<34} {1e6 / ours:>14,.0f} us   | raw: {1e6 / raw:,.0f} us",
        flush=True,
    )
    print(
        f"{'cancel -> settled, 0.5 s tool':<34} {latency:>14.3f} s    | the tool had 0.45 s left [never earlier]",
        flush=True,
    )


# --- lifecycle --------------------------------------------------------------------------------


def _chain(steps: int) -> phronomy.WorkflowDefinition[Counter]:
    wf = phronomy.Workflow(Counter, name="chain").state("spin")
    wf.transition(
        "spin", "spin", guard=lambda s: s.n < steps, action=lambda s: s.merge(n=s.n + 1)
    )
    wf.transition("spin", phronomy.FINISH)
    return wf.build()


async def _watched_runs(runs: int, steps: int, watched: bool) -> float:
    flow = _chain(steps)
    async with phronomy.open_runtime() as runtime:
        started = time.perf_counter()
        for i in range(runs):
            iid = f"chain-{i}"
            if not watched:
                await runtime.workflows.invoke(
                    flow, workflow_instance_id=iid, recursion_limit=steps * 2
                )
                continue
            async with runtime.workflows.watch(
                flow, iid, buffer=steps * 2, if_missing="wait"
            ) as updates:
                await runtime.workflows.invoke(
                    flow, workflow_instance_id=iid, recursion_limit=steps * 2
                )
                async for update in updates:
                    if update.status == "finished":
                        break
        return time.perf_counter() - started


async def _portal_calls(calls: int) -> tuple[float, float]:
    async with phronomy.open_runtime() as runtime:
        token = runtime.trio_token

        def portal() -> float:
            started = time.perf_counter()
            for _ in range(calls):
                runtime.from_thread.run_sync(int)
            return time.perf_counter() - started

        def raw() -> float:
            started = time.perf_counter()
            for _ in range(calls):
                trio.from_thread.run_sync(int, trio_token=token)
            return time.perf_counter() - started

        return (
            await trio.to_thread.run_sync(portal),
            await trio.to_thread.run_sync(raw),
        )


def bench_lifecycle() -> None:
    runs, steps = _n(20, 2), 1000
    plain = statistics.median(
        trio.run(_watched_runs, runs, steps, False) for _ in range(3)
    )
    watched = statistics.median(
        trio.run(_watched_runs, runs, steps, True) for _ in range(3)
    )
    states = runs * (steps + 2)
    print(
        f"{'watch, per stable state':<34} {(watched - plain) / states * 1e6:>14.2f} us"
        f"   | the run without a watcher: {plain / states * 1e6:.2f} us per state",
        flush=True,
    )
    calls = _n(20_000, 2_000)
    portal, raw = trio.run(_portal_calls, calls)
    _report(
        "portal calls/s (run_sync)",
        calls / portal,
        "calls/s",
        calls / raw,
        "raw trio.from_thread.run_sync",
    )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks."""
    global QUICK
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args(argv)
    QUICK = args.quick
    print(
        f"phronomy {phronomy.__version__}, Python {sys.version.split()[0]}, trio {trio.__version__}, SQLite {sqlite3.sqlite_version}"
    )
    with tempfile.TemporaryDirectory(prefix="phronomy-bench-") as tmp:
        directory = Path(tmp)
        benches: dict[str, Callable[[], object]] = {
            "dispatcher": bench_dispatcher,
            "workflows": bench_workflows,
            "durable": lambda: bench_durable(directory),
            "resume": lambda: bench_resume(directory),
            "postgres": bench_postgres,
            "processes": lambda: bench_processes(directory),
            "executions": lambda: bench_executions(directory),
            "inbox": lambda: bench_inbox(directory),
            "timers": lambda: bench_timers(directory),
            "retries": lambda: bench_retries(directory),
            "lifecycle": bench_lifecycle,
            "telemetry": lambda: _otel.bench(directory, three_steps(), _n(5_000, 500)),
            "memory": lambda: _memory.bench(directory, QUICK),
        }
        for name, bench in benches.items():
            if args.only is None or name in args.only:
                bench()
    return 0


if __name__ == "__main__":
    sys.exit(main())
