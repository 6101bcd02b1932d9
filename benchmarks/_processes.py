"""Durable runs/s from several processes on one store (leases keep them apart)."""

from __future__ import annotations

import subprocess
import sys
import time

CHILD = r"""
import sys, time, trio, phronomy

class Counter(phronomy.State):
    n: int = 0

wf = phronomy.Workflow(Counter, name="bench")
for state in ("a", "b", "c"):
    wf.state(state, entry=lambda s: s.merge(n=s.n + 1))
wf.transition("a", "b").transition("b", "c").transition("c", phronomy.FINISH)
flow = wf.build()

target, tag, total = sys.argv[1], sys.argv[2], int(sys.argv[3])

def store():
    if target.startswith("postgresql://"):
        return phronomy.PostgresStore(target, schema=sys.argv[4])
    return phronomy.SQLiteStore(target, busy_timeout=60)

async def main():
    async with phronomy.open_runtime(store=store()) as rt:
        print("ready", flush=True)
        sys.stdin.readline()  # the start signal
        numbers = iter(range(total))
        async def worker():
            for i in numbers:
                await rt.workflows.invoke(flow, workflow_instance_id=f"{tag}-{i}")
        async with trio.open_nursery() as nursery:
            for _ in range(64):
                nursery.start_soon(worker)
    print("done", flush=True)

trio.run(main)
"""


def runs_per_second(target: str, processes: int, total: int, schema: str = "") -> float:
    """Durable runs/s of *processes* runtimes (one per process, 64 concurrent runs
    each) sharing *target* (a SQLite file or a PostgreSQL DSN), *total* runs in all."""
    per = total // processes
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, target, f"p{k}", str(per), schema],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for k in range(processes)
    ]
    for child in children:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
    started = time.perf_counter()
    for child in children:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
    for child in children:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "done"
    elapsed = time.perf_counter() - started
    for child in children:
        child.communicate(timeout=60)
        assert child.returncode == 0
    return per * processes / elapsed
