"""A durable run goes through the dispatcher's queue once: its start. The store's
answers (the claim, the terminal save) come back as one continuation per write
batch, run where the batch's completions would have been queued, and act at once
(before, each answer was a message of its own: three trips per run)."""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any

import trio

import phronomy

if TYPE_CHECKING:
    from pathlib import Path


class Count(phronomy.State):
    n: int = 0


def _steps() -> phronomy.WorkflowDefinition[Count]:
    wf = phronomy.Workflow(Count, name="trips")
    for state in ("a", "b"):
        wf.state(state, entry=lambda s: s.merge(n=s.n + 1))
    wf.transition("a", "b").transition("b", phronomy.FINISH)
    return wf.build()


async def test_a_durable_run_goes_through_the_queue_once(tmp_path: Path) -> None:
    flow = _steps()
    runs = 64
    store = phronomy.SQLiteStore(tmp_path / "trips.db")
    batches: list[int] = []  # the store's batches (each comes back as one
    execute = store.execute  # continuation); list.append is atomic across threads

    def counted(ops: Any) -> Any:
        batches.append(len(ops))
        return execute(ops)

    store.execute = counted  # type: ignore[method-assign]  # a counting test double
    async with phronomy.open_runtime(store=store, inbox_poll_interval=60) as runtime:
        # what is queued from here on (the store's batches are counted from the open:
        # each answer a batch hands back comes after its batch ran)
        queued: collections.Counter[str] = collections.Counter()
        dispatcher = runtime.engine._dispatcher  # a recording test double
        send = dispatcher.send_nowait

        def recorded(value: Any) -> None:
            queued[type(value).__name__] += 1
            send(value)

        dispatcher.send_nowait = recorded
        await runtime.workflows.invoke(flow, workflow_instance_id="warm")
        before = runtime.statistics().dispatched_total
        results: list[phronomy.WorkflowResult[Count]] = []

        async def run(i: int) -> None:
            results.append(
                await runtime.workflows.invoke(flow, workflow_instance_id=f"r{i}")
            )

        async with trio.open_nursery() as nursery:
            for i in range(runs):
                nursery.start_soon(run, i)
        trips = runtime.statistics().dispatched_total - before
        dispatcher.send_nowait = send
    assert sorted(r.state.n for r in results) == [2] * runs
    assert all(r.revision == 1 and r.status == "finished" for r in results)
    # one start each, and a continuation per store batch (a few, for 64 runs: the
    # claims and the saves group-commit)
    print(f"{trips} dispatches for {runs} runs; {dict(queued)}; batches {batches}")  # noqa: T201
    assert trips >= runs
    assert queued["Delivery"] == runs + 1  # the starts (and the warm-up's)
    # a continuation per store batch at most (the runs', the warm-up's, the polls'):
    # before, a message per answer (three trips per run)
    assert queued["Continuation"] <= len(batches) < runs
    # nothing else a run queues: no event for a store's answer, no session start or
    # end (a _Marker is the dispatcher's own wake-up, when a timer comes earlier)
    assert set(queued) <= {"Delivery", "Continuation", "_Marker"}, queued
    assert queued["_Marker"] <= 1, queued
