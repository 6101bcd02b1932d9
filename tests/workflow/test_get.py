"""Reading an instance: ``runtime.workflows.get`` on every store."""

from __future__ import annotations

import functools
import threading
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import msgspec
import pytest
import trio

import phronomy
from phronomy.storage import (
    ClaimOp,
    InboxOp,
    LoadOp,
    Posting,
    PostOp,
    RenewOp,
    SaveOp,
    SaveRequest,
    encode_snapshot,
)
from phronomy.workflow import InstanceDescription, InstanceLease

from .helpers import Value, approval_flow, live_flow, runtime_on, start_live

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path


def _timed_flow() -> phronomy.WorkflowDefinition[Value]:
    """prepare -> awaiting (wait; approve, or a 1-hour timeout) -> FINISH."""
    wf = phronomy.Workflow(Value, name="timed")
    wf.state("prepare", entry=lambda s: s.merge(value="prepared"))
    wf.wait_state("awaiting")
    wf.transition("prepare", "awaiting")
    wf.transition("awaiting", phronomy.FINISH, on="approve")
    wf.transition("awaiting", phronomy.FINISH, after=timedelta(hours=1))
    return wf.build()


async def test_get_describes_a_halted_instance_its_timers_and_pending_events(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    flow = _timed_flow()
    store = make_store()
    async with runtime_on(store) as rt:
        await rt.workflows.invoke(flow, {"count": 3}, workflow_instance_id="o-1")
        got = await rt.workflows.get(flow, "o-1")
    assert isinstance(got, InstanceDescription)
    assert isinstance(got.state, Value)  # decoded into the state class
    assert (got.workflow_instance_id, got.workflow, got.status, got.phase) == (
        "o-1",
        "timed",
        "halted",
        "awaiting",
    )
    assert (got.state.value, got.state.count, got.revision) == ("prepared", 3, 1)
    assert got.definition_version == flow.version
    assert got.lease is None  # a halted instance is held by no runtime
    assert got.pending_events == ()
    assert [(t.name, t.event, t.kind) for t in got.pending_timers] == [
        (got.pending_timers[0].name, got.pending_timers[0].event, "timeout")
    ]
    assert got.pending_timers[0].due_at_ms - got.updated_at_ms == pytest.approx(
        3_600_000, abs=60_000
    )
    assert (got.error, got.cancel_requested, got.takeovers) == (None, None, 0)
    # an event stored while no runtime serves the workflow stays pending
    posting = Posting(
        workflow_instance_id="o-1", event_id="e-1", event="approve", payload=b'"ok"'
    )
    await trio.to_thread.run_sync(store.execute, [PostOp(posting=posting)])
    async with runtime_on(make_store(), inbox_poll_interval=0) as rt:
        pending = await rt.workflows.get(flow, "o-1")
        assert [(e.event_id, e.event, e.seq) for e in pending.pending_events] == [
            ("e-1", "approve", 1)
        ]
        assert msgspec.json.decode(pending.pending_events[0].payload) == "ok"
        assert pending.revision == 1
        # once applied, it is pending no more and the instance moved on
        await rt.workflows.send_event(
            flow, "approve", payload="ok", workflow_instance_id="o-1", event_id="e-1"
        )
        done = await rt.workflows.get(flow, "o-1")
    assert (done.status, done.phase, done.revision) == ("finished", "__end__", 2)
    assert (done.pending_events, done.pending_timers) == ((), ())


async def test_get_shows_the_live_lease_of_a_running_instance(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    flow = live_flow()
    async with runtime_on(make_store()) as rt:
        handle = await start_live(rt, flow, "l-1")
        got = await rt.workflows.get(flow, "l-1")
        assert got.status == "running"
        assert isinstance(got.lease, InstanceLease)
        assert got.lease.live
        assert got.lease.epoch >= 1
        assert got.lease.owner
        assert rt.workflows.signal(flow, "l-1", "finish")
        await handle.result()
        closed = await rt.workflows.get(flow, "l-1")
    assert (closed.status, closed.lease) == ("finished", None)


async def test_a_lease_its_owner_let_expire_reads_as_expired_on_the_store_clock(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    flow = approval_flow()
    store = make_store()
    async with runtime_on(store, sweep_interval=0) as rt:
        await rt.workflows.invoke(flow, workflow_instance_id="g-1")
        # a runtime elsewhere (a ghost owner) claims it, then stops renewing its lease
        claim = ClaimOp(
            workflow_instance_id="g-1",
            workflow="approval",
            lease_owner="ghost",
            ttl_ms=3_600_000,
            statuses=("halted",),
        )
        claimed = await trio.to_thread.run_sync(store.execute, [claim])
        assert claimed[0].unwrap().epoch is not None
        held = await rt.workflows.get(flow, "g-1")
        assert held.status == "running"
        assert held.lease is not None
        assert (held.lease.owner, held.lease.live) == ("ghost", True)
        release = RenewOp(owner="ghost", instance_ids=("g-1",), ttl_ms=0)
        await trio.to_thread.run_sync(store.execute, [release])
        expired = await rt.workflows.get(flow, "g-1")
    assert expired.lease is not None
    assert (expired.lease.owner, expired.lease.live) == ("ghost", False)
    assert expired.lease.epoch == held.lease.epoch
    assert expired.lease.expires_at_ms <= held.lease.expires_at_ms - 3_000_000


async def test_get_refuses_unknown_ids_other_workflows_and_bad_input(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    flow, other = approval_flow(), _timed_flow()
    async with runtime_on(make_store()) as rt:
        await rt.workflows.invoke(flow, workflow_instance_id="a-1")
        with pytest.raises(phronomy.NotFoundError, match="'nobody' does not exist"):
            await rt.workflows.get(flow, "nobody")
        with pytest.raises(
            phronomy.InstanceStateError, match="belongs to workflow 'approval'"
        ):
            await rt.workflows.get(other, "a-1")
        for bad in ("", "x" * 10_000, 7):
            with pytest.raises(phronomy.InvalidInputError):
                await rt.workflows.get(flow, bad)  # type: ignore[arg-type]
        for limit in (0, True, "3"):
            with pytest.raises(phronomy.InvalidInputError, match="limit"):
                await rt.workflows.get(flow, "a-1", limit=limit)  # type: ignore[arg-type]
        got = await rt.workflows.get(flow, "a-1")  # nothing changed
    assert (got.status, got.revision) == ("halted", 1)


async def test_get_needs_a_store() -> None:
    async with phronomy.open_runtime() as rt:
        with pytest.raises(phronomy.InvalidInputError, match="get reads the store"):
            await rt.workflows.get(approval_flow(), "a-1")


async def test_get_reads_in_a_worker_thread_while_the_trio_thread_runs_on() -> None:
    # A load the store holds up (in its worker thread) does not stop the trio thread:
    # the test releases it from a trio task while get waits.
    release = threading.Event()
    holding = threading.Event()

    def hook(point: str) -> None:
        if point == "load.before" and not release.is_set():
            holding.set()
            assert release.wait(10)

    store = phronomy.MemoryStore(fault_hook=hook)
    flow = approval_flow()
    release.set()
    async with runtime_on(store) as rt:
        await rt.workflows.invoke(flow, workflow_instance_id="t-1")
        release.clear()
        got: list[InstanceDescription[Value]] = []

        async def read() -> None:
            got.append(await rt.workflows.get(flow, "t-1"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            # the trio thread runs on (a blocked one would never get here)
            assert await trio.to_thread.run_sync(holding.wait, 10)
            assert got == []
            release.set()
    assert got[0].phase == "awaiting"


async def test_an_executions_record_judges_its_lease_on_the_store_clock(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # runtime.executions.record is the executions' get: its lease says live or not
    store = make_store()
    await trio.to_thread.run_sync(
        functools.partial(
            store.begin,
            "agent:y",
            "phronomy.execution:gone",
            lease_owner="ghost",
            ttl_ms=3_600_000,
        )
    )
    async with runtime_on(store, sweep_interval=0) as rt:
        held = await rt.executions.record("y")
        assert held is not None
        assert held.lease is not None
        assert (held.lease.owner, held.lease.live) == ("ghost", True)
        release = RenewOp(owner="ghost", instance_ids=("agent:y",), ttl_ms=0)
        await trio.to_thread.run_sync(store.execute, [release])
        expired = await rt.executions.record("y")
    assert expired is not None
    assert expired.lease is not None
    assert (expired.lease.owner, expired.lease.live) == ("ghost", False)


async def test_a_save_while_get_reads_is_not_seen_get_reads_one_snapshot(
    open_sqlite: Callable[..., phronomy.SQLiteStore], tmp_path: Path
) -> None:
    # the row, the inbox and the timers are read in one batch, one snapshot: a save
    # and a post committed between the reads (here: right after the row's) are not
    # seen, and nothing is read twice
    flow = approval_flow()
    reads: list[str] = []
    saved: list[int] = []

    def hook(point: str) -> None:
        if point in ("inbox.after", "load.after", "timers.after"):
            reads.append(point)
        if point == "load.after" and not saved:
            saved.append(1)
            snapshot = encode_snapshot(
                Value(value="saved elsewhere"),
                workflow_instance_id="c-1",
                revision=2,
                phase="awaiting",
                workflow="approval",
            )
            request = SaveRequest(
                workflow_instance_id="c-1",
                expected_revision=1,
                snapshot=snapshot,
                write_id="w-2",
                status="halted",
                phase="awaiting",
                workflow="approval",
                definition_version=flow.version,
            )
            posting = Posting(
                workflow_instance_id="c-1",
                event_id="e-9",
                event="approve",
                payload=b"1",
            )
            done = store.execute([SaveOp(request=request), PostOp(posting=posting)])
            assert done[0].unwrap().outcome == "success"
            assert done[1].unwrap().entry is not None

    store = open_sqlite(tmp_path / "reads.db")
    async with runtime_on(store, inbox_poll_interval=0) as rt:
        await rt.workflows.invoke(flow, workflow_instance_id="c-1")
        store.fault_hook = hook
        got = await rt.workflows.get(flow, "c-1")
        store.fault_hook = None
        again = await rt.workflows.get(flow, "c-1")
    assert reads == ["load.after", "inbox.after", "timers.after"]
    assert (got.revision, got.state.value if got.state else None) == (1, ":prepared")
    assert got.pending_events == ()
    assert (again.revision, again.state.value if again.state else None) == (
        2,
        "saved elsewhere",
    )
    assert [e.event_id for e in again.pending_events] == ["e-9"]


def _counter_flow() -> phronomy.WorkflowDefinition[Value]:
    """waiting (wait; each ``inc`` adds one to ``count``; a 1-hour timeout)."""
    wf = phronomy.Workflow(Value, name="counter")
    wf.wait_state("w")
    wf.transition("w", "w", on="inc", action=lambda s: s.merge(count=s.count + 1))
    wf.transition("w", phronomy.FINISH, after=timedelta(hours=1))
    return wf.build()


async def test_get_never_lists_an_event_its_state_applied_while_events_arrive(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # events are posted (and applied, saved) while two readers get the instance: the
    # n-th ``inc`` is inbox entry n, so a description at count n lists none <= n
    flow = _counter_flow()
    total = 40
    seen: list[tuple[int, int, tuple[int, ...], tuple[int, ...]]] = []
    async with runtime_on(make_store()) as rt:
        await rt.workflows.invoke(flow, workflow_instance_id="c-1")

        async def read() -> None:  # until it reads every event applied
            count = -1
            while count < total:
                got = await rt.workflows.get(flow, "c-1", limit=1000)
                assert got.state is not None
                count = got.state.count
                seen.append(
                    (
                        count,
                        got.revision,
                        tuple(e.seq for e in got.pending_events),
                        tuple(t.armed_revision for t in got.pending_timers),
                    )
                )

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read)
                nursery.start_soon(read)
                for _ in range(total):
                    await rt.workflows.post(flow, "c-1", "inc", None)
    stale = [s for s in seen if any(seq <= s[0] for seq in s[2])]
    assert stale == []
    assert all(revision == count + 1 for count, revision, _, _ in seen)
    assert all(armed <= s[1] for s in seen for armed in s[3])
    # the reads ran while events were pending and applied: they could have failed
    assert any(pending for _, _, pending, _ in seen)
    assert len({count for count, _, _, _ in seen}) > 2


async def test_reads_run_together_and_writes_are_refused() -> None:
    store = phronomy.MemoryStore()
    async with runtime_on(store) as rt:
        await rt.workflows.invoke(approval_flow(), workflow_instance_id="c-1")
        gateway: Any = rt.workflows._coordinator.gateway
        row, inbox = await gateway.read_together(
            [LoadOp(workflow_instance_id="c-1"), InboxOp(workflow_instance_id="c-1")]
        )
        assert (row.revision, inbox) == (1, ())
        missing = await gateway.read_together(
            [LoadOp(workflow_instance_id="nope")], finish=lambda rows: rows[0] is None
        )
        assert missing is True
        posting = Posting(
            workflow_instance_id="c-1", event_id="e-1", event="approve", payload=b"1"
        )
        for bad in ([], [LoadOp(workflow_instance_id="c-1"), PostOp(posting=posting)]):
            with pytest.raises(phronomy.InvalidInputError, match="reads only"):
                await gateway.read_together(bad)
        assert (await rt.workflows.get(approval_flow(), "c-1")).pending_events == ()
