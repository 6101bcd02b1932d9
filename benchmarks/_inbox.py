"""The inbox's benchmarks: durable posts/s against the raw insert limit, and the time
from a post to its application, in this process and from another one."""

from __future__ import annotations

import json
import sqlite3
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

import trio

import phronomy
from phronomy.storage import SaveRequest

APPLIED: list[float] = []
"""Seconds from each post's call to its application (appended by the action)."""


class Tally(phronomy.State):
    n: int = 0


def _applied(state: Tally, event: Any) -> Tally:
    APPLIED.append(time.time() - float(event.payload))
    return state.merge(n=state.n + 1)


def live_flow() -> phronomy.WorkflowDefinition[Tally]:
    """One live state: each ``add`` is applied by the segment that waits for it."""
    wf = phronomy.Workflow(Tally, name="inbox-bench")
    wf.state("open")
    wf.transition("open", "open", on="add", action=_applied)
    wf.transition("open", phronomy.FINISH, on="finish")
    return wf.build()


# --- posts/s -----------------------------------------------------------------------------------


async def raw_post_limit(path: str, total: int) -> float:
    """Posts/s of the same store work in a raw trio + sqlite3 loop: per post, the next
    number under the instance's row and the entry's insert (phronomy's tables and
    indexes, a new UUID per event id); 64 clients, each batch of posts in one
    ``BEGIN IMMEDIATE`` transaction (FULL sync)."""
    with phronomy.SQLiteStore(path) as store:  # the tables, and 64 instances
        for k in range(64):
            store.save(
                SaveRequest(
                    workflow_instance_id=f"i{k}",
                    expected_revision=None,
                    snapshot=b"",
                    write_id=f"w{k}",
                    status="halted",
                    phase="open",
                    workflow="raw",
                )
            )
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA synchronous=FULL")
    limiter = trio.CapacityLimiter(1)
    pending: list[tuple[tuple[str, str], trio.Event]] = []
    flushing = False

    def run_batch(posts: list[tuple[str, str]]) -> None:
        conn.execute("BEGIN IMMEDIATE")
        for iid, event_id in posts:
            (seq,) = conn.execute(
                "UPDATE phronomy_workflow_instances SET inbox_seq = inbox_seq + 1 "
                "WHERE instance_id = ? RETURNING inbox_seq",
                (iid,),
            ).fetchone()
            conn.execute(
                "INSERT INTO phronomy_inbox (instance_id, seq, event_id, event, "
                "payload, stored_at_ms, status) VALUES (?, ?, ?, 'add', ?, ?, "
                "'pending')",
                (iid, seq, event_id, b"1.0", int(time.time() * 1000)),
            )
        conn.execute("COMMIT")

    async def post(iid: str, event_id: str) -> None:
        nonlocal flushing
        done = trio.Event()
        pending.append(((iid, event_id), done))
        if not flushing:
            flushing = True
            while pending:
                batch = pending[:]
                pending.clear()
                await trio.to_thread.run_sync(
                    run_batch, [p for p, _ in batch], limiter=limiter
                )
                for _, event in batch:
                    event.set()
            flushing = False
        await done.wait()

    async def client(k: int, count: int) -> None:
        for _ in range(count):
            await post(f"i{k}", str(uuid.uuid4()))

    per = total // 64
    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for k in range(64):
            nursery.start_soon(client, k, per)
    elapsed = time.perf_counter() - started
    conn.close()
    return per * 64 / elapsed


async def posts_per_second(store: phronomy.storage.WorkflowStore, total: int) -> float:
    """Durable posts/s: 64 posters, each to an instance live in this runtime."""
    flow = live_flow()
    per = total // 64
    async with phronomy.open_runtime(store=store) as rt:
        handles = [
            rt.workflows.start(flow, workflow_instance_id=f"i{k}") for k in range(64)
        ]

        async def poster(k: int) -> None:
            for n in range(per):
                await rt.workflows.post(flow, f"i{k}", "add", time.time())
                del n

        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for k in range(64):
                nursery.start_soon(poster, k)
        elapsed = time.perf_counter() - started
        for k in range(64):
            await rt.workflows.post(flow, f"i{k}", "finish")
        for handle in handles:
            assert (await handle.result()).state.n == per
    APPLIED.clear()
    return per * 64 / elapsed


# --- post to applied ---------------------------------------------------------------------------


def store_from(spec: str) -> phronomy.storage.WorkflowStore:
    """``sqlite:PATH`` or ``postgres:SCHEMA:DSN``."""
    kind, _, rest = spec.partition(":")
    if kind == "sqlite":
        return phronomy.SQLiteStore(rest)
    schema, _, dsn = rest.partition(":")
    return phronomy.PostgresStore(dsn, schema=schema)


HOLDER = r"""
import json, sys, trio, phronomy
sys.path.insert(0, sys.argv[1])
import _inbox

async def main():
    flow = _inbox.live_flow()
    async with phronomy.open_runtime(store=_inbox.store_from(sys.argv[2])) as rt:
        handle = rt.workflows.start(flow, workflow_instance_id="lat")
        while getattr(rt.workflows.segment("lat"), "status", None) != "executing":
            await trio.sleep(0.01)
        print("ready", flush=True)
        await handle.result()
    print(json.dumps(_inbox.APPLIED), flush=True)

trio.run(main)
"""


async def _post_steadily(
    rt: phronomy.Runtime, flow: Any, count: int, pace: float
) -> None:
    """*count* posts to ``lat``, one every *pace* seconds, then ``finish``."""
    for n in range(count):
        await rt.workflows.post(flow, "lat", "add", time.time(), event_id=f"e{n}")
        await trio.sleep(pace)
    await rt.workflows.post(flow, "lat", "finish")


async def latency_here(
    store: phronomy.storage.WorkflowStore, count: int
) -> list[float]:
    """Post to an instance live in this runtime (delivered directly, stored first)."""
    flow = live_flow()
    APPLIED.clear()
    async with phronomy.open_runtime(store=store) as rt:
        handle = rt.workflows.start(flow, workflow_instance_id="lat")
        await trio.sleep(0.05)
        await _post_steadily(rt, flow, count, 0.005)
        await handle.result()
    found, APPLIED[:] = APPLIED[:], []
    return found


def latency_across(spec: str, count: int, here: str) -> list[float]:
    """Post from this process to an instance live in another one (which learns of it
    from its poll, or from PostgreSQL's notification)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, here, spec],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "ready"

    async def send() -> None:
        async with phronomy.open_runtime(store=store_from(spec)) as rt:
            await _post_steadily(rt, live_flow(), count, 0.005)

    trio.run(send)
    out, _ = holder.communicate(timeout=60)
    assert holder.returncode == 0
    found: list[float] = json.loads(out.splitlines()[-1])
    return found


def percentiles(seconds: list[float]) -> tuple[float, float]:
    """p50 and p99 in milliseconds."""
    cuts = statistics.quantiles(seconds, n=100, method="inclusive")
    return cuts[49] * 1000, cuts[98] * 1000
