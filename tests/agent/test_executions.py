"""Supervised executions (spec §6, scenarios 121-128, seed 003)."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
import trio

import phronomy
from phronomy.agent.coordinator import agent_key
from phronomy.agent.messages import StepResult
from phronomy.engine import ResultHandle
from phronomy.testing import FaultyStore

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path


async def _until(predicate: Any, limit: float = 5.0) -> None:
    with trio.fail_after(limit):
        while not predicate():  # noqa: ASYNC110 - state changed by other tasks and threads
            await trio.sleep(0.002)


def _suspended(runtime: phronomy.Runtime, execution: phronomy.ExecutionHandle) -> bool:
    owner = execution.owner()
    return owner is not None and owner.status == "suspended"


async def test_steps_run_in_order_in_threads_and_tasks(
    runtime: phronomy.Runtime,
) -> None:
    main_thread = threading.get_ident()
    seen: list[tuple[str, bool]] = []

    def blocking(value: int) -> int:
        seen.append(("sync", threading.get_ident() != main_thread))
        return value + 1

    async def concurrent(value: int, ctx: phronomy.StepContext) -> int:
        seen.append(("async", threading.get_ident() == main_thread))
        assert ctx.step_index == 1
        assert ctx.execution_id
        return await ctx.offload(lambda: value * 10)

    result = await runtime.executions.run("agent", [blocking, concurrent], 1)
    assert (result.status, result.value) == ("completed", 20)
    assert seen == [("sync", True), ("async", True)]
    assert not runtime.executions.is_admitted("agent")


async def test_step_failures_fail_the_caller_and_free_the_key(
    runtime: phronomy.Runtime,
) -> None:
    def boom(value: Any) -> None:
        raise KeyError("tool failed")

    with pytest.raises(KeyError, match="tool failed"):
        await runtime.executions.run("k", [boom])
    assert (await runtime.executions.run("k", [lambda v: "ok"])).value == "ok"


async def test_sync_step_returning_an_awaitable_is_refused(
    runtime: phronomy.Runtime,
) -> None:
    async def later() -> int:
        return 1

    with pytest.raises(TypeError, match="declare it with async def"):
        await runtime.executions.run("k", [lambda v: later()])


async def test_approval_suspends_then_approve_or_reject(
    runtime: phronomy.Runtime,
) -> None:
    request = phronomy.ApprovalRequest(question="ship it?", details={"order": 7})
    received: list[Any] = []

    def after(approval: phronomy.Approval) -> str:
        received.append(approval)
        return f"shipped ({approval.response})"

    execution = runtime.executions.start("shop", [lambda v: request, after])
    await _until(lambda: _suspended(runtime, execution))
    owner = execution.owner()
    assert owner is not None
    assert (owner.status, owner.pending_approval, owner.step_index) == (
        "suspended",
        request,
        0,
    )
    # suspension keeps ownership: a competing start is refused
    with pytest.raises(
        phronomy.AgentBusyError, match="nonterminal top-level execution"
    ):
        await runtime.executions.run("shop", [lambda v: v])
    execution.approve("yes")
    result = await execution.result()
    assert (result.status, result.value) == ("completed", "shipped (yes)")
    assert received == [phronomy.Approval(request=request, response="yes")]

    rejected = runtime.executions.start("shop", [lambda v: request, after])
    await _until(lambda: _suspended(runtime, rejected))
    rejected.reject("no budget")
    result = await rejected.result()
    assert (result.status, result.rejection, result.value) == (
        "rejected",
        "no budget",
        None,
    )


async def test_wait_for_approval(runtime: phronomy.Runtime) -> None:
    request = phronomy.ApprovalRequest(question="go?")
    execution = runtime.executions.start("w", [lambda v: v, lambda v: request])
    assert await execution.wait_for_approval() == request
    execution.approve()
    await execution.result()
    with pytest.raises(phronomy.ApprovalStateError, match="without asking"):
        await execution.wait_for_approval()
    busy_holder = runtime.executions.start("w2", [lambda v: request])
    await busy_holder.wait_for_approval()
    refused = runtime.executions.start("w2", [lambda v: v])  # refused: the key is busy
    with pytest.raises(phronomy.ApprovalStateError, match="ended"):
        with trio.fail_after(2):
            await refused.wait_for_approval()
    busy_holder.reject()


async def test_approval_errors_are_clear(runtime: phronomy.Runtime) -> None:
    with pytest.raises(phronomy.ExecutionNotFoundError, match="no live execution"):
        runtime.executions.approve("nope")
    gate = threading.Event()
    execution = runtime.executions.start("busy", [lambda v: gate.wait(5)])
    await _until(lambda: execution.owner() is not None)
    with pytest.raises(
        phronomy.ApprovalStateError, match="not waiting for an approval"
    ):
        execution.approve()
    gate.set()
    await execution.result()


async def test_cancel_waits_for_the_blocking_tool(runtime: phronomy.Runtime) -> None:
    # scenario 126 and the 0.5 s case
    entered = threading.Event()

    def tool(value: Any) -> str:
        entered.set()
        time.sleep(0.5)
        return "late result"

    execution = runtime.executions.start("agent-q", [tool, lambda v: "never"])
    await _until(entered.is_set)
    started = trio.current_time()
    assert execution.cancel("operator")
    await trio.sleep(0.1)
    assert not execution.done  # still not settled: the tool is running
    competitor = runtime.executions.start("agent-q", [lambda v: v])
    with pytest.raises(phronomy.AgentBusyError):
        await competitor.result()
    with pytest.raises(phronomy.CancellationError, match="cancelled: operator"):
        await execution.result()
    elapsed = trio.current_time() - started
    assert 0.3 <= elapsed < 1.0
    assert execution.status == "cancelled"
    assert not runtime.executions.is_admitted("agent-q")
    assert (await runtime.executions.run("agent-q", [lambda v: "free"])).value == "free"


async def test_deadline_cancels_with_the_same_quiescence(
    runtime: phronomy.Runtime,
) -> None:
    entered = threading.Event()

    def tool(value: Any) -> str:
        entered.set()
        time.sleep(0.4)
        return "late"

    execution = runtime.executions.start(
        "agent-d", [tool], deadline=trio.current_time() + 0.1
    )
    await _until(entered.is_set)
    with pytest.raises(phronomy.DeadlineExceededError, match="passed its deadline"):
        await execution.result()
    owner_gone = execution.owner() is None
    assert owner_gone


async def test_cancelling_an_async_step_cancels_its_task_and_waits_for_its_threads(
    runtime: phronomy.Runtime,
) -> None:
    released = threading.Event()
    events: list[str] = []

    async def agentic(value: Any, ctx: phronomy.StepContext) -> str:
        try:
            return await ctx.offload(lambda: (released.wait(5), "tool done")[1])
        finally:
            events.append("step left")

    execution = runtime.executions.start("agent-a", [agentic])
    await _until(lambda: execution.owner() is not None)
    await trio.sleep(0.05)
    execution.cancel()
    await _until(lambda: events == ["step left"])
    await trio.sleep(0.05)
    assert not execution.done  # the offloaded thread still runs
    released.set()
    with pytest.raises(phronomy.CancellationError):
        await execution.result()


async def test_cancel_of_a_suspended_execution_is_immediate(
    runtime: phronomy.Runtime,
) -> None:
    execution = runtime.executions.start(
        "s", [lambda v: phronomy.ApprovalRequest(question="?")]
    )
    await _until(lambda: _suspended(runtime, execution))
    assert execution.cancel()
    with pytest.raises(phronomy.CancellationError):
        await execution.result()
    assert not execution.cancel()


async def test_stale_step_results_are_dropped(runtime: phronomy.Runtime) -> None:
    # scenario 128: a result whose semantic id is not current never changes state
    gate = threading.Event()
    execution = runtime.executions.start(
        "stale", [lambda v: (gate.wait(5), "current")[1], lambda v: f"next:{v}"]
    )
    await _until(lambda: execution.owner() is not None)
    registry = runtime.executions._registry
    stale = StepResult(
        execution_id=execution.execution_id,
        step_id="stale-id",
        done=ResultHandle.completed("stale"),
    )
    assert registry.post_message(stale)
    await trio.sleep(0.05)
    owner = execution.owner()
    assert owner is not None
    assert owner.step_index == 0
    gate.set()
    assert (await execution.result()).value == "next:current"


async def test_purge_and_admission_reads(runtime: phronomy.Runtime) -> None:
    # scenarios 124, 125
    assert not runtime.executions.is_admitted("unknown")
    assert not runtime.executions.is_admitted(None)
    assert not runtime.executions.is_admitted("")
    execution = runtime.executions.start(
        "p", [lambda v: phronomy.ApprovalRequest(question="?")]
    )
    await _until(lambda: _suspended(runtime, execution))
    with pytest.raises(phronomy.AgentBusyError, match="cannot be purged"):
        await runtime.executions.purge("p")
    execution.reject()
    await execution.result()
    assert not await runtime.executions.purge("p")  # no store: nothing to delete


async def test_bad_arguments(runtime: phronomy.Runtime) -> None:
    with pytest.raises(phronomy.InvalidIdentifierError):
        runtime.executions.start("", [lambda v: v])
    with pytest.raises(phronomy.DefinitionError, match="at least one step"):
        runtime.executions.start("a", [])
    with pytest.raises(phronomy.DefinitionError, match="must take"):
        runtime.executions.start("a", [lambda a, b, c: None])
    with pytest.raises(phronomy.DefinitionError, match="callable"):
        runtime.executions.start("a", [42])  # type: ignore[list-item]


async def test_shutdown_fails_suspended_waiters_with_rehydration_required() -> None:
    async with phronomy.open_runtime() as rt:
        execution = rt.executions.start(
            "s", [lambda v: phronomy.ApprovalRequest(question="?")]
        )
        await _until(lambda: _suspended(rt, execution))
    with pytest.raises(
        phronomy.ExecutionRehydrationRequiredError, match="lost its live owner"
    ):
        await execution.result()
    assert rt.shutdown_result is not None
    assert rt.shutdown_result.clean  # a suspended execution does not block shutdown


async def test_shutdown_cuts_off_running_executions_after_the_deadline() -> None:
    gate = threading.Event()
    async with phronomy.open_runtime(shutdown_timeout=0.05, cancel_grace=2) as rt:
        execution = rt.executions.start("r", [lambda v: gate.wait(0.3)])
        await _until(lambda: execution.owner() is not None)
    assert rt.shutdown_result is not None
    assert any(
        "execution" in item and "of agent r" in item
        for item in rt.shutdown_result.cut_off
    )
    assert (
        rt.shutdown_result.cleanup_complete
    )  # the thread returned within the grace period
    with pytest.raises(phronomy.ExecutionRehydrationRequiredError):
        await execution.result()


# --- durable executions ---------------------------------------------------------------------


async def test_durable_records_and_admission_before_storage(
    open_sqlite: Callable[..., phronomy.SQLiteStore], tmp_path: Path
) -> None:
    # scenarios 121, 122
    store = FaultyStore(open_sqlite(tmp_path / "agents.db"))
    async with phronomy.open_runtime(store=store) as rt:
        gate = store.block("load.before")
        first = rt.executions.start("a", [lambda v: "done"])
        await _until(lambda: rt.executions.is_admitted("a"))
        loads = store.count("load")
        with pytest.raises(phronomy.AgentBusyError):
            await rt.executions.run("a", [lambda v: v])
        assert store.count("load") == loads  # the competitor never touched storage
        gate.set()
        assert (await first.result()).value == "done"
        record = await rt.executions.record("a")
        assert record is not None
        assert (record.execution_id, record.status, record.steps_completed) == (
            first.execution_id,
            "completed",
            1,
        )
        store.fail("load.before", OSError("disk"))
        with pytest.raises(OSError, match="disk"):
            await rt.executions.run("a", [lambda v: v])
        assert (
            await rt.executions.run("a", [lambda v: "again"])
        ).value == "again"  # a known failure frees the key
        assert await rt.executions.purge("a")
        assert await rt.executions.record("a") is None


async def test_a_nonterminal_record_in_the_store_fails_closed(
    open_sqlite: Callable[..., phronomy.SQLiteStore], tmp_path: Path
) -> None:
    # scenario 123: another process (or a crash) left an active execution
    path = tmp_path / "agents.db"
    async with phronomy.open_runtime(store=open_sqlite(path)) as rt:
        execution = rt.executions.start(
            "x", [lambda v: phronomy.ApprovalRequest(question="?")]
        )
        await _until(lambda: _suspended(rt, execution))
        # this runtime stops with the execution suspended: its record stays "active"
    store = FaultyStore(open_sqlite(path))
    async with phronomy.open_runtime(store=store) as rt:
        with pytest.raises(phronomy.AgentBusyError, match="in the store"):
            await rt.executions.run("x", [lambda v: v])
        loads = store.count("load")
        with pytest.raises(phronomy.AgentBusyError):
            await rt.executions.run("x", [lambda v: v])
        assert (
            store.count("load") == loads
        )  # refused at admission, storage not probed again
        assert rt.executions.is_admitted("x")


async def test_uncertain_terminal_durability_keeps_the_caller_pending(
    open_sqlite: Callable[..., phronomy.SQLiteStore],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # scenario 127
    caplog.set_level(logging.WARNING)
    store = FaultyStore(open_sqlite(tmp_path / "agents.db"))
    async with phronomy.open_runtime(store=store) as rt:
        gate = threading.Event()
        execution = rt.executions.start("u", [lambda v: (gate.wait(5), "value")[1]])
        await _until(lambda: execution.owner() is not None)
        store.fail("save.before", OSError("connection reset")).fail(
            "readback.before", OSError("unreadable")
        )
        gate.set()
        with pytest.raises(trio.TooSlowError):
            with trio.fail_after(0.3):
                await execution.result()
        assert "requires recovery" in caplog.text
        with pytest.raises(phronomy.AgentBusyError):
            await rt.executions.run("u", [lambda v: v])
        owner = execution.owner()
        assert owner is not None
        assert owner.status == "recovery_required"
    with pytest.raises(phronomy.ExecutionRehydrationRequiredError):
        await execution.result()


async def test_cancelled_durable_execution_records_cancelled(
    open_sqlite: Callable[..., phronomy.SQLiteStore], tmp_path: Path
) -> None:
    store = open_sqlite(tmp_path / "agents.db")
    async with phronomy.open_runtime(store=store) as rt:
        entered = threading.Event()

        def tool(value: Any) -> None:
            entered.set()
            time.sleep(0.2)

        execution = rt.executions.start("c", [tool])
        await _until(entered.is_set)
        execution.cancel()
        with pytest.raises(phronomy.CancellationError):
            await execution.result()
        record = await rt.executions.record("c")
        assert record is not None
        assert record.status == "cancelled"
        assert store.load(agent_key("c")).status == "finished"  # type: ignore[union-attr]
