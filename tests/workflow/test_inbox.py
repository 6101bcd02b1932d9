"""The durable inbox as users meet it: ``post``, receipts, repeats, refusals, starts
that post, order under concurrent senders, bad input, poison events."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import trio

import phronomy
from phronomy.storage import InboxEntry
from phronomy.testing import FaultyStore
from phronomy.workflow._messages import Polled, PostReady
from phronomy.workflow._poller import poll_once
from records import durable_view, loaded

from .helpers import (
    Value,
    admission_state,
    guarded_flow,
    halting_flow,
    live_flow,
    runtime_on,
    start_live,
    until,
)

if TYPE_CHECKING:
    from collections.abc import Callable


async def _events(runtime: phronomy.Runtime, iid: str) -> list[InboxEntry]:
    """The instance's events, oldest first."""
    history = await runtime.workflows.history(iid)
    return sorted(
        (e for e in history if isinstance(e, InboxEntry)), key=lambda e: e.seq
    )


def _status(store: phronomy.storage.BaseStore[Any], iid: str) -> str | None:
    row = store.load(iid)
    return None if row is None else row.status


async def test_a_post_is_stored_then_applied_once_and_a_repeat_gets_the_first_receipt(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    store = make_store()
    flow = halting_flow()
    async with runtime_on(store) as rt:
        await rt.workflows.invoke(flow, workflow_instance_id="p-1")
        first = await rt.workflows.post(flow, "p-1", "approve", {"n": 1}, event_id="k")
        assert (first.event_id, first.seq, first.duplicate) == ("k", 1, False)
        assert first.then == "applying"  # halted and nobody runs it: resumed here
        await until(lambda: _status(store, "p-1") == "finished")
        again = await rt.workflows.post(flow, "p-1", "approve", {"n": 1}, event_id="k")
        assert (again.seq, again.duplicate, again.status) == (1, True, "transitioned")
        assert (again.revision, again.then) == (2, "applied")
        receipt = await rt.workflows.receipt("p-1", "k")
        assert receipt is not None
        assert (receipt.status, receipt.revision) == ("transitioned", 2)
        assert await rt.workflows.receipt("p-1", "unknown") is None
        events = await _events(rt, "p-1")
        assert [(e.event_id, e.status, e.revision) for e in events] == [
            ("k", "transitioned", 2)
        ]
        row = loaded(store, "p-1")
        assert row.revision == 2  # one application


async def test_refusals_store_nothing_and_name_what_was_wrong(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    store = make_store()
    flow = halting_flow()
    async with runtime_on(store) as rt:
        await rt.workflows.invoke(flow, workflow_instance_id="r-1")
        await rt.workflows.post(flow, "r-1", "approve", event_id="same")
        # the same id for another event (another payload)
        with pytest.raises(phronomy.InvalidInputError, match="was used for another"):
            await rt.workflows.post(flow, "r-1", "approve", "x", event_id="same")
        await until(lambda: _status(store, "r-1") == "finished")
        before = durable_view(loaded(store, "r-1"))
        with pytest.raises(phronomy.InstanceStateError, match="finished"):
            await rt.workflows.post(flow, "r-1", "approve")
        with pytest.raises(phronomy.NotFoundError, match="'nobody'"):
            await rt.workflows.post(flow, "nobody", "approve")
        with pytest.raises(phronomy.InvalidInputError, match="Unknown event 'nope'"):
            await rt.workflows.post(flow, "r-1", "nope")
        with pytest.raises(phronomy.SerializationError, match="'r-1'"):
            await rt.workflows.post(flow, "r-1", "approve", {"blob": b"\x00"})
        with pytest.raises(phronomy.SerializationError, match="limit is"):
            await rt.workflows.post(flow, "r-1", "approve", "x" * (1 << 20))
        for hostile in ["", "x" * 1000, "a\x00b", 7]:
            with pytest.raises(phronomy.InvalidInputError, match="event_id"):
                await rt.workflows.post(flow, "r-1", "approve", event_id=hostile)  # type: ignore[arg-type]
        with pytest.raises(phronomy.InvalidInputError):
            await rt.workflows.post(flow, "r-1", "approve", input={"count": "many"})
        assert durable_view(loaded(store, "r-1")) == before
        assert [e.event_id for e in await _events(rt, "r-1")] == ["same"]
        assert not store.load("nobody")


async def test_of_concurrent_posts_that_start_one_id_exactly_one_starts_it(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    flow = live_flow()  # stays live: every post finds it open
    receipts: list[Any] = []
    async with runtime_on(make_store()) as a, runtime_on(make_store()) as b:

        async def post(rt: phronomy.Runtime, n: int) -> None:
            receipt = await rt.workflows.post(
                flow, "s-1", "mark", event_id=f"e{n}", start={}
            )
            receipts.append(receipt)

        async with trio.open_nursery() as nursery:
            for n in range(8):
                nursery.start_soon(post, (a, b)[n % 2], n)
        assert sum(r.started for r in receipts) == 1
        assert sorted(r.seq for r in receipts) == list(range(1, 9))  # no gaps
        with trio.fail_after(10):
            done = await b.workflows.send_event(
                flow, "finish", workflow_instance_id="s-1"
            )
        assert (done.status, done.state.count) == ("finished", 8)  # each one once
        events = await _events(a, "s-1")
        assert [e.status for e in events] == ["transitioned"] * 9


async def test_events_from_concurrent_senders_are_applied_in_the_order_stored(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    wf = phronomy.Workflow(Value, name="log").state("open")
    wf.transition(
        "open",
        "open",
        on="add",
        action=lambda s, e: s.merge(steps=[e.payload]),
    )
    wf.transition("open", phronomy.FINISH, on="close")
    flow = wf.build()
    async with runtime_on(make_store()) as a, runtime_on(make_store()) as b:
        handle = a.workflows.start(flow, workflow_instance_id="o-1")
        await until(lambda: (a.workflows.segment("o-1") or _NONE).status == "executing")
        receipts: list[Any] = []

        async def send(rt: phronomy.Runtime, sender: int) -> None:
            for n in range(10):
                receipt = await rt.workflows.post(flow, "o-1", "add", f"{sender}.{n}")
                receipts.append(receipt)

        async with trio.open_nursery() as nursery:
            for sender in range(4):
                nursery.start_soon(send, (a, b)[sender % 2], sender)
        await a.workflows.post(flow, "o-1", "close")
        with trio.fail_after(10):
            result = await handle.result()
    stored = sorted(receipts, key=lambda r: r.seq)
    assert [r.seq for r in stored] == list(range(1, 41))
    # the state saw every event once, in the order the inbox numbered them
    assert len(result.state.steps) == 40
    assert len(set(result.state.steps)) == 40
    for sender in range(4):
        mine = [s for s in result.state.steps if s.startswith(f"{sender}.")]
        assert mine == [f"{sender}.{n}" for n in range(10)]  # each sender's order


async def test_a_poison_event_is_recorded_failed_and_not_applied_again(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    ran: list[str] = []

    def explode(state: Value, event: Any) -> Value:
        ran.append(event.payload)
        if event.payload == "poison":
            raise RuntimeError("bad event")
        return state.merge(value=event.payload)

    wf = phronomy.Workflow(Value, name="poison").wait_state("w").initial("w")
    wf.transition("w", "w", on="go", action=explode)
    wf.transition("w", phronomy.FINISH, on="stop")
    flow = wf.build()
    store = make_store()
    async with runtime_on(store) as rt:
        await rt.workflows.invoke(flow, workflow_instance_id="x-1")
        with pytest.raises(RuntimeError, match="bad event"):
            await rt.workflows.send_event(
                flow, "go", payload="poison", workflow_instance_id="x-1"
            )
        assert _status(store, "x-1") == "failed"
        done = await rt.workflows.send_event(
            flow, "go", payload="fine", workflow_instance_id="x-1"
        )
        assert (done.revision, done.state.value) == (2, "fine")
        await trio.sleep(0.3)  # polls pass: nothing applies the poison again
        assert ran == ["poison", "fine"]
        events = await _events(rt, "x-1")
        assert [(e.status, e.revision) for e in events] == [
            ("failed", 1),
            ("transitioned", 2),
        ]
        assert "RuntimeError: bad event" in (events[0].detail or "")


async def test_signal_and_deliver_go_through_the_inbox_to_a_live_segment(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    flow = live_flow()
    async with runtime_on(make_store()) as rt:
        handle = rt.workflows.start(flow, workflow_instance_id="l-1")
        assert rt.workflows.signal(flow, "l-1", "mark", event_id="m-1")
        outcome = await rt.workflows.deliver(flow, "l-1", "ignored")
        assert outcome.status == "rejected"
        assert rt.workflows.signal(flow, "l-1", "mark", event_id="m-1")  # a repeat
        assert (await rt.workflows.deliver(flow, "l-1", "finish")).status == (
            "transitioned"
        )
        result = await handle.result()
        assert result.state.count == 1  # the repeat stored nothing
        events = await _events(rt, "l-1")
        assert [(e.event, e.status) for e in events] == [
            ("mark", "transitioned"),
            ("ignored", "rejected"),
            ("finish", "transitioned"),
        ]


class _None:
    status = None


_NONE = _None()


async def test_an_event_whose_save_the_store_refused_stays_pending_not_poisoned(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # Before: a save the disk refused (nothing written) marked the event that led to
    # it "failed", as if the event were poison: its retry by event id was refused.
    store = FaultyStore(make_store())
    flow = halting_flow()
    async with runtime_on(store) as rt:
        await rt.workflows.invoke(flow, workflow_instance_id="d-1")
        store.fail("save.before", OSError("disk full"))
        with pytest.raises(OSError, match="disk full"):
            await rt.workflows.send_event(
                flow, "approve", workflow_instance_id="d-1", event_id="a-1"
            )
        receipt = await rt.workflows.receipt("d-1", "a-1")
        assert receipt is not None
        assert receipt.status == "pending"  # stored, not applied, not poison
        done = await rt.workflows.send_event(
            flow, "approve", workflow_instance_id="d-1", event_id="a-1"
        )
        assert (done.status, done.revision, done.state.steps) == (
            "finished",
            2,
            ["approved"],
        )
        events = await _events(rt, "d-1")
        assert [(e.event_id, e.status, e.revision) for e in events] == [
            ("a-1", "transitioned", 2)
        ]


async def test_a_post_whose_entry_a_poll_gave_the_segment_first_hears_its_outcome(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # Before: the poll (woken by the post's own notification on PostgreSQL) could
    # offer the stored entry to the live segment before the post's completion reached
    # the dispatcher; the waiter, added with that completion, missed the outcome and
    # deliver waited until the segment ended (forever for a live one).
    flow = live_flow()
    async with runtime_on(make_store(), inbox_poll_interval=0) as rt:
        await start_live(rt, flow, "race-1")
        coordinator: Any = rt.workflows._coordinator
        session = coordinator.sessions["race-1"]
        forward = coordinator.post_message
        held: list[tuple[Any, dict[str, Any]]] = []

        def holding(message: Any, **kw: Any) -> bool:
            if isinstance(message, PostReady) and not held:
                held.append((message, kw))  # the post's completion, held back
                return True
            return bool(forward(message, **kw))

        coordinator.post_message = holding
        outcomes: list[Any] = []

        async def deliver() -> None:
            outcomes.append(await rt.workflows.deliver(flow, "race-1", "mark"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(deliver)
            await until(lambda: held)  # stored
            await poll_once(coordinator)  # the poll finds it first
            await until(lambda: len(session.feed.judged) == 2)  # applied
            message, kw = held[0]
            forward(message, **kw)  # now the post's completion arrives
            with trio.fail_after(5):
                await until(lambda: outcomes)
        assert outcomes[0].status == "transitioned"
        assert session.machine.state.count == 2  # applied once
        assert rt.workflows.signal(flow, "race-1", "finish")


async def test_a_rejection_a_poll_reads_first_names_the_phase_the_instance_is_at(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # Before: a poll that read a rejected entry after the claim's give-back committed
    # but before its completion reached the dispatcher answered the caller itself,
    # with an EventRejectedError without the phase ('' for 'awaiting'; CI saw it under
    # load). Whoever answers now gives the instance's phase at that revision.
    store = FaultyStore(make_store())
    flow = guarded_flow()
    async with runtime_on(store) as rt:
        await rt.workflows.invoke(flow, workflow_instance_id="g-1")
        coordinator: Any = rt.workflows._coordinator
        gate = store.block("mark.before")
        caught: list[phronomy.EventRejectedError] = []

        async def send() -> None:
            with pytest.raises(phronomy.EventRejectedError) as rejected:
                await rt.workflows.send_event(
                    flow, "approve", workflow_instance_id="g-1", payload="no"
                )
            caught.append(rejected.value)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)
            await until(lambda: store.count("mark") == 1)  # the give-back, held
            [key] = coordinator.waiters.awaited()
            entry = InboxEntry(
                workflow_instance_id=key[0],
                seq=1,
                event_id=key[1],
                event="approve",
                payload=b'"no"',
                stored_at_ms=0,
                status="rejected",
                revision=1,
            )
            # what a poll reads once the give-back committed, arriving first
            coordinator.post_message(Polled(pending=(), checked=((key, entry),)))
            await trio.sleep(0.05)  # the poll's answer, if any, comes now
            gate.set()
        rejected = caught[0]
        assert (rejected.phase, rejected.revision) == ("awaiting", 1)
        assert admission_state(rt, "g-1") is None


async def test_a_poll_begun_before_a_segment_loaded_offers_it_nothing(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # Before: a poll whose read predated a restarted segment's claim offered it the
    # entries the previous segment had consumed; its save then failed ("inbox entries
    # [1, 2] are not pending"), seen on PostgreSQL in CI (scenario 84's test).
    flow = live_flow()
    # (the entry it applies at last is not stored: the runtime does not wait for it)
    async with runtime_on(
        make_store(), inbox_poll_interval=0, shutdown_timeout=0.2
    ) as rt:
        await start_live(rt, flow, "p-1")
        coordinator: Any = rt.workflows._coordinator
        session = coordinator.sessions["p-1"]
        mine = coordinator.gateway.leases.owner
        stale = InboxEntry(
            workflow_instance_id="p-1",
            seq=2,
            event_id="old",
            event="mark",
            payload=b"null",
            stored_at_ms=0,
        )
        begun = session.feed.polls_before  # the last poll begun before it loaded
        row = (stale, "running", "live", mine)
        coordinator.post_message(Polled(pending=(row,), poll=begun))
        await trio.sleep(0.05)
        assert session.machine.state.count == 1  # not offered: only its own mark
        coordinator.post_message(Polled(pending=(row,), poll=begun + 1))
        await until(lambda: session.machine.state.count == 2)  # a later poll's is


async def test_a_failed_event_s_caller_gets_its_error_whichever_path_tells_it(
    tmp_path: Any,
) -> None:
    # Before: when the inbox poll read the failed entry before the failing segment's
    # own status write had returned, send_event raised PhronomyError("event 'approve'
    # ... failed: RuntimeError: ...") instead of the action's RuntimeError (once in CI).
    from failing_orders import FAILING, FLOW

    store = FaultyStore(phronomy.SQLiteStore(tmp_path / "fails.db"))
    FAILING["on"] = True
    async with phronomy.open_runtime(
        store=store, workflows=[FLOW], inbox_poll_interval=0.02, sweep_interval=0
    ) as rt:
        await rt.workflows.invoke(FLOW, workflow_instance_id="o-1")
        polls = store.count("poll")
        store.delay("mark.after", 0.5)  # committed: the poll reads it meanwhile
        with pytest.raises(RuntimeError, match="the approval service is down"):
            await rt.workflows.send_event(
                FLOW, "approve", workflow_instance_id="o-1", payload={"by": "ops"}
            )
        assert store.count("poll") > polls  # a poll read it while the write returned
    assert _status(store, "o-1") == "failed"
    store.close()


def test_the_error_is_kept_only_while_its_status_write_runs() -> None:
    from phronomy.engine import ResultHandle
    from phronomy.workflow._waiters import Applied, Waiters

    entry = InboxEntry(
        workflow_instance_id="o-1",
        seq=1,
        event_id="e-1",
        event="approve",
        payload=b"null",
        stored_at_ms=0,
        status="failed",
        detail="RuntimeError: down",
    )
    applied = Applied(entry=entry, status="failed", detail=entry.detail)
    waiters = Waiters()
    error = RuntimeError("down")
    waiters.failing("o-1", "e-1", error)
    told: list[BaseException | None] = []
    for kept in (True, False):
        if not kept:
            waiters.told("o-1", "e-1")  # the write returned: its callers were told
        caller: ResultHandle[Any] = ResultHandle("send_event")
        waiters.add("o-1", "e-1", caller, "result")
        waiters.settle(applied)
        told.append(caller.error)
    assert told[0] is error  # as the failing segment's own callers
    assert isinstance(told[1], phronomy.PhronomyError)  # as from any runtime
    assert "RuntimeError: down" in str(told[1])
