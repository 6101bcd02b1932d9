"""A paused owner (SIGSTOP past its lease, then SIGCONT) runs nothing of its segments.

Before: only the heartbeat compared the lease deadline with the clock, so the timer
events queued while the process was stopped reached their sessions first: a zombie ran
actions (40 of 60 instances, within ~5 ms of waking) after another runtime had taken
its instances over. Its writes were refused; its side effects were not.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

import pytest
import trio

import phronomy

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

INSTANCES = 20
TTL, HEARTBEAT, MARGIN = 1.0, 0.2, 0.3

_ZOMBIE = r"""
import os, sys, time, trio, phronomy
from phronomy.durability import HeldLease, Leases

if os.environ.get("ZOMBIE_BROKEN"):  # the negative control: the old, unchecked path
    HeldLease.lapsed = lambda self: False
    Leases._expire = lambda self, now: None

class Tick(phronomy.State):
    n: int = 0

def act(state, event, effects):
    began = time.monotonic()  # an action begun before the pause may end after it
    with open(sys.argv[2], "a") as log:
        log.write(f"{os.getpid()} {began:.6f}\n")
    effects.schedule(0.02, "tick")
    return state.merge(n=state.n + 1)

wf = phronomy.Workflow(Tick, name="ticker")
wf.state("ticking", entry=act)
wf.transition("ticking", "ticking", on="tick")
flow = wf.build()

def store():
    if sys.argv[1].startswith("postgresql://"):
        return phronomy.PostgresStore(sys.argv[1], schema=sys.argv[3])
    return phronomy.SQLiteStore(sys.argv[1])

async def main():
    async with phronomy.open_runtime(
        store=store(), lease_ttl=float(sys.argv[4]),
        heartbeat_interval=float(sys.argv[5]), lease_margin=float(sys.argv[6]),
        sweep_interval=0, shutdown_timeout=0.5,
    ) as rt:
        ids = [f"z-{i}" for i in range(int(sys.argv[7]))]
        for iid in ids:
            rt.workflows.start(flow, workflow_instance_id=iid)
        while any(
            (s := rt.workflows.segment(iid)) is None or s.status != "executing"
            for iid in ids
        ):
            await trio.sleep(0.01)
        print("live", flush=True)
        await trio.sleep_forever()

trio.run(main)
"""


def _actions(log: Path, pid: int, after: float) -> int:
    """Actions process *pid* began after *after* (monotonic seconds)."""
    if not log.exists():
        return 0
    count = 0
    for line in log.read_text().splitlines():
        who, at = line.split()
        if int(who) == pid and float(at) > after:
            count += 1
    return count


def _holds_no_lock(target: str, schema: str) -> bool:
    """Whether the stopped process holds no write lock (it was not mid-transaction)."""
    if target.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(target, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_locks l JOIN pg_class c ON l.relation = c.oid "
                "JOIN pg_namespace n ON c.relnamespace = n.oid WHERE n.nspname = %s "
                "AND l.mode = 'RowExclusiveLock'",
                (schema,),
            ).fetchone()
            return row is not None and row[0] == 0
    lite = sqlite3.connect(target, timeout=0.2, isolation_level=None)
    try:
        lite.execute("BEGIN IMMEDIATE")
        lite.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        lite.close()


def _scenario(
    target: str, schema: str, log: Path, open_store: Callable[[], Any], broken: bool
) -> dict[str, Any]:
    env = dict(os.environ)
    if broken:
        env["ZOMBIE_BROKEN"] = "1"
    zombie = subprocess.Popen(
        [sys.executable, "-c", _ZOMBIE, target, str(log), schema]
        + [str(v) for v in (TTL, HEARTBEAT, MARGIN, INSTANCES)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert zombie.stdout is not None
        assert zombie.stdout.readline().strip() == "live"
        time.sleep(0.2)  # ticking
        for _ in range(50):  # stop it between two transactions (a stall is elsewhere)
            os.kill(zombie.pid, signal.SIGSTOP)
            if _holds_no_lock(target, schema):
                break
            os.kill(zombie.pid, signal.SIGCONT)
            time.sleep(0.01)
        else:
            pytest.fail("could not stop the process outside a transaction")
        stopped = time.monotonic()
        before = _actions(log, zombie.pid, 0)

        async def take_over() -> list[Any]:
            store = open_store()
            async with phronomy.open_runtime(store=store, sweep_interval=0.1) as rt:
                del rt
                ids = [f"z-{i}" for i in range(INSTANCES)]
                with trio.fail_after(20):
                    while True:
                        rows = [store.load(iid) for iid in ids]
                        if all(r is not None and r.status != "running" for r in rows):
                            return rows
                        await trio.sleep(0.05)

        taken = trio.run(take_over)
        taken_at = time.monotonic()
        os.kill(zombie.pid, signal.SIGCONT)
        woke = time.monotonic()
        time.sleep(0.5)  # the zombie wakes with every timer overdue
        after_wake = _actions(log, zombie.pid, woke)
        after_takeover = _actions(log, zombie.pid, taken_at)
    finally:
        zombie.kill()
        zombie.wait(timeout=30)
        if zombie.stdout is not None:
            zombie.stdout.close()
    store = open_store()
    rows = [store.load(f"z-{i}") for i in range(INSTANCES)]
    store.close()
    return {
        "before": before,
        "stopped_for": taken_at - stopped,
        "after_wake": after_wake,
        "after_takeover": after_takeover,
        "rows_changed": sum(a != b for a, b in zip(taken, rows, strict=True)),
    }


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_zombie_runs_nothing_after_it_wakes(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    opener: Any = None  # PostgreSQL: opens stores in the test's schema
    if backend == "postgres":
        opener = request.getfixturevalue("open_postgres")
        target, schema = request.getfixturevalue("postgres_dsn"), opener().schema
        open_store: Callable[[], Any] = opener
    else:
        path = tmp_path / "zombie.db"
        target, schema = str(path), ""

        def open_store() -> Any:
            return phronomy.SQLiteStore(path)

    figures = {}
    for broken in (False, True):
        log = tmp_path / f"actions-{broken}.log"
        if backend == "sqlite":
            path = tmp_path / f"zombie-{broken}.db"
            target = str(path)
        elif broken:  # a fresh schema for the control
            schema = opener(schema=f"{schema}_control").schema
            target = request.getfixturevalue("postgres_dsn")

            def open_store(schema: str = schema) -> Any:
                return opener(schema=schema)

        try:
            figures[broken] = _scenario(target, schema, log, open_store, broken)
        finally:
            if backend == "postgres" and broken:
                import psycopg

                with psycopg.connect(target, autocommit=True) as conn:
                    conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    fixed, control = figures[False], figures[True]
    print(  # noqa: T201 - the figures of the run
        f"zombie ({backend}): {INSTANCES} live instances, {fixed['before']} actions "
        f"before SIGSTOP, taken over after {fixed['stopped_for']:.2f} s (ttl {TTL}); "
        f"after SIGCONT: {fixed['after_wake']} actions, {fixed['rows_changed']} rows "
        f"changed; negative control (no lease check): {control['after_wake']} actions "
        "after waking"
    )
    assert fixed["before"] >= INSTANCES  # every instance ran before the pause
    assert fixed["after_takeover"] == fixed["after_wake"] == 0
    assert fixed["rows_changed"] == 0  # 0 zombie writes accepted
    assert control["after_wake"] > 0  # the checker sees a zombie that does act
    assert control["rows_changed"] == 0  # (its writes are fenced either way)
