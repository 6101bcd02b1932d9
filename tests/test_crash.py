"""Crash safety: SIGKILL a process running durable workflows, many times.

After every kill: ``PRAGMA integrity_check`` is ok, every acknowledged result (the
child fsyncs an acknowledgement only after the runtime reported it) is in the store,
each instance's revisions are gapless, and no instance was finished twice. The next
child continues the instances the killed one left: once their leases expired (short
here), it claims them again.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pathlib import Path

KILLS = int(os.environ.get("PHRONOMY_CRASH_KILLS", "30"))

CHILD = r"""
import os, sys, itertools, trio, phronomy

class Order(phronomy.State):
    step: int = 0

wf = phronomy.Workflow(Order, name="crash")
wf.state("draft", entry=lambda s: s.merge(step=s.step + 1))
wf.wait_state("awaiting")
wf.state("ship", entry=lambda s: s.merge(step=s.step + 1))
wf.transition("draft", "awaiting")
wf.transition("awaiting", "ship", on="approve")
wf.transition("ship", phronomy.FINISH)
flow = wf.build()

db, acks, tag = sys.argv[1], sys.argv[2], sys.argv[3]
ack_fd = os.open(acks, os.O_WRONLY | os.O_APPEND | os.O_CREAT)

def ack(kind, iid, revision):
    os.write(ack_fd, f"{kind} {iid} {revision}\n".encode())
    os.fsync(ack_fd)

async def finish(rt, iid):
    while True:
        try:
            # one approval per order, whoever sends it: a retry after a crash is a
            # repeat of the stored one (applied once) and gets its outcome
            done = await rt.workflows.send_event(
                flow, event="approve", workflow_instance_id=iid, event_id=f"approve-{iid}")
            break
        except phronomy.RuntimeShutdownError:
            raise
        except phronomy.TransientError:  # the store was busy: try again
            await trio.sleep(0.1)
    ack("finished", iid, done.revision)

async def main():
    store = phronomy.SQLiteStore(db)
    leases = dict(lease_ttl=0.6, heartbeat_interval=0.15, lease_margin=0.15, sweep_interval=0.2)
    async with phronomy.open_runtime(store=store, **leases) as rt:
        leftovers = []
        for status in ("halted", "running", "failed"):
            leftovers += [r for r in store.list_instances(status=status, limit=1000).records if r.phase == "awaiting"]
        print("ready", flush=True)
        async with trio.open_nursery() as nursery:
            for record in leftovers:
                nursery.start_soon(finish, rt, record.workflow_instance_id)
            counter = itertools.count()
            async def worker():
                for n in counter:
                    iid = f"{tag}-{n}"
                    halted = await rt.workflows.invoke(flow, workflow_instance_id=iid)
                    ack("halted", iid, halted.revision)
                    await finish(rt, iid)
            for _ in range(8):
                nursery.start_soon(worker)

trio.run(main)
"""


def _check(db: Path, acks: Path) -> tuple[int, int]:
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        log = conn.execute(
            "SELECT instance_id, revision, status FROM phronomy_save_log"
        ).fetchall()
        rows = dict(
            conn.execute(
                "SELECT instance_id, revision FROM phronomy_workflow_instances"
            ).fetchall()
        )
        events = conn.execute(
            "SELECT instance_id, status, revision FROM phronomy_inbox"
        ).fetchall()
    finally:
        conn.close()
    approvals: dict[str, list[tuple[str, int | None]]] = {}
    for iid, status, revision in events:
        approvals.setdefault(iid, []).append((status, revision))
    for iid, applied in approvals.items():
        # one approval per order (one event id), applied at most once, by the save
        # that finished the order
        assert len(applied) == 1, f"{iid} has approvals {applied}"
        status, revision = applied[0]
        assert status in ("pending", "transitioned"), (iid, applied)
        if status == "transitioned":
            assert rows[iid] == revision, (iid, applied, rows[iid])
    by_instance: dict[str, dict[int, str]] = {}
    for iid, revision, status in log:
        by_instance.setdefault(iid, {})[revision] = status
    for iid, revisions in by_instance.items():
        assert sorted(revisions) == list(range(1, len(revisions) + 1)), (
            f"gap in {iid}: {revisions}"
        )
        assert list(revisions.values()).count("finished") <= 1, (
            f"{iid} was finished twice"
        )
        assert rows[iid] == len(revisions)
    acknowledged = 0
    for line in acks.read_text().splitlines():
        kind, iid, revision = line.split()
        assert by_instance.get(iid, {}).get(int(revision)) == kind, (
            f"acknowledged {line!r} is missing"
        )
        acknowledged += 1
    return acknowledged, sum(
        1 for r in by_instance.values() if "finished" in r.values()
    )


@pytest.mark.slow
def test_sigkill_never_loses_an_acknowledged_result(tmp_path: Path) -> None:
    db, acks = tmp_path / "crash.db", tmp_path / "acks.txt"
    acks.touch()
    rng = random.Random(int(os.environ.get("PHRONOMY_CRASH_SEED", "7")))
    kills = 0
    for round_id in range(KILLS):
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(db), str(acks), f"r{round_id}"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        try:
            child.wait(timeout=rng.uniform(0.02, 0.3))
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGKILL)
            kills += 1
        child.wait(timeout=30)
        child.stdout.close()
        _check(db, acks)
    acknowledged, finished = _check(db, acks)
    print(  # noqa: T201 - the summary line is read in CI logs
        f"crash test: {kills} SIGKILLs, {acknowledged} acknowledged results, {finished} instances finished"
    )
    assert kills >= KILLS * 0.9
    assert acknowledged > KILLS  # the child made progress between kills
    assert finished > 0
