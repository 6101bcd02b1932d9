"""Cancelling instances: live segments wait for their effects physically; stored ones
get a cancelled revision; cancelling again is harmless."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
import trio

import phronomy
from phronomy.storage import (
    BeginOp,
    InboxEntry,
    MarkOp,
    Posting,
    PostOp,
    RequestCancelOp,
    cancellation,
)
from phronomy.testing import FaultyStore
from phronomy.workflow import FINISH
from records import loaded

from .helpers import Value, admission_state, approval_flow, runtime_on, until

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable


def _blocking_flow(started: threading.Event, finished: list[float]) -> Any:
    def slow_call() -> str:
        started.set()
        time.sleep(0.5)
        finished.append(time.monotonic())
        return "done"

    def call(s: Value, e: Any, effects: phronomy.Effects) -> Value:
        effects.offload(slow_call, on_done="answered")
        return s.merge(steps=["calling"])

    wf = phronomy.Workflow(Value, name="blocking").state("calling", entry=call)
    wf.transition("calling", FINISH, on="answered")
    return wf.build()


async def test_cancel_settles_only_after_the_effects_thread_returned(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    store = make_store()
    started, finished = threading.Event(), list[float]()
    flow = _blocking_flow(started, finished)
    async with runtime_on(store) as rt:
        caller = rt.workflows.start(flow, workflow_instance_id="c-1")
        await trio.to_thread.run_sync(started.wait)
        cancelled = await rt.workflows.cancel(flow, "c-1", reason="customer left")
        settled_at = time.monotonic()
        assert finished  # the thread had returned before the cancel settled
        assert finished[0] <= settled_at
        assert (cancelled.status, cancelled.revision, cancelled.phase) == (
            "cancelled",
            1,
            "calling",
        )
        assert cancelled.state.steps == ["calling"]
        with pytest.raises(
            phronomy.WorkflowCancelledError, match="customer left"
        ) as err:
            await caller.result()
        assert (err.value.instance_id, err.value.reason) == (
            "c-1",
            "customer left",
        )
        row = loaded(store, "c-1")
        assert (row.status, row.revision, row.detail) == (
            "cancelled",
            1,
            "cancelled: customer left",
        )
        again = await rt.workflows.cancel(flow, "c-1")  # idempotent
        assert (again.status, again.revision) == ("cancelled", 1)
        # a cancelled instance is closed: a start refuses it, a restart runs it
        with pytest.raises(phronomy.InstanceExistsError, match="cancelled"):
            await rt.workflows.invoke(flow, workflow_instance_id="c-1")
        restarted = rt.workflows.start(
            flow, workflow_instance_id="c-1", if_exists="restart"
        )
        await until(lambda: admission_state(rt, "c-1") == "executing")
        await rt.workflows.cancel(flow, "c-1")
        with pytest.raises(phronomy.WorkflowCancelledError):
            await restarted.result()
    history = [(e.revision, e.status) for e in store.history("c-1")]
    assert history == [(2, "cancelled"), (1, "cancelled")]


async def test_a_cancel_its_stopped_runtime_never_saw_is_applied_by_the_sweep(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # Before: the sweep cleared the request with the stopped runtime's lease; the
    # instance went back to halted, its pending event resumed it and its confirm step
    # ran, although an operator had asked for its cancellation.
    store = make_store()
    flow = approval_flow()
    async with runtime_on(store) as rt:
        await rt.workflows.invoke(flow, workflow_instance_id="k")  # halted, awaiting

    def a_runtime_claims_it_and_stops_then_an_operator_cancels() -> None:
        row = store.load("k")
        assert row is not None
        claim = BeginOp(
            workflow_instance_id="k",
            workflow="approval",
            expected_revision=row.revision,
            lease_owner="stopped",
            ttl_ms=0,  # its lease expired at once
        )
        assert store.run(claim) is not None
        approve = Posting(
            workflow_instance_id="k", event_id="e1", event="approve", payload=b"null"
        )
        assert store.run(PostOp(posting=approve)).outcome == "stored"
        store.run(RequestCancelOp(workflow_instance_id="k", reason="ops"))

    await trio.to_thread.run_sync(
        a_runtime_claims_it_and_stops_then_an_operator_cancels
    )
    async with runtime_on(
        store, workflows=[flow], sweep_interval=0.05, inbox_poll_interval=0.05
    ) as rt:  # it serves the workflow: it would resume the instance with its event
        await until(lambda: getattr(store.load("k"), "status", "") != "running", 10)
        await trio.sleep(0.3)  # some polls: nothing resumes it
        found = await rt.workflows.get(flow, "k")
    assert found.state is not None
    assert (found.status, found.state.steps) == ("cancelled", ["prepare"])
    assert "cancelled (ops) by the recovery sweep" in (found.error or "")
    assert (found.pending_events, found.lease, found.cancel_requested) == (
        (),
        None,
        None,
    )
    entry = store.run(phronomy.storage.EntryOp(workflow_instance_id="k", event_id="e1"))
    assert entry is not None
    assert entry.status == "refused"


async def test_a_cancelled_segment_takes_no_more_events(
    runtime: phronomy.Runtime,
) -> None:
    gate = trio.Event()

    async def wait_for_gate() -> None:
        await gate.wait()

    def start(s: Value, e: Any, effects: phronomy.Effects) -> None:
        effects.start_soon(wait_for_gate, on_done="finish")

    wf = phronomy.Workflow(Value, name="live").state("live", entry=start)
    wf.transition("live", "live", on="mark", action=lambda s: s.merge(count=1))
    wf.transition("live", FINISH, on="finish")
    flow = wf.build()
    caller = runtime.workflows.start(flow, workflow_instance_id="e-1")  # no store
    await until(lambda: admission_state(runtime, "e-1") == "executing")
    result = await runtime.workflows.cancel(flow, "e-1")  # trio work is cancelled
    assert (result.status, result.revision) == ("cancelled", None)
    with pytest.raises(phronomy.WorkflowCancelledError):
        await caller.result()
    assert (await runtime.workflows.deliver(flow, "e-1", "mark")).status == "not_live"
    with pytest.raises(phronomy.NotFoundError, match="no store"):
        await runtime.workflows.cancel(flow, "e-1")


async def test_cancelling_stored_instances(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    store = make_store()
    flow = approval_flow()
    async with runtime_on(store) as rt:
        halted = await rt.workflows.invoke(
            flow, {"value": "v"}, workflow_instance_id="h"
        )
        done = await rt.workflows.cancel(flow, "h", reason="duplicate order")
        assert (done.status, done.revision, done.phase) == ("cancelled", 2, "awaiting")
        assert halted.revision == 1
        await rt.workflows.invoke(flow, workflow_instance_id="f")
        await rt.workflows.send_event(flow, "approve", workflow_instance_id="f")
        with pytest.raises(phronomy.InstanceStateError, match="is finished"):
            await rt.workflows.cancel(flow, "f")
        with pytest.raises(phronomy.NotFoundError, match="does not exist"):
            await rt.workflows.cancel(flow, "nobody")
        store.run(
            BeginOp(
                workflow_instance_id="r", workflow=flow.name, expected_revision=None
            )
        )
        with pytest.raises(phronomy.InstanceStateError, match="force=True"):
            await rt.workflows.cancel(flow, "r")
        forced = await rt.workflows.cancel(flow, "r", force=True)
        assert (forced.status, forced.revision) == ("cancelled", 0)
        store.run(
            BeginOp(
                workflow_instance_id="leased",
                workflow=flow.name,
                lease_owner="another runtime",
                ttl_ms=60_000,
            )
        )
        leased = store.load("leased")
        for force in (False, True):  # offline, never under another runtime's lease
            with pytest.raises(phronomy.InstanceStateError, match="another runtime"):
                cancellation(leased, "leased", reason=None, write_id="w", force=force)
        await rt.workflows.invoke(flow, workflow_instance_id="q")
        store.run(
            MarkOp(
                workflow_instance_id="q",
                status="recovery_required",
                detail="x",
                expected_revision=1,
            )
        )
        with pytest.raises(phronomy.RecoveryRequiredError):
            await rt.workflows.cancel(flow, "q")
        with pytest.raises(phronomy.InvalidInputError, match="reason must be text"):
            await rt.workflows.cancel(flow, "h", reason=3)  # type: ignore[arg-type]
    assert loaded(store, "h").detail == "cancelled: duplicate order"


async def test_a_cancel_during_loading_applies_once_loaded(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    store = FaultyStore(make_store())
    wf = phronomy.Workflow(Value, name="two-step").wait_state("w").initial("w")
    wf.state("live")
    wf.transition("w", "live", on="approve")
    wf.transition("live", FINISH, on="finish")
    flow = wf.build()
    async with runtime_on(store) as rt:
        await rt.workflows.invoke(flow, workflow_instance_id="l")
        gate = store.block("claim.before")
        resumed = rt.workflows.start_event(flow, "approve", workflow_instance_id="l")
        await until(lambda: admission_state(rt, "l") == "admitting")
        results: list[Any] = []
        async with trio.open_nursery() as nursery:

            async def cancel() -> None:
                results.append(await rt.workflows.cancel(flow, "l", reason="late"))

            nursery.start_soon(cancel)
            await trio.testing.wait_all_tasks_blocked()
            assert not results  # it waits for the segment being loaded
            gate.set()
        (cancelled,) = results
        # it ran nothing: cancelled where it was halted
        assert (cancelled.status, cancelled.phase, cancelled.revision) == (
            "cancelled",
            "w",
            2,
        )
        with pytest.raises(phronomy.WorkflowCancelledError, match="late"):
            await resumed.result()


async def test_a_cancelled_instance_refuses_every_event_and_nothing_is_written(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # Before: after cancel saved "cancelled" at revision 2, send_event and resume (by
    # id, or with halted=) claimed the row a second time, ran the transition and saved
    # "finished" at revision 3 over the cancellation (a cancelled order shipped).
    store = make_store()
    flow = approval_flow()
    async with runtime_on(store) as rt:
        halted = await rt.workflows.invoke(flow, workflow_instance_id="o-1")
        await rt.workflows.cancel(flow, "o-1", reason="customer left")
        before = loaded(store, "o-1")
        assert (before.status, before.revision) == ("cancelled", 2)
        calls: list[Callable[[], Awaitable[Any]]] = [
            lambda: rt.workflows.send_event(
                flow, "approve", workflow_instance_id="o-1"
            ),
            lambda: rt.workflows.resume(flow, workflow_instance_id="o-1"),
            lambda: rt.workflows.send_event(flow, "approve", halted=halted),
            lambda: rt.workflows.resume(flow, halted),
        ]
        for call in calls:
            with pytest.raises(phronomy.InstanceStateError) as caught:
                await call()
            message = str(caught.value)
            assert "'o-1' is cancelled (revision 2)" in message
            assert "if_exists='restart'" in message  # how to start a new one
            assert not isinstance(caught.value, phronomy.InstanceExistsError)
            assert store.load("o-1") == before
        with pytest.raises(phronomy.InstanceStateError, match="'o-1' is cancelled"):
            await rt.workflows.post(flow, "o-1", "approve")  # stored first: refused
        assert store.load("o-1") == before
        assert rt.workflows.segment("o-1") is None
        assert not [
            e for e in await rt.workflows.history("o-1") if isinstance(e, InboxEntry)
        ]  # no event of any call was stored
    assert [e.revision for e in store.history("o-1")] == [2, 1]


async def test_a_finished_instance_refuses_events_by_id_and_nothing_is_written(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    store = make_store()
    flow = approval_flow()
    async with runtime_on(store) as rt:
        await rt.workflows.invoke(flow, workflow_instance_id="f-1")
        await rt.workflows.send_event(flow, "approve", workflow_instance_id="f-1")
        before = loaded(store, "f-1")
        assert (before.status, before.revision) == ("finished", 2)
        with pytest.raises(phronomy.InstanceStateError, match="is finished"):
            await rt.workflows.send_event(flow, "approve", workflow_instance_id="f-1")
        assert store.load("f-1") == before


async def test_cancelling_a_stored_instance_reports_its_state(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # Before: the result of cancelling a halted instance had state=None although
    # WorkflowResult.state is not optional.
    store = make_store()
    flow = approval_flow()
    async with runtime_on(store) as rt:
        halted = await rt.workflows.invoke(
            flow, {"value": "v"}, workflow_instance_id="s-1"
        )
        cancelled = await rt.workflows.cancel(flow, "s-1")
        assert cancelled.state == halted.state
        assert (cancelled.status, cancelled.phase) == ("cancelled", "awaiting")
        again = await rt.workflows.cancel(flow, "s-1")  # idempotent, same answer
        assert again.state == halted.state
        # a placeholder that failed before its first save: the state's defaults
        store.run(
            MarkOp(
                workflow_instance_id="s-2",
                status="failed",
                create=True,
                workflow=flow.name,
            )
        )
        placeholder = await rt.workflows.cancel(flow, "s-2")
        assert placeholder.state == Value()
        assert (placeholder.revision, placeholder.status) == (0, "cancelled")


class Required(phronomy.State):
    order: str  # no default


async def test_cancelling_an_unsaved_instance_without_defaults_writes_nothing(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    store = make_store()
    wf = phronomy.Workflow(Required, name="required").wait_state("w")
    wf.transition("w", FINISH, on="go")
    flow = wf.build()
    store.run(
        MarkOp(
            workflow_instance_id="r-1", status="failed", create=True, workflow=flow.name
        )
    )
    before = store.load("r-1")
    async with runtime_on(store) as rt:
        with pytest.raises(phronomy.InstanceStateError, match="never saved a state"):
            await rt.workflows.cancel(flow, "r-1")
    assert store.load("r-1") == before
