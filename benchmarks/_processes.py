"""Durable runs/s from several processes on one store (leases keep them apart), and
what limits them: each child reports its CPU and the wall time its write batches took
(waits for the other processes' write lock included: SQLite serializes writers)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import NamedTuple

CHILD = r"""
import sys, time, trio, phronomy
from phronomy.storage import READ_OPS

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

writing = [0.0]

def timed(store):
    execute = store.execute
    def run(ops):
        if all(isinstance(op, READ_OPS) for op in ops):
            return execute(ops)
        started = time.perf_counter()
        try:
            return execute(ops)
        finally:
            writing[0] += time.perf_counter() - started
    store.execute = run
    return store

async def main():
    async with phronomy.open_runtime(store=timed(store())) as rt:
        print("ready", flush=True)
        sys.stdin.readline()  # the start signal
        cpu, writing[0] = time.process_time(), 0.0
        numbers = iter(range(total))
        async def worker():
            for i in numbers:
                await rt.workflows.invoke(flow, workflow_instance_id=f"{tag}-{i}")
        async with trio.open_nursery() as nursery:
            for _ in range(64):
                nursery.start_soon(worker)
        print("done", time.process_time() - cpu, writing[0], flush=True)

trio.run(main)
"""


class Processes(NamedTuple):
    """Runs/s of all the processes; their CPU as a share of the machine's cores; the
    wall time in write batches per second, summed over the processes (above 1: the
    processes wait for each other's writes)."""

    rate: float
    cpu: float
    writing: float

    def limits(self) -> str:
        """One line saying what limits them."""
        return (
            f"  CPU {self.cpu:.0%} of {os.cpu_count()} cores; write batches "
            f"{self.writing:.2f} s per s of wall (lock waits included)"
        )


def runs_per_second(
    target: str, processes: int, total: int, schema: str = ""
) -> Processes:
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
    reports = []
    for child in children:
        assert child.stdout is not None
        done, cpu, writing = child.stdout.readline().split()
        assert done == "done"
        reports.append((float(cpu), float(writing)))
    elapsed = time.perf_counter() - started
    for child in children:
        child.communicate(timeout=60)
        assert child.returncode == 0
    return Processes(
        per * processes / elapsed,
        sum(cpu for cpu, _ in reports) / elapsed / (os.cpu_count() or 1),
        sum(writing for _, writing in reports) / elapsed,
    )
