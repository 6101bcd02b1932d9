"""Calls from threads that do not run the runtime's trio loop.

A wrong call from a foreign thread must fail at once with a clear error and leave the
runtime working (before the guard, ``runtime.signal`` from a thread took the dispatcher
off its wait queue and trio died with ``TrioInternalError``). ``runtime.from_thread``
is the supported way in.
"""

from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING, Any

import pytest
import trio

import phronomy
from phronomy.engine import Event, ResultHandle
from workflow.helpers import approval_flow, live_flow, start_live

if TYPE_CHECKING:
    from collections.abc import Callable


async def in_thread(fn: Callable[[], Any]) -> Any:
    """Run *fn* in a plain ``threading.Thread`` (not a trio worker); return or raise."""
    outcome: list[Any] = []

    def body() -> None:
        try:
            outcome.append(("value", fn()))
        except BaseException as exc:
            outcome.append(("error", exc))

    thread = threading.Thread(target=body, name="foreign")
    thread.start()
    await trio.to_thread.run_sync(thread.join)
    kind, value = outcome[0]
    if kind == "error":
        raise value
    return value


async def test_sync_entry_points_refuse_foreign_threads_and_the_runtime_survives() -> (
    None
):
    flow = live_flow()
    with trio.fail_after(10):  # the old failure mode was a hang (or TrioInternalError)
        async with phronomy.open_runtime(shutdown_timeout=2) as rt:
            handle = await start_live(rt, flow, "x")
            execution = rt.executions.start(
                "agent", [lambda v: phronomy.ApprovalRequest(question="ok?")]
            )
            await execution.wait_for_approval()
            pool = rt.pool("tools")
            calls: dict[str, Callable[[], Any]] = {
                "runtime.workflows.signal()": lambda: rt.workflows.signal(
                    flow, "x", "mark"
                ),
                "runtime.workflows.start()": lambda: rt.workflows.start(flow),
                "runtime.executions.start()": lambda: rt.executions.start(
                    "other", [lambda v: v]
                ),
                "runtime.executions.cancel()": execution.cancel,
                "runtime.executions.approve()": execution.approve,
                "runtime.executions.reject()": execution.reject,
                "ResultHandle.cancel()": handle.cancel,
                "ResultHandle.complete()": lambda: handle.complete(None),  # type: ignore[arg-type]  # the call is refused first
                "ResultHandle.on_complete()": lambda: handle.on_complete(print),
                "OffloadPool.submit_nowait()": lambda: pool.submit_nowait(print),
                "TimerQueue.schedule()": lambda: rt.engine.timers.schedule(0, print),
                "Engine.post_nowait(Event)": lambda: rt.engine.post_nowait(
                    Event(type="mark", target_id="nobody")
                ),
                "Engine.pool()": lambda: rt.pool("new-pool"),
                "Engine.start_task()": lambda: rt.engine.start_task(trio.sleep, 0),
            }
            submitted = rt.engine.statistics().pools[0].submitted_total
            for what, call in calls.items():
                with pytest.raises(phronomy.ReentrancyError) as caught:
                    await in_thread(call)
                message = str(caught.value)
                assert what in message
                assert "runtime.from_thread" in message
                assert "trio_token" in message
            # nothing was half done: the live segment and the execution still work
            assert rt.engine.statistics().pools[0].submitted_total == submitted
            assert not handle.done
            assert rt.workflows.signal(flow, "x", "mark")
            assert rt.workflows.signal(flow, "x", "finish")
            result = await handle.result()
            assert result.state.count == 2  # start_live's probe and the mark above
            execution.approve("yes")
            assert (await execution.result()).status == "completed"
        assert rt.shutdown_result is not None
        assert rt.shutdown_result.clean


async def test_portal_runs_every_operation_from_threads() -> None:
    flow = approval_flow()
    live = live_flow()
    async with phronomy.open_runtime(
        store=phronomy.MemoryStore(), shutdown_timeout=2
    ) as rt:
        portal = rt.from_thread
        halted = await in_thread(
            lambda: portal.invoke(flow, {"value": "t"}, workflow_instance_id="p1")
        )
        assert (halted.phase, halted.revision) == ("awaiting", 1)
        done = await in_thread(
            lambda: portal.send_event(flow, "approve", workflow_instance_id="p1")
        )
        assert (done.phase, done.state.value) == (
            phronomy.FINISH,
            "t:prepared:confirmed",
        )
        again = await in_thread(
            lambda: portal.invoke(flow, {"value": "u"}, workflow_instance_id="p2")
        )
        resumed = await in_thread(lambda: portal.resume(flow, halted=again))
        assert resumed.state.value == "u:prepared:confirmed"
        handle = await start_live(rt, live, "p3")
        assert await in_thread(lambda: portal.signal(live, "p3", "finish"))
        assert (await handle.result()).phase == phronomy.FINISH
        assert await in_thread(lambda: portal.run_sync(lambda a, b: a + b, 2, 3)) == 5
        result = await in_thread(
            lambda: portal.run(
                functools.partial(rt.executions.invoke, "agent", [lambda v: v * 2], 21)
            )
        )
        assert result.value == 42
        handle = await start_live(rt, live, "p4")
        outcome = await in_thread(lambda: portal.deliver(live, "p4", "mark", None))
        assert (outcome.status, outcome.phase) == ("transitioned", "waiting")
        cancelled = await in_thread(lambda: portal.cancel(live, "p4", reason="ops"))
        assert (cancelled.status, cancelled.revision) == ("cancelled", 1)
        with pytest.raises(phronomy.WorkflowCancelledError, match="ops"):
            await handle.result()
        kept = await in_thread(
            lambda: portal.invoke(flow, workflow_instance_id="p1", if_exists="return")
        )
        assert (kept.status, kept.revision) == ("finished", 2)
        # errors arrive as themselves
        with pytest.raises(phronomy.InvalidInputError):
            await in_thread(
                lambda: portal.send_event(flow, "bogus", workflow_instance_id="p1")
            )
        with pytest.raises(phronomy.InstanceStateError, match="finished"):
            await in_thread(
                lambda: portal.send_event(flow, "approve", workflow_instance_id="p1")
            )


async def test_portal_refuses_trio_threads() -> None:
    async with phronomy.open_runtime(shutdown_timeout=2) as rt:
        with pytest.raises(phronomy.ReentrancyError, match="trio loop"):
            rt.from_thread.invoke(approval_flow())
        with pytest.raises(phronomy.ReentrancyError, match="trio loop"):
            rt.from_thread.signal(live_flow(), "x", "mark")


def test_portal_after_the_trio_run_ended() -> None:
    runtimes: list[phronomy.Runtime] = []

    async def host() -> None:
        async with phronomy.open_runtime(shutdown_timeout=1) as rt:
            runtimes.append(rt)

    trio.run(host)
    with pytest.raises(phronomy.RuntimeShutdownError, match="has ended"):
        runtimes[0].from_thread.invoke(approval_flow())


async def test_portal_under_load_four_threads() -> None:
    # 4 threads x 10,000 calls: signals to one live instance each, in order
    flow = live_flow()
    threads, calls = 4, 10_000
    async with phronomy.open_runtime(shutdown_timeout=5, recursion_limit=10**6) as rt:
        handles = [await start_live(rt, flow, f"load-{i}") for i in range(threads)]
        accepted = [0] * threads
        failures: list[BaseException] = []

        def worker(index: int) -> None:
            try:
                for _ in range(calls):
                    accepted[index] += rt.from_thread.signal(
                        flow, f"load-{index}", "mark"
                    )
                rt.from_thread.signal(flow, f"load-{index}", "finish")
            except BaseException as exc:
                failures.append(exc)

        workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
        for t in workers:
            t.start()
        for t in workers:
            await trio.to_thread.run_sync(t.join)
        assert failures == []
        assert accepted == [calls] * threads
        for handle in handles:
            result = await handle.result()
            # start_live's own probe signal counts once
            assert result.state.count == calls + 1


async def test_settling_a_handle_from_a_thread_never_loses_its_waiter() -> None:
    handle: ResultHandle[int] = ResultHandle("waited")
    async with trio.open_nursery() as nursery:
        results: list[int] = []

        async def waiter() -> None:
            results.append(await handle.result())

        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(phronomy.ReentrancyError):
            await in_thread(lambda: handle.complete(1))
        assert not handle.done
        handle.complete(2)  # the waiter is still parked and wakes up
    assert results == [2]
