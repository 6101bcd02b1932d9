"""Supervised executions (spec §6, scenarios 121-128, seed 003)."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.testing

import phronomy
from phronomy.agent._steps import StepOutput
from phronomy.testing import FaultyStore
from polling import until

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path


def _suspended(
    runtime: phronomy.Runtime, execution: phronomy.agent.ExecutionHandle
) -> bool:
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

    async def concurrent(value: int, ctx: phronomy.agent.StepContext) -> int:
        seen.append(("async", threading.get_ident() == main_thread))
        assert ctx.step_index == 1
        assert ctx.execution_id
        return await ctx.offload(lambda: value * 10)

    result = await runtime.executions.invoke("agent", [blocking, concurrent], 1)
    assert (result.status, result.value) == ("completed", 20)
    assert seen == [("sync", True), ("async", True)]
    assert not runtime.executions.is_admitted("agent")


async def test_step_failures_fail_the_caller_and_free_the_key(
    runtime: phronomy.Runtime,
) -> None:
    def boom(value: Any) -> None:
        raise KeyError("tool failed")

    with pytest.raises(KeyError, match="tool failed"):
        await runtime.executions.invoke("k", [boom])
    assert (await runtime.executions.invoke("k", [lambda v: "ok"])).value == "ok"


async def test_sync_step_returning_an_awaitable_is_refused(
    runtime: phronomy.Runtime,
) -> None:
    async def later() -> int:
        return 1

    with pytest.raises(TypeError, match="declare it with async def"):
        await runtime.executions.invoke("k", [lambda v: later()])


async def test_approval_suspends_then_approve_or_reject(
    runtime: phronomy.Runtime,
) -> None:
    request = phronomy.ApprovalRequest(question="ship it?", details={"order": 7})
    received: list[Any] = []

    def after(approval: phronomy.Approval) -> str:
        received.append(approval)
        return f"shipped ({approval.response})"

    execution = runtime.executions.start("shop", [lambda v: request, after])
    await until(lambda: _suspended(runtime, execution))
    owner = execution.owner()
    assert owner is not None
    assert (owner.status, owner.pending_approval, owner.step_index) == (
        "suspended",
        request,
        0,
    )
    # suspension keeps ownership: a competing start is refused
    with pytest.raises(phronomy.BusyError, match="nonterminal top-level execution"):
        await runtime.executions.invoke("shop", [lambda v: v])
    execution.approve("yes")
    result = await execution.result()
    assert (result.status, result.value) == ("completed", "shipped (yes)")
    assert received == [phronomy.Approval(request=request, response="yes")]

    rejected = runtime.executions.start("shop", [lambda v: request, after])
    await until(lambda: _suspended(runtime, rejected))
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
    with pytest.raises(phronomy.InstanceStateError, match="without asking"):
        await execution.wait_for_approval()
    busy_holder = runtime.executions.start("w2", [lambda v: request])
    await busy_holder.wait_for_approval()
    refused = runtime.executions.start("w2", [lambda v: v])  # refused: the key is busy
    with pytest.raises(phronomy.InstanceStateError, match="ended"):
        with trio.fail_after(2):
            await refused.wait_for_approval()
    busy_holder.reject()


async def test_approval_errors_are_clear(runtime: phronomy.Runtime) -> None:
    with pytest.raises(phronomy.NotFoundError, match="no live execution"):
        runtime.executions.approve("nope")
    gate = threading.Event()
    execution = runtime.executions.start("busy", [lambda v: gate.wait(5)])
    await until(lambda: execution.owner() is not None)
    with pytest.raises(
        phronomy.InstanceStateError, match="not waiting for an approval"
    ):
        execution.approve()
    gate.set()
    await execution.result()


class _BlockingTool:
    """A step that blocks its worker thread until released; records when it returned."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.returned = threading.Event()

    def __call__(self, value: Any) -> str:
        self.entered.set()
        self.release.wait(10)
        self.returned.set()
        return "late result"

    def returned_when_settled(
        self, handle: phronomy.agent.ExecutionHandle
    ) -> list[bool]:
        seen: list[bool] = []
        handle.handle.on_complete(lambda _: seen.append(self.returned.is_set()))
        return seen


def _revoked(execution: phronomy.agent.ExecutionHandle) -> bool:
    owner = execution.owner()
    return owner is not None and owner.status in ("cancelling", "terminalizing")


@pytest.mark.parametrize("how", ["cancel", "deadline", "timeout"])
async def test_cancel_and_deadline_settle_only_after_the_tool_returned(
    runtime: phronomy.Runtime, how: str
) -> None:
    # scenario 126: result authority is revoked at once, but the caller settles (and
    # the key frees) only once the tool's thread has physically returned.
    tool = _BlockingTool()
    limits: dict[str, float] = {}
    if how == "deadline":
        limits["deadline"] = trio.current_time() + 0.05
    elif how == "timeout":
        limits["timeout"] = 0.05  # seconds from now
    execution = runtime.executions.start("agent-q", [tool, lambda v: "never"], **limits)
    settled_after_return = tool.returned_when_settled(execution)
    await until(tool.entered.is_set)
    if how == "cancel":
        assert execution.cancel("operator")
    await until(lambda: _revoked(execution))  # the cancel/deadline was applied
    assert not execution.done  # the tool still runs
    with pytest.raises(phronomy.BusyError):
        await runtime.executions.invoke("agent-q", [lambda v: v])
    tool.release.set()
    error = (
        phronomy.CancellationError
        if how == "cancel"
        else phronomy.DeadlineExceededError
    )
    with pytest.raises(error, match=r"passed its deadline|cancelled: operator"):
        await execution.result()
    assert settled_after_return == [True]
    assert execution.status == "cancelled"
    assert execution.owner() is None
    assert not runtime.executions.is_admitted("agent-q")
    assert (
        await runtime.executions.invoke("agent-q", [lambda v: "free"])
    ).value == "free"


async def test_cancelling_an_async_step_cancels_its_task_and_waits_for_its_threads(
    runtime: phronomy.Runtime,
) -> None:
    released = threading.Event()
    events: list[str] = []

    entered = threading.Event()

    def tool() -> str:
        entered.set()
        released.wait(5)
        return "tool done"

    async def agentic(value: Any, ctx: phronomy.agent.StepContext) -> str:
        try:
            return await ctx.offload(tool)
        finally:
            events.append("step left")

    execution = runtime.executions.start("agent-a", [agentic])
    await trio.to_thread.run_sync(entered.wait)
    execution.cancel()
    await until(lambda: events == ["step left"])
    await trio.testing.wait_all_tasks_blocked()  # everything but the thread settled
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
    await until(lambda: _suspended(runtime, execution))
    assert execution.cancel()
    with pytest.raises(phronomy.CancellationError):
        await execution.result()
    assert not execution.cancel()


async def test_stale_step_results_are_dropped(runtime: phronomy.Runtime) -> None:
    # scenario 128: a result whose step run id is not current never changes state
    gate = threading.Event()
    execution = runtime.executions.start(
        "stale", [lambda v: (gate.wait(5), "current")[1], lambda v: f"next:{v}"]
    )
    await until(lambda: _executing(execution))
    stale = StepOutput(step_id="stale-id", value="stale")
    outcome = await runtime.workflows.deliver(
        execution.plan, "agent:stale", "step_done", stale
    )
    assert outcome.status == "rejected"  # no guard takes another run's result
    owner = execution.owner()
    assert owner is not None
    assert owner.step_index == 0
    gate.set()
    assert (await execution.result()).value == "next:current"


def _executing(execution: phronomy.agent.ExecutionHandle) -> bool:
    owner = execution.owner()
    return owner is not None and owner.status == "executing"


async def test_purge_and_admission_reads(runtime: phronomy.Runtime) -> None:
    # scenarios 124, 125
    assert not runtime.executions.is_admitted("unknown")
    assert not runtime.executions.is_admitted(None)
    assert not runtime.executions.is_admitted("")
    execution = runtime.executions.start(
        "p", [lambda v: phronomy.ApprovalRequest(question="?")]
    )
    await until(lambda: _suspended(runtime, execution))
    with pytest.raises(phronomy.BusyError, match="cannot be purged"):
        await runtime.executions.purge("p")
    execution.reject()
    await execution.result()
    assert not await runtime.executions.purge("p")  # no store: nothing to delete


async def test_bad_arguments(runtime: phronomy.Runtime) -> None:
    with pytest.raises(phronomy.InvalidInputError):
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
        await until(lambda: _suspended(rt, execution))
    with pytest.raises(
        phronomy.RuntimeShutdownError,
        match="cut off when the runtime shut down",
    ):
        await execution.result()
    assert rt.shutdown_result is not None
    assert rt.shutdown_result.clean  # a suspended execution does not block shutdown


async def test_shutdown_cuts_off_running_executions_after_the_deadline() -> None:
    gate = threading.Event()
    async with phronomy.open_runtime(shutdown_timeout=0.05, cancel_grace=2) as rt:
        execution = rt.executions.start("r", [lambda v: gate.wait(0.3)])
        await until(lambda: execution.owner() is not None)
    assert rt.shutdown_result is not None
    assert any(
        "execution" in item and "of agent r" in item
        for item in rt.shutdown_result.cut_off
    )
    assert (
        rt.shutdown_result.cleanup_complete
    )  # the thread returned within the grace period
    with pytest.raises(phronomy.RuntimeShutdownError):
        await execution.result()


# --- durable executions ---------------------------------------------------------------------


async def test_durable_records_and_admission_before_storage(
    open_sqlite: Callable[..., phronomy.SQLiteStore], tmp_path: Path
) -> None:
    # scenarios 121, 122
    store = FaultyStore(open_sqlite(tmp_path / "agents.db"))
    async with phronomy.open_runtime(store=store) as rt:
        gate = store.block("claim.before")
        first = rt.executions.start("a", [lambda v: "done"])
        # admitted, and its claim is blocked in the store
        await until(
            lambda: rt.executions.is_admitted("a") and store.count("claim") == 1
        )
        claims = store.count("claim")
        with pytest.raises(phronomy.BusyError):
            await rt.executions.invoke("a", [lambda v: v])
        assert store.count("claim") == claims  # the competitor never touched storage
        gate.set()
        assert (await first.result()).value == "done"
        record = await rt.executions.record("a")
        assert record is not None
        assert (record.execution_id, record.status, record.steps_completed) == (
            first.execution_id,
            "completed",
            1,
        )
        store.fail("claim.before", OSError("disk"))
        with pytest.raises(OSError, match="disk"):
            await rt.executions.invoke("a", [lambda v: v])
        assert (
            await rt.executions.invoke("a", [lambda v: "again"])
        ).value == "again"  # a known failure frees the key
        assert await rt.executions.purge("a")
        assert await rt.executions.record("a") is None


async def test_an_execution_of_a_dead_process_frees_its_key_after_the_sweep(
    open_sqlite: Callable[..., phronomy.SQLiteStore], tmp_path: Path
) -> None:
    # scenario 123, adapted (deviation): an execution is leased. Before: a crashed
    # process left its record "active" until an operator released it, and from another
    # process a live execution looked as stale as a dead one.
    path = tmp_path / "agents.db"
    # a process claimed agent x's execution, then died before its first save
    open_sqlite(path).begin(
        "agent:x", "phronomy.execution:gone", lease_owner="dead-runtime", ttl_ms=1500
    )
    store = FaultyStore(open_sqlite(path))
    async with phronomy.open_runtime(
        store=store,
        lease_ttl=1.5,
        heartbeat_interval=0.3,
        lease_margin=0.3,
        sweep_interval=0.2,
    ) as rt:
        with pytest.raises(phronomy.BusyError, match="nonterminal top-level") as caught:
            await rt.executions.invoke("x", [lambda v: v])
        assert "runtime.executions.cancel_agent('x')" in str(caught.value)
        assert not rt.executions.is_admitted("x")  # not locked in-process
        record = await rt.executions.record("x")
        assert record is not None
        assert record.status == "active"
        assert record.lease is not None
        assert record.lease.owner == "dead-runtime"  # who runs it: a live lease
        assert record.lease.live is True  # on the store's lease clock
        # within lease_ttl + sweep_interval, the sweep closes it honestly: it never
        # saved a step, so it failed (and a new start of the key runs)
        started = trio.current_time()

        async def closed() -> bool:
            found = await rt.executions.record("x")
            return found is not None and found.status == "failed"

        while not await closed():
            assert trio.current_time() - started < 1.5 + 0.2 + 1.0
            await trio.sleep(0.05)
        assert (await rt.executions.invoke("x", [lambda v: "again"])).value == "again"
        assert await rt.executions.purge("x")


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
        await until(lambda: execution.owner() is not None)
        store.fail("save.before", OSError("connection reset")).fail(
            "readback.before", OSError("unreadable")
        )
        gate.set()
        with pytest.raises(trio.TooSlowError):
            with trio.fail_after(0.3):
                await execution.result()
        assert "requires recovery" in caplog.text
        with pytest.raises(phronomy.BusyError):
            await rt.executions.invoke("u", [lambda v: v])
        owner = execution.owner()
        assert owner is not None
        assert owner.status == "recovery_required"
    # adapted: the caller learns at shutdown that the key requires recovery (before:
    # a RuntimeShutdownError that did not say so)
    with pytest.raises(phronomy.RecoveryRequiredError, match="requires recovery"):
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
        await until(entered.is_set)
        execution.cancel()
        with pytest.raises(phronomy.CancellationError):
            await execution.result()
        record = await rt.executions.record("c")
        assert record is not None
        assert record.status == "cancelled"
        assert store.load("agent:c").status == "cancelled"  # type: ignore[union-attr]


async def test_a_burst_of_durable_starts_is_bounded_and_leaves_nothing_behind(
    open_sqlite: Callable[..., phronomy.SQLiteStore], tmp_path: Path
) -> None:
    # Before: the store pool's queue was fixed at 64 whatever the configuration;
    # 500 concurrent starts gave 435 BackpressureErrors, some after their step ran,
    # leaving "active" records that blocked their keys for the rest of the runtime.
    store = open_sqlite(tmp_path / "agents.db")
    ran: set[str] = set()

    def step(value: Any, ctx: phronomy.agent.StepContext) -> str:
        ran.add(ctx.agent_id)
        return f"{ctx.agent_id} done"

    pool_size, queue_size, burst = 4, 60, 500
    capacity = pool_size + queue_size
    async with phronomy.open_runtime(
        store=store, pool_size=pool_size, queue_size=queue_size
    ) as rt:
        store_pools = {
            p.name: p.queue_size
            for p in rt.statistics().pools
            if p.name.startswith("phronomy.store")
        }
        assert store_pools == {
            "phronomy.store": queue_size,
            "phronomy.store.reads": queue_size,
        }
        for wave in range(2):
            handles = [
                rt.executions.start(f"key-{i}", [step], wave) for i in range(burst)
            ]
            for handle in handles:
                await handle.handle.wait()
            refused = {
                h.agent_id
                for h in handles
                if isinstance(h.handle.error, phronomy.BackpressureError)
            }
            completed = {h.agent_id for h in handles if h.status == "completed"}
            assert len(completed) == capacity
            assert len(refused) == burst - capacity
            assert ran == completed  # no refused start ran a step
            active = await rt.executions.list(status="active")
            assert active.records == ()  # nothing left "active"
            for key in refused:  # the same keys in both waves (starts run in order)
                assert await rt.executions.record(key) is None
            for key in completed:
                record = await rt.executions.record(key)
                assert record is not None
                assert record.status == "completed"
            ran.clear()
        assert rt.statistics().sessions == 0


async def test_a_clean_shutdown_closes_cut_off_records_honestly(
    open_sqlite: Callable[..., phronomy.SQLiteStore], tmp_path: Path
) -> None:
    # An execution whose steps only this process has (lambdas) cannot be resumed by
    # another one: at shutdown its suspended approval is closed (cancelled), and one
    # cut off while its thread ran is written back to its last save (none: failed).
    # Both keys can start again. (Module-level steps stay suspended: see
    # test_suspended_approvals_survive_shutdown_and_are_answered_elsewhere.)
    path = tmp_path / "agents.db"
    gate = threading.Event()
    entered = threading.Event()

    def tool(value: Any) -> None:
        entered.set()
        gate.wait(5)

    async with phronomy.open_runtime(
        store=open_sqlite(path), shutdown_timeout=0.05, cancel_grace=0.05
    ) as rt:
        suspended = rt.executions.start(
            "waiting", [lambda v: phronomy.ApprovalRequest(question="ship?")]
        )
        busy = rt.executions.start("busy", [tool])
        await until(lambda: _suspended(rt, suspended) and entered.is_set())
    gate.set()
    with pytest.raises(phronomy.RuntimeShutdownError, match="closed as cancelled"):
        await suspended.result()
    with pytest.raises(phronomy.RuntimeShutdownError, match="cut off"):
        await busy.result()
    async with phronomy.open_runtime(store=open_sqlite(path)) as rt:
        record = await rt.executions.record("waiting")
        assert record is not None
        assert record.status == "cancelled"
        assert (
            await rt.executions.invoke("waiting", [lambda v: "anew"])
        ).value == "anew"
        busy_record = await rt.executions.record("busy")
        assert busy_record is not None
        assert busy_record.status in ("failed", "active")
        if busy_record.status == "active":  # its lease expires first
            assert busy_record.lease is not None


async def test_purge_never_deletes_a_workflow_instance(tmp_path: Path) -> None:
    # Before: runtime.executions.purge("victim") deleted the workflow instance
    # "agent:victim" (purge did not check the row's kind, and workflow ids could use
    # the reserved prefix).
    store = phronomy.SQLiteStore(tmp_path / "purge.db")
    flow = phronomy.Workflow(phronomy.State, name="orders").wait_state("w").build()
    try:
        async with phronomy.open_runtime(store=store) as rt:
            with pytest.raises(phronomy.InvalidInputError, match="reserved"):
                await rt.workflows.invoke(flow, workflow_instance_id="agent:victim")
            assert store.load("agent:victim") is None
            # a row an earlier release wrote under the prefix stays where it is
            store.mark("agent:victim", "failed", create=True, workflow="orders")
            before = store.load("agent:victim")
            with pytest.raises(phronomy.InstanceStateError, match="not an execution"):
                await rt.executions.purge("victim")
            assert store.load("agent:victim") == before
            done = await rt.executions.invoke("real", [lambda v: "ok"], "x")
            assert done.value == "ok"
            assert await rt.executions.purge("real")  # an execution record: deleted
            assert store.load("agent:real") is None
    finally:
        store.close()


async def test_timeouts_and_deadlines_are_checked_at_the_call(
    runtime: phronomy.Runtime,
) -> None:
    # Before: deadline=0.5 was read as an absolute trio time (long past) and the
    # execution failed at once with "passed its deadline".
    steps = [lambda v: v]
    with pytest.raises(phronomy.InvalidInputError, match=r"has passed.*pass timeout="):
        runtime.executions.start("t", steps, deadline=0.5)
    for bad in (0, -1, float("inf"), float("nan"), "1", True):
        with pytest.raises(phronomy.InvalidInputError, match="timeout must be"):
            runtime.executions.start("t", steps, timeout=bad)  # type: ignore[arg-type]
    with pytest.raises(phronomy.InvalidInputError, match="not both"):
        runtime.executions.start(
            "t", steps, timeout=1, deadline=trio.current_time() + 1
        )
    assert not runtime.executions.is_admitted("t")  # nothing started
    done = await runtime.executions.invoke("t", steps, "v", timeout=5)
    assert done.value == "v"


async def test_wait_for_approval_ends_once_the_caller_was_settled_directly(
    runtime: phronomy.Runtime,
) -> None:
    # The caller's handle is public: settled by hand while the execution runs, a
    # waiter for an approval hears so at once (regression: it spun on a set event).
    gate = trio.Event()

    async def slow(value: Any) -> Any:
        await gate.wait()
        return value

    execution = runtime.executions.start("settled-by-hand", [slow])
    await until(lambda: execution.owner() is not None)
    execution.handle.cancel()
    with trio.fail_after(1), pytest.raises(phronomy.InstanceStateError, match="ended"):
        await execution.wait_for_approval()
    gate.set()


async def test_an_agent_id_whose_store_key_is_too_long_is_refused_at_once(
    runtime: phronomy.Runtime,
) -> None:
    # its key, "agent:" + the id, is an instance id: at most 255 characters
    longest, too_long = "a" * 249, "b" * 250
    with pytest.raises(phronomy.InvalidInputError, match="limit is 249"):
        runtime.executions.start(too_long, [int], "1")
    assert not runtime.executions.is_admitted(too_long)  # nothing was left busy
    with pytest.raises(phronomy.InvalidInputError, match="agent_id"):
        await runtime.executions.record(too_long)
    result = await runtime.executions.invoke(longest, [int], "1")
    assert (result.status, result.value) == ("completed", 1)
