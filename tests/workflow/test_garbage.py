"""A finished segment leaves no reference cycles: its objects are freed as it ends,
not by the cyclic garbage collector (a cycle per segment made every run cost a share
of a collection, and each collection more as the runtime got busier)."""

from __future__ import annotations

import gc
from collections import Counter
from typing import TYPE_CHECKING

import trio

import phronomy

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from pathlib import Path


class Count(phronomy.State):
    n: int = 0


def _flows() -> tuple[phronomy.WorkflowDefinition[Count], ...]:
    steps = phronomy.Workflow(Count, name="steps")
    for state in ("a", "b"):
        steps.state(state, entry=lambda s: s.merge(n=s.n + 1))
    steps.transition("a", "b").transition("b", phronomy.FINISH)
    halting = phronomy.Workflow(Count, name="halting")
    halting.state("draft", entry=lambda s: s.merge(n=s.n + 1))
    halting.wait_state("awaiting")
    halting.transition("draft", "awaiting")
    halting.transition("awaiting", phronomy.FINISH, on="approve")
    return steps.build(), halting.build()


def _step(value: int) -> int:
    return value + 1


def _at_once(
    work: Callable[..., Awaitable[object]], *args: object, times: int
) -> Callable[[], Awaitable[None]]:
    """*work(*args)* run *times* at once."""

    async def many() -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(times):
                nursery.start_soon(work, *args)

    return many


async def _garbage_of(work: Callable[[], Awaitable[object]]) -> Counter[str]:
    """The runtime's objects only the cyclic collector would have freed after *work*."""
    await work()  # warm: caches, lazily built tables
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        await work()
        gc.collect()
        return Counter(
            type(o).__qualname__
            for o in gc.garbage
            if type(o).__module__.startswith("phronomy")
        )
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


async def test_durable_runs_halts_and_executions_leave_no_cycles(
    tmp_path: Path,
) -> None:
    steps, halting = _flows()
    numbers = iter(range(1_000))
    store = phronomy.SQLiteStore(tmp_path / "garbage.db")
    async with phronomy.open_runtime(store=store) as runtime:

        async def work() -> None:
            i = next(numbers)
            await runtime.workflows.invoke(steps, workflow_instance_id=f"s-{i}")
            await runtime.workflows.invoke(halting, workflow_instance_id=f"h-{i}")
            await runtime.workflows.send_event(
                halting, event="approve", workflow_instance_id=f"h-{i}"
            )
            await runtime.executions.invoke(f"e-{i}", [_step] * 2, 0)

        garbage = await _garbage_of(_at_once(work, times=8))
    assert not garbage, garbage


def _stock(item: str) -> bool:
    return item != "unicorn"


def _live() -> phronomy.WorkflowDefinition[Count]:
    """An offloaded effect, then two live states that signals move on."""
    wf = phronomy.Workflow(Count, name="live")

    def check(state: Count, event: object, effects: phronomy.Effects) -> Count:
        effects.offload(_stock, "book", on_done="checked")
        return state

    wf.state("checking", entry=check)
    wf.state("paying")
    wf.state("paid")
    wf.transition("checking", "paying", on="checked")
    wf.transition("paying", "paid", on="paid", action=lambda s: s.merge(n=s.n + 1))
    wf.transition("paid", phronomy.FINISH, on="done")
    return wf.build()


async def test_effects_signals_and_streams_leave_no_cycles(
    tmp_path: Path,
) -> None:
    flow = _live()
    numbers = iter(range(1_000))
    signals = {"paying": "paid", "paid": "done"}
    store = phronomy.SQLiteStore(tmp_path / "live.db")
    async with phronomy.open_runtime(store=store) as runtime:

        async def work() -> None:
            iid = f"l-{next(numbers)}"
            async with runtime.workflows.stream(
                flow, workflow_instance_id=iid
            ) as steps:
                async for step in steps:
                    if step.phase in signals:
                        assert runtime.workflows.signal(flow, iid, signals[step.phase])
            assert (await steps.result()).state.n == 1

        garbage = await _garbage_of(_at_once(work, times=4))
    assert not garbage, garbage


async def test_in_memory_runs_leave_no_cycles() -> None:
    steps, _ = _flows()
    async with phronomy.open_runtime() as runtime:
        garbage = await _garbage_of(_at_once(runtime.workflows.invoke, steps, times=8))
    assert not garbage, garbage
