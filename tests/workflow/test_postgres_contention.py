"""PostgreSQL under contention: runtimes in several processes claiming the same rows.

A claim never waits for a row another transaction holds (it is refused at once as
busy), so claims in one batch cannot deadlock with another runtime's, whatever order
they come in.
"""

from __future__ import annotations

import collections
import json
import os
import random
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

import pytest
import trio

import phronomy

if TYPE_CHECKING:
    from collections.abc import Callable

_FLOW = r"""
import phronomy

class Order(phronomy.State):
    step: int = 0

wf = phronomy.Workflow(Order, name="halting")
wf.wait_state("awaiting").initial("awaiting")
wf.transition("awaiting", phronomy.FINISH, on="approve")
flow = wf.build()
"""

_CLAIMER = _FLOW + r"""
import json, sys, time, trio

async def main():
    store = phronomy.PostgresStore(sys.argv[1], schema=sys.argv[2])
    async with phronomy.open_runtime(store=store, shutdown_timeout=5) as rt:
        print("ready", flush=True)
        while line := await trio.to_thread.run_sync(sys.stdin.readline):
            command = json.loads(line)
            await trio.sleep(max(0.0, command["at"] - time.time()))
            results = {}

            async def one(iid):
                try:
                    await rt.workflows.send_event(flow, "approve", workflow_instance_id=iid)
                    results[iid] = "won"
                except phronomy.BusyError:
                    results[iid] = "busy"
                except phronomy.InstanceStateError:
                    results[iid] = "finished"  # it arrived after the winner had finished
                except Exception as exc:
                    results[iid] = f"{type(exc).__name__}: {exc}"

            async with trio.open_nursery() as nursery:
                for iid in command["ids"]:
                    nursery.start_soon(one, iid)
            print(json.dumps(results), flush=True)

trio.run(main)
"""


def _flow() -> phronomy.WorkflowDefinition[Any]:
    namespace: dict[str, Any] = {}
    exec(_FLOW, namespace)  # noqa: S102 - the children's flow, from this module
    flow: phronomy.WorkflowDefinition[Any] = namespace["flow"]
    return flow


async def _create_halted(store: phronomy.PostgresStore, ids: list[str]) -> None:
    flow = _flow()
    async with phronomy.open_runtime(store=store, shutdown_timeout=5) as rt:
        async with trio.open_nursery() as nursery:
            for iid in ids:
                nursery.start_soon(
                    lambda iid=iid: rt.workflows.invoke(flow, workflow_instance_id=iid)
                )


@pytest.mark.slow
def test_processes_claiming_overlapping_instances_never_deadlock(
    open_postgres: Callable[..., phronomy.PostgresStore],
    postgres_dsn: str,
) -> None:
    """4 processes each send ``approve`` to an overlapping, differently ordered set of
    the same 10 halted instances at once (one claim batch each), for several rounds:
    every outcome is a success, a BusyError or (arrived after the end) an
    InstanceStateError; each instance ran exactly one transition.

    Before (each claim a load, then an UPDATE that waited for the row's lock): 4 of 4
    rounds had DeadlockDetected, the losing batch's 10 claims all failed with
    StoreUnavailableError ("check that the server is up").
    """
    store = open_postgres()
    store.open()
    processes, rounds, per_round = 4, int(os.environ.get("PHRONOMY_RACE_ROUNDS", "4")), 10
    args = [sys.executable, "-c", _CLAIMER, postgres_dsn, store.schema]
    children = [
        subprocess.Popen(
            args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for _ in range(processes)
    ]
    outcomes: collections.Counter[str] = collections.Counter()
    odd: list[str] = []
    rng = random.Random(7)
    try:
        for child in children:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "ready"
        for round_id in range(rounds):
            ids = [f"r{round_id}-{n}" for n in range(per_round)]
            trio.run(_create_halted, store, ids)
            at = time.time() + 0.3  # every process sends its batch at this moment
            wanted = []
            for child in children:
                chosen = rng.sample(ids, k=8)  # overlapping, each in its own order
                wanted.append(chosen)
                assert child.stdin is not None
                child.stdin.write(json.dumps({"at": at, "ids": chosen}) + "\n")
                child.stdin.flush()
            won: collections.Counter[str] = collections.Counter()
            for child in children:
                assert child.stdout is not None
                results = json.loads(child.stdout.readline())
                for iid, result in results.items():
                    kind = result.split(":")[0]
                    outcomes[kind] += 1
                    if kind == "won":
                        won[iid] += 1
                    elif kind not in ("busy", "finished"):
                        odd.append(f"{iid}: {result}")
            asked = {iid for chosen in wanted for iid in chosen}
            assert odd == []
            assert {iid: won[iid] for iid in asked} == dict.fromkeys(asked, 1)
            for iid in asked:  # one transition: halted at 1, finished at 2
                entries = store.history(iid)
                assert [(e.revision, e.status) for e in entries] == [
                    (2, "finished"),
                    (1, "halted"),
                ], iid
    finally:
        for child in children:
            assert child.stdin is not None
            child.stdin.close()
        for child in children:
            child.wait(timeout=60)
            assert child.stdout is not None
            child.stdout.close()
    assert [c.returncode for c in children] == [0] * processes
    print(  # noqa: T201 - the figures of the run
        f"postgres claim race: {rounds} rounds x {processes} processes x 8 of "
        f"{per_round} instances: {outcomes['won']} won, {outcomes['busy']} busy, "
        f"{outcomes['finished']} arrived after the end, 0 deadlocks, 0 store errors"
    )
