"""Watching instances: every stable state, in order, from any task, across segments."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.lowlevel

import phronomy
from phronomy.workflow import FINISH, InstanceUpdate

from .helpers import Value, approval_flow, runtime_on

if TYPE_CHECKING:
    from collections.abc import Callable


def _counting(steps: int) -> phronomy.WorkflowDefinition[Value]:
    wf = phronomy.Workflow(Value, name="counting").state("spin")
    wf.transition(
        "spin",
        "spin",
        guard=lambda s: s.count < steps,
        action=lambda s: s.merge(count=s.count + 1),
    )
    wf.transition("spin", FINISH)
    return wf.build()


async def _collect(watch: Any, until_status: str, slow: bool = False) -> list[Any]:
    seen = []
    async for update in watch:
        seen.append(update)
        if slow:
            await trio.lowlevel.checkpoint()  # a consumer slower than the dispatcher
        if update.status == until_status:
            return seen
    return seen


async def test_a_slow_watcher_sees_every_stable_state_of_a_1000_step_run(
    runtime: phronomy.Runtime,
) -> None:
    flow = _counting(1000)
    async with runtime.workflows.watch(flow, "long", if_missing="wait") as updates:
        result = await runtime.workflows.invoke(
            flow, workflow_instance_id="long", recursion_limit=2000
        )
        seen = await _collect(updates, "finished", slow=True)
    assert result.state.count == 1000
    running = [u for u in seen if u.status == "running"]
    assert [u.state.count for u in running] == list(range(1001))  # in order, all
    assert all(u.skipped == 0 for u in seen)
    assert (seen[-1].status, seen[-1].phase, seen[-1].state.count) == (
        "finished",
        FINISH,
        1000,
    )


async def test_a_watch_starts_with_the_stored_state_and_follows_segments(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    store = make_store()
    flow = approval_flow()
    async with runtime_on(store) as rt:
        await rt.workflows.invoke(flow, {"value": "v"}, workflow_instance_id="w-1")
    async with runtime_on(store) as rt:
        async with (
            rt.workflows.watch(flow, "w-1") as first,
            rt.workflows.watch(flow, "w-1") as second,
        ):
            await rt.workflows.send_event(flow, "approve", workflow_instance_id="w-1")
            seen = await _collect(first, "finished")
            also = await _collect(second, "finished")
    assert seen == also  # every watcher gets every update
    assert [(u.status, u.phase, u.revision) for u in seen] == [
        ("halted", "awaiting", 1),  # what the store said when the watch began
        ("running", "confirm", 1),  # stable states on the way
        ("finished", FINISH, 2),
    ]
    assert seen[0].state == Value(value="v:prepared", steps=["prepare"])


async def test_watching_an_instance_before_it_exists(runtime: phronomy.Runtime) -> None:
    flow = approval_flow()
    async with runtime.workflows.watch(flow, "later", if_missing="wait") as updates:
        await runtime.workflows.invoke(flow, workflow_instance_id="later")
        seen = await _collect(updates, "halted")
    assert [(u.status, u.phase) for u in seen] == [
        ("running", "prepare"),
        ("halted", "awaiting"),
    ]


async def test_a_watcher_that_falls_behind_learns_what_it_missed(
    runtime: phronomy.Runtime,
) -> None:
    flow = _counting(50)
    async with runtime.workflows.watch(
        flow, "small", buffer=10, if_missing="wait"
    ) as updates:
        await runtime.workflows.invoke(
            flow, workflow_instance_id="small", recursion_limit=100
        )
        seen = await _collect(updates, "finished")
    assert len(seen) == 10
    assert seen[0].skipped == 52 - 10  # 51 running states and the end, 10 kept
    assert [u.state.count for u in seen[:-1]] == list(range(42, 51))
    with pytest.raises(phronomy.InvalidInputError, match="buffer"):
        async with runtime.workflows.watch(flow, "small", buffer=0):
            pass


async def test_a_watch_ends_when_the_runtime_closes() -> None:
    flow = approval_flow()
    seen: list[InstanceUpdate[Any]] = []
    async with phronomy.open_runtime() as rt:
        async with rt.workflows.watch(flow, "x", if_missing="wait") as updates:
            async with trio.open_nursery() as nursery:

                async def consume() -> None:
                    async for update in updates:
                        seen.append(update)

                nursery.start_soon(consume)
                await rt.workflows.invoke(flow, workflow_instance_id="x")
                await trio.testing.wait_all_tasks_blocked()
                await rt.shutdown()  # the consumer's iteration ends
    assert [u.status for u in seen] == ["running", "halted"]


async def test_a_watch_of_an_instance_that_does_not_exist_raises(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # Before: it yielded nothing forever (a GET handler built on it hung).
    flow = approval_flow()
    async with runtime_on(make_store()) as rt:
        with pytest.raises(phronomy.NotFoundError, match="'nobody' does not exist"):
            async with rt.workflows.watch(flow, "nobody"):
                pytest.fail("the body must not run")
        # a start queued just before the watch counts: no race with the dispatcher
        handle = rt.workflows.start(flow, workflow_instance_id="just-started")
        async with rt.workflows.watch(flow, "just-started") as updates:
            seen = await _collect(updates, "halted")
        assert seen[-1].status == "halted"
        await handle.result()
        with pytest.raises(phronomy.InvalidInputError, match="if_missing"):
            async with rt.workflows.watch(flow, "x", if_missing="maybe"):  # type: ignore[arg-type]
                pass


async def test_a_watch_with_another_workflows_definition_names_both(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # Before: DefinitionMismatchError naming the definition's workflow as the one that
    # saved the instance.
    store = make_store()
    async with runtime_on(store) as rt:
        await rt.workflows.invoke(approval_flow(), workflow_instance_id="mine")
        other = _counting(3)
        with pytest.raises(
            phronomy.InstanceStateError,
            match=r"'mine' belongs to workflow 'approval', not 'counting'",
        ):
            async with rt.workflows.watch(other, "mine"):
                pass
