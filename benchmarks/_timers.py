"""The timers' benchmarks: what pending timers cost an idle runtime (CPU per poll and
per second, memory, the size they take, the plans of the two timer queries), beside
the same runtime with none; and 10,000 timers due at one instant (5,000 on
PostgreSQL, which applies them slower), fired into their inboxes and applied, beside as
many events posted to the same kind of halted instances in one transaction.

The instances are made as a runtime's halting save makes them (the workflow's
snapshot and version, its timeout's timer ``after:<ms>:awaiting``), through the store's
saves in large batches. On PostgreSQL, whose saves are slower, the first of the 100,000
pending timers are armed that way and the rest copied from those rows in SQL (the
instances' rows with their snapshots, and their timers).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sqlite3
import statistics
import time
import tracemalloc
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import trio

import phronomy
from phronomy.storage import (
    FireOp,
    NextDueOp,
    Posting,
    PostOp,
    SaveOp,
    SaveRequest,
    TimerSpec,
    encode_snapshot,
)
from phronomy.storage._sql_timers import TIMER_STATEMENTS
from phronomy.workflow import _poller

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    Store = phronomy.SQLiteStore | phronomy.PostgresStore

DAY_MS = 86_400_000
AFTER_MS = 2_000
"""The timeout of the firing benchmark's wait state (its timers' names say so; the
delay each is armed with makes them all due at one instant)."""
BATCH = 5_000
"""Saves per store batch (one transaction)."""
IDLE_WINDOWS = (3, 1.0)
"""An idle runtime is measured over this many windows of this many seconds (the
median window counts)."""
OWNER = "timers-bench-reader"
"""The lease owner the timer queries are explained and timed for."""


class Waiting(phronomy.State):
    n: int = 0


def _moved(state: Waiting) -> Waiting:
    return state.merge(n=state.n + 1)


def timeout_flow(
    after_ms: int, name: str = "timers-bench"
) -> phronomy.WorkflowDefinition[Waiting]:
    """``awaiting`` (a wait state) -after *after_ms*, or ``nudge``-> ``moved`` (a wait
    state) -``done``-> FINISH."""
    wf = phronomy.Workflow(Waiting, name=name)
    wf.wait_state("awaiting")
    wf.wait_state("moved")
    after = timedelta(milliseconds=after_ms)
    wf.transition("awaiting", "moved", after=after, action=_moved)
    wf.transition("awaiting", "moved", on="nudge", action=_moved)
    wf.transition("moved", phronomy.FINISH, on="done")
    return wf.build()


def _halted(
    flow: phronomy.WorkflowDefinition[Waiting], iid: str, delay_ms: int | None
) -> SaveOp:
    """The save that makes *iid* halted at ``awaiting``, as a runtime's save does, with
    its timeout's timer armed *delay_ms* from now (``None``: no timer)."""
    (ms,) = flow.timeouts["awaiting"]
    timer = TimerSpec(
        name=f"after:{ms}:awaiting",
        delay_ms=delay_ms or 0,
        event=f"__after_{ms}ms__",
        kind="timeout",
        state="awaiting",
    )
    return SaveOp(
        request=SaveRequest(
            workflow_instance_id=iid,
            expected_revision=None,
            snapshot=encode_snapshot(
                Waiting(),
                workflow_instance_id=iid,
                revision=1,
                phase="awaiting",
                workflow=flow.name,
            ),
            write_id=f"w-{iid}",
            status="halted",
            phase="awaiting",
            workflow=flow.name,
            definition_version=flow.version,
            arm=() if delay_ms is None else (timer,),
        )
    )


def _save(
    store: Store,
    flow: phronomy.WorkflowDefinition[Waiting],
    ids: list[str],
    delay_ms: Callable[[], int | None],
    batch: int = BATCH,
) -> float:
    """Save *ids* halted, in batches (*delay_ms* is asked once per batch); returns the
    seconds it took."""
    started = time.perf_counter()
    for k in range(0, len(ids), batch):
        delay = delay_ms()
        ops = [_halted(flow, iid, delay) for iid in ids[k : k + batch]]
        for result in store.execute(ops):
            assert result.unwrap().outcome == "success"
    return time.perf_counter() - started


# --- reading the store's tables ----------------------------------------------------------------


class _Tables:
    """Reads of the store's tables (its own connection): SQLite."""

    name = "SQLite"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.stores: list[Store] = []
        self.conn: Any = sqlite3.connect(
            path, isolation_level=None, check_same_thread=False
        )
        self.param = "?"

    def store(self, clock: Callable[[], int] | None = None) -> Store:
        store = phronomy.SQLiteStore(self.path, clock=clock)
        self.stores.append(store)
        store.open()  # its tables made: not timed with the first saves
        return store

    def now_ms(self) -> int:
        """The store's clock."""
        return int(time.time() * 1000)

    def rows(self, query: str, *args: Any) -> list[tuple[Any, ...]]:
        query = query.replace("%s", self.param)
        rows: list[tuple[Any, ...]] = self.conn.execute(query, args).fetchall()
        return rows

    def moved(self, prefix: str) -> int:
        """Instances (ids beginning with *prefix*) that reached ``moved``."""
        ((count,),) = self.rows(
            "SELECT count(*) FROM phronomy_workflow_instances "
            "WHERE phase = 'moved' AND instance_id LIKE %s",
            prefix + "%",
        )
        return int(count)

    def due_times(self, prefix: str) -> dict[str, int]:
        rows = self.rows(
            "SELECT instance_id, due_at_ms FROM phronomy_timers WHERE instance_id LIKE %s",
            prefix + "%",
        )
        return {iid: int(due) for iid, due in rows}

    def entries(self, prefix: str) -> list[tuple[Any, ...]]:
        """``(instance, event_id, status, revision, stored_at_ms, consumed_at_ms)``."""
        return self.rows(
            "SELECT instance_id, event_id, status, revision, stored_at_ms, "
            "consumed_at_ms FROM phronomy_inbox WHERE instance_id LIKE %s",
            prefix + "%",
        )

    def size(self, timers: int) -> str:
        files = sum(
            os.path.getsize(f"{self.path}{suffix}")
            for suffix in ("", "-wal")
            if os.path.exists(f"{self.path}{suffix}")
        )
        try:
            ((table,),) = self.rows(
                "SELECT sum(pgsize) FROM dbstat WHERE name IN ('phronomy_timers', "
                "'phronomy_timers_due', 'sqlite_autoindex_phronomy_timers_1')"
            )
        except sqlite3.Error:
            return f"store file {files / 1e6:,.1f} MB"
        return (
            f"store file {files / 1e6:,.1f} MB, timers table + indexes "
            f"{table / 1e6:,.1f} MB ({table / timers:,.0f} B per timer)"
        )

    def grow(self, prefix: str, copies: int) -> None:
        raise NotImplementedError  # SQLite's saves are fast enough

    def plans(self, workflows: tuple[str, ...]) -> dict[str, list[str]]:
        """The query plans of the next-due read and the due-timers read."""
        params = {
            "owner": OWNER,
            "workflows": json.dumps(workflows),
            "now": self.now_ms(),
            "limit": 500,
        }
        return {
            name: [
                row[3]
                for row in self.conn.execute(
                    "EXPLAIN QUERY PLAN " + getattr(TIMER_STATEMENTS, name), params
                )
            ]
            for name in ("next_due", "due")
        }

    def close(self) -> None:
        for store in self.stores:
            store.close()
        self.conn.close()


class _PostgresTables(_Tables):
    """Reads of the store's tables: PostgreSQL (a schema of its own)."""

    name = "PostgreSQL"

    def __init__(self, dsn: str, schema: str) -> None:
        import psycopg

        self.dsn, self.schema = dsn, schema
        self.param = "%s"
        self.stores: list[Store] = []
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.conn.execute(f"CREATE SCHEMA {schema}")
        self.conn.execute(f"SET search_path = {schema}")

    def store(self, clock: Callable[[], int] | None = None) -> Store:
        assert clock is None  # the server's clock
        store = phronomy.PostgresStore(self.dsn, schema=self.schema)
        self.stores.append(store)
        store.open()
        return store

    def now_ms(self) -> int:
        ((now,),) = self.rows(
            "SELECT (extract(epoch from clock_timestamp()) * 1000)::bigint"
        )
        return int(now)

    def size(self, timers: int) -> str:
        ((total, indexes, schema),) = self.rows(
            "SELECT pg_total_relation_size('phronomy_timers'), "
            "pg_indexes_size('phronomy_timers'), "
            "(SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class AS c "
            "JOIN pg_namespace AS n ON n.oid = c.relnamespace "
            "WHERE n.nspname = current_schema() AND c.relkind = 'r')"
        )
        return (
            f"schema {int(schema) / 1e6:,.1f} MB, timers table + indexes "
            f"{total / 1e6:,.1f} MB (indexes {indexes / 1e6:,.1f} MB; "
            f"{total / timers:,.0f} B per timer)"
        )

    def grow(self, prefix: str, copies: int) -> None:
        """Copy the instances whose ids begin with *prefix*, with their timers, *copies*
        times (ids ``<id>~<k>``; each snapshot names its copy)."""
        for table in ("phronomy_workflow_instances", "phronomy_timers"):
            columns = [
                c
                for (c,) in self.rows(
                    "SELECT column_name FROM information_schema.columns WHERE "
                    "table_schema = current_schema() AND table_name = %s "
                    "ORDER BY ordinal_position",
                    table,
                )
                if c != "instance_id"
            ]
            values = [
                "convert_to(replace(convert_from(snapshot, 'UTF8'), "
                "'\"' || instance_id || '\"', '\"' || instance_id || '~' || k || '\"'), "
                "'UTF8')"
                if c == "snapshot"
                else c
                for c in columns
            ]
            self.conn.execute(
                f"INSERT INTO {table} (instance_id, {', '.join(columns)}) "
                f"SELECT instance_id || '~' || k, {', '.join(values)} FROM {table}, "
                "generate_series(1, %s) AS k WHERE instance_id LIKE %s",
                (copies, prefix + "%"),
            )

    def plans(self, workflows: tuple[str, ...]) -> dict[str, list[str]]:
        from phronomy.storage._postgres_schema import STATEMENTS

        self.conn.execute("ANALYZE phronomy_timers")
        self.conn.execute("ANALYZE phronomy_workflow_instances")
        params = {"owner": OWNER, "workflows": json.dumps(workflows), "limit": 500}
        return {
            name: [
                row[0]
                for row in self.conn.execute(
                    "EXPLAIN " + getattr(STATEMENTS.timers, name), params
                )
            ]
            for name in ("next_due", "due")
        }

    def close(self) -> None:
        for store in self.stores:
            store.close()
        self.conn.execute(f"DROP SCHEMA {self.schema} CASCADE")
        self.conn.close()


# --- an idle runtime ---------------------------------------------------------------------------


@contextlib.contextmanager
def _counted_polls() -> Iterator[list[int]]:
    """Count the runtime's inbox polls (each reads when the next timer is due)."""
    count = [0]
    poll_once = _poller.poll_once

    async def counting(coordinator: Any) -> float:
        count[0] += 1
        return await poll_once(coordinator)

    _poller.poll_once = counting
    try:
        yield count
    finally:
        _poller.poll_once = poll_once


async def _idle(
    store: Store, flow: phronomy.WorkflowDefinition[Waiting]
) -> tuple[float, float, float]:
    """A runtime serving *flow* that has nothing to do (after 0.5 s to settle), over
    ``IDLE_WINDOWS``. Returns, of the median window: its CPU seconds per second and
    per poll, and polls/s."""
    windows = []
    with _counted_polls() as polls:
        async with phronomy.open_runtime(store=store, workflows=[flow]):
            await trio.sleep(0.5)
            for _ in range(IDLE_WINDOWS[0]):
                before, cpu = polls[0], time.process_time()
                started = time.perf_counter()
                await trio.sleep(IDLE_WINDOWS[1])
                elapsed = time.perf_counter() - started
                cpu, made = time.process_time() - cpu, polls[0] - before
                windows.append((cpu / elapsed, cpu / max(made, 1), made / elapsed))
    return sorted(windows)[len(windows) // 2]


def _rss() -> int:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def _memory(
    store: Store, flow: phronomy.WorkflowDefinition[Waiting]
) -> tuple[int, int]:
    """Bytes the runtime allocated (traced Python objects, and the process's RSS)
    after a second of serving *flow* idle, from before it opened."""
    gc.collect()
    tracemalloc.start()
    try:
        traced, rss = tracemalloc.get_traced_memory()[0], _rss()
        async with phronomy.open_runtime(store=store, workflows=[flow]):
            await trio.sleep(1.0)
            gc.collect()
            return tracemalloc.get_traced_memory()[0] - traced, _rss() - rss
    finally:
        tracemalloc.stop()


def _next_due_us(store: Store, workflows: tuple[str, ...], times: int = 21) -> float:
    """The median time of the store's next-due read (a poll's timer query)."""
    op = NextDueOp(owner=OWNER, workflows=workflows)
    took = []
    for _ in range(times):
        started = time.perf_counter()
        store.run(op)
        took.append(time.perf_counter() - started)
    return statistics.median(took) * 1e6


def _fire_us(store: Store, workflows: tuple[str, ...]) -> float:
    """The median time of the store's firing write when nothing is due."""
    op = FireOp(owner=OWNER, workflows=workflows)
    times = []
    for _ in range(11):
        started = time.perf_counter()
        assert store.run(op) == 0
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def _line(name: str, text: str) -> None:
    print(f"{name:<34} {text}", flush=True)


def pending(
    tables: _Tables, total: int, through_saves: int, n: Any, report: Any
) -> float:
    """*total* timers not due for a day: an idle runtime's CPU and memory beside none;
    returns the arming saves/s."""
    flow = timeout_flow(DAY_MS)
    other = timeout_flow(DAY_MS, "timers-bench-other")
    plain = timeout_flow(DAY_MS, "timers-bench-plain")
    store = tables.store()
    plains = n(20_000, 2_000) if tables.name == "SQLite" else n(5_000, 1_000)
    plain_s = _save(store, plain, [f"plain-{i}" for i in range(plains)], lambda: None)
    served = (flow.name,)
    idle = {0: trio.run(_idle, store, flow)}
    memory = {0: trio.run(_memory, store, flow)}
    reads = {0: _next_due_us(store, served)}
    fires = {0: _fire_us(store, served)}
    ids = [f"pending-{i:06d}" for i in range(through_saves)]
    armed_s = _save(store, flow, ids[:1_000], lambda: DAY_MS)
    idle[1_000] = trio.run(_idle, store, flow)
    armed_s += _save(store, flow, ids[1_000:], lambda: DAY_MS)
    if total > through_saves:
        tables.grow("pending-", total // through_saves - 1)
    size = tables.size(total)
    idle[total] = trio.run(_idle, store, flow)
    memory[total] = trio.run(_memory, store, flow)
    reads[total] = _next_due_us(store, served)
    fires[total] = _fire_us(store, served)
    unserved = trio.run(_idle, store, other)
    unserved_read = _next_due_us(store, (other.name,), 5)
    plans = tables.plans(served)

    on = f"({tables.name})"
    rate = through_saves / armed_s
    report(
        f"saves arming a timer/s {on}",
        rate,
        "saves/s",
        plains / plain_s,
        "the same saves arming none",
    )
    _line(f"  {total:,} pending timers", size)
    for count in (1_000, total):
        report(
            f"idle CPU, {count:,} timers {on}",
            idle[count][0] * 1e6,
            "us/s",
            idle[0][0] * 1e6,
            "0 timers",
            "must stay flat",
        )
    per = f"{idle[total][2]:.1f} polls/s vs {idle[0][2]:.1f}"
    report(
        f"  CPU per poll, {total:,} timers",
        idle[total][1] * 1e6,
        "us",
        idle[0][1] * 1e6,
        "0 timers",
        per,
    )
    report(
        f"  next-due read, {total:,} timers",
        reads[total],
        "us",
        reads[0],
        "0 timers",
    )
    report(
        f"  firing write, none due, {total:,}",
        fires[total],
        "us",
        fires[0],
        "0 timers",
    )
    report(
        f"idle CPU, {total:,} not served",
        unserved[0] * 1e6,
        "us/s",
        idle[0][0] * 1e6,
        "0 timers",
        f"another workflow's timers; {unserved[2]:.1f} polls/s",
    )
    report(
        f"  next-due read, {total:,} not served",
        unserved_read,
        "us",
        reads[0],
        "0 timers",
    )
    (traced0, rss0), (traced, rss) = memory[0], memory[total]
    _line(
        f"idle runtime memory, {total:,} timers",
        f"{traced / 1024:>+10,.0f} KiB traced, {rss / 1024:+,.0f} KiB RSS   | "
        f"0 timers: {traced0 / 1024:+,.0f} KiB traced, {rss0 / 1024:+,.0f} KiB RSS",
    )
    for name, label in (("next_due", "next due (poll)"), ("due", "due timers (fire)")):
        lines = plans[name]
        if tables.name == "SQLite":
            _line(f"  plan: {label}", "; ".join(lines))
        else:
            _line(f"  plan: {label}", "(after ANALYZE)")
            for text in lines:
                print(f"      {text}", flush=True)
    return rate


# --- timers due at one instant -----------------------------------------------------------------


def _percentiles(ms: list[float]) -> tuple[float, float]:
    cuts = statistics.quantiles(ms, n=100, method="inclusive")
    return cuts[49], cuts[98]


async def _until_moved(tables: _Tables, prefix: str, total: int, limit: float) -> int:
    """Wait (at most *limit* seconds) until *total* instances reached ``moved``."""
    moved = 0
    with trio.move_on_after(limit):
        while moved < total:
            await trio.sleep(0.05)
            moved = await trio.to_thread.run_sync(tables.moved, prefix)
    return moved


async def _fire_and_post(
    tables: _Tables,
    flow: phronomy.WorkflowDefinition[Waiting],
    total: int,
    due_ms: int,
) -> tuple[int, int, float]:
    """An idle runtime until the ``due-`` timers (due at *due_ms*) are applied, then
    *total* events posted at once (one transaction) to the ``posted-`` instances.
    Returns how many of each moved on, and the CPU seconds of the firing."""
    store = tables.store()
    async with phronomy.open_runtime(store=store, workflows=[flow]):
        wait = (due_ms - tables.now_ms()) / 1000
        await trio.sleep(max(wait - 0.2, 0))
        cpu = time.process_time()
        fired = await _until_moved(tables, "due-", total, 60 + total / 100)
        cpu = time.process_time() - cpu
        postings = [
            PostOp(
                posting=Posting(
                    workflow_instance_id=f"posted-{i:05d}",
                    event_id=f"nudge-{i}",
                    event="nudge",
                    payload=b"null",
                )
            )
            for i in range(total)
        ]
        poster = tables.store()
        await trio.to_thread.run_sync(poster.execute, postings)
        posted = await _until_moved(tables, "posted-", total, 60 + total / 100)
    return fired, posted, cpu


def due_at_once(tables: _Tables, total: int, arming_rate: float, report: Any) -> None:
    """*total* timers due at one instant (on an idle runtime), fired and applied."""
    flow = timeout_flow(AFTER_MS, "timers-fire")
    frozen = tables.name == "SQLite"  # its saves arm at one instant: one due time
    start = [tables.now_ms()]
    setup = tables.store(clock=(lambda: start[0]) if frozen else None)
    _save(setup, flow, [f"posted-{i:05d}" for i in range(total)], lambda: None)
    # due once they are armed (at the rate measured, with a margin)
    start[0] = tables.now_ms()
    due_ms = start[0] + int(1000 * (1.3 * total / arming_rate + 1.0))
    _save(
        setup,
        flow,
        [f"due-{i:05d}" for i in range(total)],
        lambda: max(due_ms - (start[0] if frozen else tables.now_ms()), 0),
        batch=BATCH if frozen else 250,
    )
    due = tables.due_times("due-")
    assert len(due) == total
    late_setup = tables.now_ms() - min(due.values())
    fired, posted, cpu = trio.run(_fire_and_post, tables, flow, total, due_ms)

    on = f"({tables.name})"
    timers = [e for e in tables.entries("due-") if e[0] in due]
    events = tables.entries("posted-")
    wrong = [
        e
        for e in timers
        if e[1] != f"timer:after:{AFTER_MS}:awaiting@1" or e[2:4] != ("transitioned", 2)
    ]
    left = len(tables.due_times("due-"))  # leaving the state disarms nothing left
    if fired < total or len(timers) != total or wrong or left:
        _line(
            f"timers due at once {on}",
            f"FAILED: {fired:,} of {total:,} moved on, {len(timers):,} entries, "
            f"{len(wrong):,} not applied once as the timeout, {left:,} timers left: "
            f"{wrong[:3]}",
        )
        return
    first_due = min(due.values())
    done = max(e[5] for e in timers)
    rate = total / max((done - first_due) / 1000, 1e-3)
    limit = 0.0
    if posted == total and len(events) == total:
        limit = total / max(
            (max(e[5] for e in events) - max(e[4] for e in events)) / 1000, 1e-3
        )
    report(
        f"timers due at once: applied/s {on}",
        rate,
        "timers/s",
        limit or None,
        f"{total:,} events posted at once",
    )
    spread = max(due.values()) - first_due
    _line(
        f"  {total:,} timers",
        f"due within {spread:,} ms; first due to last applied {done - first_due:,} ms; "
        f"CPU per timer {cpu / total * 1e6:,.0f} us"
        + (f"; SETUP RAN {late_setup:,} ms PAST DUE" if late_setup > 0 else ""),
    )
    for name, column in (("due to fired (stored)", 4), ("due to applied", 5)):
        p50, p99 = _percentiles([e[column] - due[e[0]] for e in timers])
        _line(
            f"  lateness, {name}",
            f"p50 {p50:>7.1f} ms   p99 {p99:>7.1f} ms   ({total:,} timers, real clock)",
        )


def bench(directory: Path, n: Any, report: Any, postgres_dsn: str | None) -> None:
    """The timers section: SQLite, then PostgreSQL when a server is configured (each
    part on a store of its own)."""
    backends: list[Callable[[str], _Tables]] = [
        lambda part: _Tables(directory / f"timers-{part}.db")
    ]
    if postgres_dsn is not None:
        tag = f"{os.getpid()}_{time.monotonic_ns()}"
        backends.append(
            lambda part: _PostgresTables(postgres_dsn, f"bench_timers_{tag}_{part}")
        )
    else:
        _line(
            "timers (PostgreSQL)",
            "skipped: set PHRONOMY_BENCH_POSTGRES_DSN "
            '(or eval "$(scripts/postgres-test-server start)")',
        )
    for make in backends:
        with contextlib.closing(make("pending")) as tables:
            total = n(100_000, 5_000)
            through = total if tables.name == "SQLite" else n(5_000, 1_000)
            rate = pending(tables, total, through, n, report)
        with contextlib.closing(make("fire")) as tables:
            # PostgreSQL applies them ~5x slower: half as many keep the run short
            due = n(10_000, 1_000) if tables.name == "SQLite" else n(5_000, 1_000)
            due_at_once(tables, due, rate, report)
