"""Leases across runtimes: one live segment per instance whatever the process or
machine, zombies fenced, instances of a stopped runtime put back by the sweep.

Runtimes in one process stand in for processes where that is enough (each runtime has
its own owner token, and shares nothing with the other but the store); the tests
marked slow use real processes and SIGKILL.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pytest
import trio

import phronomy
from phronomy.errors import LeaseLostError
from phronomy.storage import InboxOp
from phronomy.testing import FaultyStore
from records import loaded

from .helpers import (
    Value,
    admission_state,
    approval_flow,
    live_flow,
    runtime_on,
    start_live,
    until,
)

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path


class Order(phronomy.State):
    """The state of the workflows the child processes run."""

    step: int = 0


FAST: dict[str, Any] = {
    "lease_ttl": 0.6,
    "heartbeat_interval": 0.1,
    "lease_margin": 0.2,
    "sweep_interval": 0.1,
}
"""Lease settings that make expiry observable within a test."""


def counted_flow(ran: list[str]) -> phronomy.WorkflowDefinition[Value]:
    """A live flow whose entry action records each time it runs."""
    wf = phronomy.Workflow(Value, name="counted")

    def entry(state: Value) -> Value:
        ran.append("entry")
        return state

    wf.state("waiting", entry=entry)
    wf.transition("waiting", "waiting", on="mark")
    wf.transition("waiting", phronomy.FINISH, on="finish")
    return wf.build()


async def test_a_second_runtime_is_refused_before_any_action_runs(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    ran: list[str] = []
    flow = counted_flow(ran)
    async with (
        phronomy.open_runtime(store=make_store(), shutdown_timeout=2) as first,
        phronomy.open_runtime(store=make_store(), shutdown_timeout=2) as second,
    ):
        handle = first.workflows.start(flow, workflow_instance_id="one")
        await until(lambda: admission_state(first, "one") == "executing")
        with pytest.raises(phronomy.InstanceExistsError, match="running"):
            await second.workflows.invoke(flow, workflow_instance_id="one")
        with pytest.raises(phronomy.BusyError, match="another runtime"):
            await second.workflows.invoke(
                flow, workflow_instance_id="one", if_exists="restart"
            )
        assert ran == ["entry"]  # the refused runtime ran nothing
        first.workflows.signal(flow, "one", "finish")
        done = await handle.result()
        assert (done.status, done.revision) == ("finished", 1)


async def test_a_stale_owner_stops_at_its_margin_and_is_fenced(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
    request: pytest.FixtureRequest,
) -> None:
    """T2: a runtime that cannot renew (its store fails every renewal) stops its
    segment before the lease can expire; another runtime then takes the instance over,
    and the stale runtime's writes are refused."""
    if request.node.callspec.params["make_store"] == "memory":
        pytest.skip("two runtimes share one MemoryStore: its faults would reach both")
    flow = live_flow()
    stale_store = FaultyStore(make_store())
    stale_store.fail("renew.before", OSError("renewals lost"), times=None)
    async with (
        phronomy.open_runtime(store=stale_store, shutdown_timeout=2, **FAST) as stale,
        phronomy.open_runtime(store=make_store(), shutdown_timeout=2, **FAST) as other,
    ):
        started = trio.current_time()
        handle = await start_live(stale, flow, "z")
        with pytest.raises(LeaseLostError, match="could not renew its lease in time"):
            with trio.fail_after(5):
                await handle.result()
        stopped_after = trio.current_time() - started
        # at its deadline (ttl - margin), before anyone could take over
        assert stopped_after < FAST["lease_ttl"] - FAST["lease_margin"] + 0.1
        row = stale_store.load("z")
        assert row is not None
        assert row.status == "running"  # it wrote nothing on its way out
        # after expiry the other runtime claims it (epoch + 1) and finishes it
        await trio.sleep(FAST["lease_ttl"])
        taken = other.workflows.start(
            flow, workflow_instance_id="z", if_exists="restart"
        )
        await until(lambda: other.workflows.signal(flow, "z", "finish"))
        done = await taken.result()
        assert done.status == "finished"
        row = stale_store.load("z")
        assert row is not None
        # claimed (1), taken over by the other runtime's sweep (2), claimed again (3)
        assert (row.status, row.lease_owner, row.lease_epoch) == ("finished", None, 3)
        print(f"stale owner stopped after {stopped_after:.2f} s (ttl 0.6 s)")  # noqa: T201


async def test_an_instance_live_in_another_runtime_is_cancelled_through_its_row(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    flow = live_flow()
    async with (
        phronomy.open_runtime(store=make_store(), shutdown_timeout=2, **FAST) as owner,
        phronomy.open_runtime(store=make_store(), shutdown_timeout=2, **FAST) as other,
    ):
        handle = await start_live(owner, flow, "x")
        with trio.fail_after(5):
            cancelled = await other.workflows.cancel(flow, "x", reason="duplicate")
        assert cancelled.status == "cancelled"
        with pytest.raises(phronomy.WorkflowCancelledError, match="duplicate"):
            await handle.result()
        store = make_store()
        row = store.load("x")
        assert row is not None
        assert (row.status, row.detail) == ("cancelled", "cancelled: duplicate")
        assert (row.lease_owner, row.cancel_requested) == (None, None)
        # cancelling again answers the same, without asking anybody
        again = await other.workflows.cancel(flow, "x")
        assert again.revision == cancelled.revision


async def test_the_sweep_puts_back_a_segment_whose_lease_expired(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    flow = live_flow()
    store = make_store()
    async with phronomy.open_runtime(store=store, shutdown_timeout=2) as first:
        await first.workflows.invoke(
            phronomy.Workflow(Value, name="live")
            .wait_state("waiting")
            .initial("waiting")
            .transition("waiting", phronomy.FINISH, on="finish")
            .build(),
            workflow_instance_id="s",
        )
    halted = store.load("s")
    assert halted is not None
    # a runtime that claims it and then vanishes (its lease is never renewed)
    epoch = store.begin("s", "live", expected_revision=1, lease_owner="gone", ttl_ms=1)
    assert epoch == 2
    async with phronomy.open_runtime(store=make_store(), **FAST) as sweeper:
        await until(lambda: store.load("s").status == "halted", limit=5)  # type: ignore[union-attr]
        back = store.load("s")
        assert back is not None
        assert (back.revision, back.lease_owner, back.takeovers) == (1, None, 1)
        assert back.snapshot == halted.snapshot
        assert "back at revision 1" in (back.detail or "")
        handle = await start_live(sweeper, flow, "fresh")  # the runtime works on
        sweeper.workflows.signal(flow, "fresh", "finish")
        await handle.result()


_RACER = r"""
import sys, time, trio, phronomy

class Order(phronomy.State):
    step: int = 0

def act(state, event):
    with open(sys.argv[3], "a") as ran:
        ran.write("ran\n")
    time.sleep(0.3)  # hold the segment while the others arrive
    return state.merge(step=state.step + 1)

wf = phronomy.Workflow(Order, name="race")
wf.wait_state("awaiting").initial("awaiting")
wf.transition("awaiting", phronomy.FINISH, on="go", action=act)
flow = wf.build()

def store():
    if sys.argv[1].startswith("postgresql://"):
        return phronomy.PostgresStore(sys.argv[1], schema=sys.argv[4])
    return phronomy.SQLiteStore(sys.argv[1])

async def main():
    async with phronomy.open_runtime(store=store()) as rt:
        if sys.argv[2] == "create":
            await rt.workflows.invoke(flow, workflow_instance_id="order")
            return
        try:
            await rt.workflows.send_event(flow, "go", workflow_instance_id="order")
            print("won")
        except phronomy.BusyError:
            print("busy")
        except phronomy.InstanceStateError:
            print("finished")  # it arrived after the winner had finished

trio.run(main)
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_processes_racing_for_one_instance_run_it_once(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """T1: processes send the same event to the same halted instance at once: exactly
    one runs the action, the others are refused before running anything."""
    if backend == "postgres":
        opener = request.getfixturevalue("open_postgres")
        target, schema = request.getfixturevalue("postgres_dsn"), opener().schema
    else:
        target, schema = str(tmp_path / "race.db"), ""
    rounds, racers, outcomes = 4, 6, []
    for round_id in range(rounds):
        ran = tmp_path / f"ran-{round_id}.txt"
        db = target if backend == "postgres" else f"{target}.{round_id}"
        args = [sys.executable, "-c", _RACER, db]
        sub = schema and f"{schema}_{round_id}"
        subprocess.run([*args, "create", str(ran), sub], check=True, timeout=60)
        procs = [
            subprocess.Popen(
                [*args, "go", str(ran), sub], stdout=subprocess.PIPE, text=True
            )
            for _ in range(racers)
        ]
        results = sorted(p.communicate(timeout=60)[0].strip() for p in procs)
        assert [p.returncode for p in procs] == [0] * racers, results
        assert results.count("won") == 1, results
        assert ran.read_text().count("ran") == 1  # the losers ran nothing
        outcomes += results
    if backend == "postgres":
        import psycopg

        with psycopg.connect(target, autocommit=True) as conn:
            for round_id in range(rounds):
                conn.execute(f"DROP SCHEMA IF EXISTS {schema}_{round_id} CASCADE")
    print(  # noqa: T201 - the figures of the run
        f"admission race ({backend}): {rounds} rounds x {racers} processes: "
        f"{outcomes.count('won')} winners, {outcomes.count('busy')} refused busy, "
        f"{outcomes.count('finished')} arrived after the end, 0 actions by losers"
    )


_VICTIM = r"""
import sys, trio, phronomy

class Order(phronomy.State):
    step: int = 0

wf = phronomy.Workflow(Order, name="victim")
wf.wait_state("awaiting").initial("awaiting")
wf.state("working")
wf.transition("awaiting", "working", on="go")
wf.transition("working", phronomy.FINISH, on="done")
flow = wf.build()

async def main():
    store = phronomy.SQLiteStore(sys.argv[1])
    async with phronomy.open_runtime(store=store, lease_ttl=1.0, heartbeat_interval=0.2,
                                     lease_margin=0.2) as rt:
        if sys.argv[2] == "create":
            await rt.workflows.invoke(flow, workflow_instance_id="v")
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: rt.workflows.send_event(flow, "go", workflow_instance_id="v"))
            while store.load("v").status != "running":
                await trio.sleep(0.01)
            print("live", flush=True)
            await trio.sleep_forever()

trio.run(main)
"""


@pytest.mark.slow
def test_after_sigkill_another_runtime_takes_the_instance_over(tmp_path: Path) -> None:
    """T3: the process running a segment is killed; within ttl + one sweep another
    runtime has put the instance back at its last saved revision, and runs it on."""
    db = str(tmp_path / "victim.db")
    args = [sys.executable, "-c", _VICTIM, db]
    subprocess.run([*args, "create"], check=True, timeout=60)
    victim = subprocess.Popen([*args, "run"], stdout=subprocess.PIPE, text=True)
    assert victim.stdout is not None
    assert victim.stdout.readline().strip() == "live"
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(timeout=30)
    victim.stdout.close()

    flow = (
        phronomy.Workflow(Order, name="victim")
        .wait_state("awaiting")
        .initial("awaiting")
        .state("working")
        .transition("awaiting", "working", on="go")
        .transition("working", phronomy.FINISH, on="done")
        .build()
    )

    async def recover() -> tuple[float, Any]:
        store = phronomy.SQLiteStore(db)
        try:
            async with phronomy.open_runtime(
                store=store, sweep_interval=0.1, workflows=[flow]
            ) as rt:
                started = trio.current_time()

                def taken_over() -> bool:
                    segment = rt.workflows.segment("v")
                    return segment is not None and segment.status == "executing"

                # put back at revision 1, then resumed here with the victim's stored
                # "go" (the runtime serves the workflow: its poll finds the event)
                await until(taken_over, limit=10)
                took = trio.current_time() - started
                done = await rt.workflows.send_event(
                    flow, "done", workflow_instance_id="v"
                )
                return took, done
        finally:
            store.close()

    took, done = trio.run(recover)
    assert (done.status, done.revision) == ("finished", 2)
    history = phronomy.SQLiteStore(db)
    try:
        entries = history.history("v")
        assert [e.revision for e in entries] == [2, 1]  # no duplicate terminal save
        assert [e.status for e in entries] == ["finished", "halted"]
        events = history.run(InboxOp(workflow_instance_id="v", pending_only=False))
        assert [(e.event, e.status, e.revision) for e in events] == [
            ("done", "transitioned", 2),  # newest first
            ("go", "transitioned", 2),  # the victim's: stored before the kill
        ]
    finally:
        history.close()
    assert took < 1.0 + 1.0  # ttl + sweep + slack
    print(f"SIGKILLed segment put back and resumed after {took:.2f} s (ttl 1.0 s)")  # noqa: T201


async def test_an_event_for_an_unsaved_instance_live_elsewhere_reaches_it(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # Before: send_event to an instance live in another runtime raised BusyError (or
    # NotFoundError while it had never saved): the event is stored, and the runtime
    # that runs the instance applies it (its inbox poll finds it).
    flow = live_flow()
    async with runtime_on(make_store()) as a, runtime_on(make_store()) as b:
        first = await start_live(a, flow, "busy-1")
        results: list[phronomy.WorkflowResult[Value]] = []

        async def send() -> None:
            sent = await b.workflows.send_event(
                flow, "mark", workflow_instance_id="busy-1"
            )
            results.append(sent)

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(send)
                receipt = await b.workflows.post(flow, "busy-1", "mark")
                assert (receipt.status, receipt.then) == ("pending", "queued")
                while len(await _entries(b, "busy-1")) < 3:  # noqa: ASYNC110 - a store read
                    await trio.sleep(0.01)
                # the segment lives in a: a's poll gives it b's events, in order
                assert a.workflows.signal(flow, "busy-1", "finish")
            done = await first.result()
        assert (done.revision, done.state.count) == (1, 3)
        # the caller in b hears the result of the segment that applied its event
        assert [(r.revision, r.state.count, r.status) for r in results] == [
            (1, 3, "finished")
        ]
        applied = [(e.event, e.status, e.revision) for e in await _entries(b, "busy-1")]
        assert (
            applied
            == [("finish", "transitioned", 1)] + [("mark", "transitioned", 1)] * 3
        )


async def _entries(
    runtime: phronomy.Runtime, iid: str
) -> list[phronomy.storage.InboxEntry]:
    """The instance's events as the store has them, newest first."""
    history = await runtime.workflows.history(iid)
    return [e for e in history if isinstance(e, phronomy.storage.InboxEntry)]


def _finished_stays_finished(row: phronomy.storage.StoredRecord | None) -> list[str]:
    """The checker of the stale-mark scenario: what is wrong with the final row."""
    if row is None:
        return ["the row is gone"]
    problems = []
    if (row.status, row.revision) != ("finished", 2):
        problems.append(f"status {row.status} at revision {row.revision}")
    if row.lease_owner is not None:
        problems.append(f"a lease is held by {row.lease_owner}")
    return problems


@pytest.mark.parametrize("readback", ["slow", "fails"])
async def test_a_stale_owner_never_overwrites_a_finished_instance(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
    request: pytest.FixtureRequest,
    readback: str,
) -> None:
    """The stale-mark scenario: runtime Z's terminal save fails and its
    reconciliation read is slow; meanwhile Z's lease expires, runtime R takes the
    instance over and finishes it. Before: Z then marked the finished row
    recovery_required with an unfenced mark (every runtime refused a finished order)."""
    if request.node.callspec.params["make_store"] == "memory":
        pytest.skip("two runtimes share one MemoryStore: its faults would reach both")
    flow = approval_flow()
    stale_store = FaultyStore(make_store())
    async with (
        phronomy.open_runtime(store=stale_store, shutdown_timeout=2, **FAST) as z,
        phronomy.open_runtime(store=make_store(), shutdown_timeout=2, **FAST) as r,
    ):
        halted = await z.workflows.invoke(flow, workflow_instance_id="order")
        assert halted.revision == 1
        stale_store.fail("save.before", OSError("disk error"))  # nothing committed
        stale_store.fail("renew.before", OSError("partitioned"), times=None)
        # ... and its read-back is slow (and then fails, in the second variant)
        gate = stale_store.block(
            "readback.before",
            then=OSError("cannot read back") if readback == "fails" else None,
        )
        approving = z.workflows.start_event(
            flow, "approve", workflow_instance_id="order", event_id="approval-7"
        )
        await until(lambda: stale_store.count("save") >= 2)
        # Z's lease lapses (Z is cut off from the store but for its stuck write);
        # R's sweep puts the instance back at revision 1, then R applies the stored
        # approval (the webhook's retry to R names it: R waits for its outcome)
        with trio.fail_after(10):
            done = await r.workflows.send_event(
                flow, "approve", workflow_instance_id="order", event_id="approval-7"
            )
        assert (done.status, done.revision) == ("finished", 2)
        taken_at = trio.current_time()
        gate.set()  # Z's reconciliation reads the row now
        if readback == "slow":  # the save log proves Z's save never committed
            with pytest.raises(LeaseLostError):
                await approving.result()
        else:  # Z cannot tell: it keeps the caller pending, and marks nothing
            await until(lambda: admission_state(z, "order") == "recovery_required")
        await z.engine.shutdown()  # Z's writes (its fenced mark, if any) have run

        row = loaded(make_store(), "order")
        assert _finished_stays_finished(row) == [], row
        # the negative control: the checker sees what the old unfenced mark did
        broken = make_store()
        assert broken.mark("order", "recovery_required", detail="stale, unfenced")
        assert _finished_stays_finished(broken.load("order")) != []
        print(  # noqa: T201
            f"stale owner ({readback} read-back) after the takeover: row "
            f"{row.status} at revision {row.revision}; Z reconciled "
            f"{trio.current_time() - taken_at:.2f} s after R finished"
        )


def go_flow() -> phronomy.WorkflowDefinition[Value]:
    """Halts at 'awaiting'; 'go' makes it live (external events), 'done' finishes."""
    wf = phronomy.Workflow(Value, name="go")
    wf.wait_state("awaiting").initial("awaiting")
    wf.state("working")
    wf.transition("awaiting", "working", on="go")
    wf.transition("working", phronomy.FINISH, on="done")
    return wf.build()


async def test_a_quarantine_ends_once_another_runtime_settled_the_instance(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    """The outcome of a terminal save is unknown and its recovery_required mark fails
    too: the process refuses the instance, whose row keeps the lease of the unknown
    save. Once that lease expired (its runtime stopped), a sweep puts the instance
    back (a new epoch), and the other runtime of the process takes events for it.

    Before: it stayed refused in the process until an operator resolved it, although
    the store showed it settled."""
    inner = make_store()
    first = FaultyStore(inner)
    flow = go_flow()
    async with runtime_on(make_store(), **FAST) as b:
        async with runtime_on(first, **FAST) as a:
            await a.workflows.invoke(flow, workflow_instance_id="q")  # halted, rev 1
            pending = a.workflows.start_event(flow, "go", workflow_instance_id="q")
            await until(lambda: admission_state(a, "q") == "executing")
            claimed = inner.load("q")
            assert claimed is not None
            first.fail("save.before", OSError("reset"))
            first.fail("readback.before", OSError("unreadable"))
            first.fail("mark.before", OSError("mark lost"), times=None)
            assert a.workflows.signal(flow, "q", "done")
            await until(lambda: admission_state(a, "q") == "recovery_required")
            await until(lambda: first.count("mark") >= 1)  # tried, and failed
            first.clear()  # (for MemoryStore both runtimes share one store object)
            with pytest.raises(phronomy.RecoveryRequiredError, match="requires recov"):
                await b.workflows.send_event(flow, "go", workflow_instance_id="q")
        with pytest.raises(phronomy.RecoveryRequiredError):
            await pending.result()  # settled by the shutdown
        # the lease of the unknown save expires: a sweep puts the instance back (at
        # revision 1), and b applies the events a stored ("go", "done") from there
        await until(lambda: inner.load("q").lease_epoch > claimed.lease_epoch)  # type: ignore[union-attr]
        await until(lambda: inner.load("q").status == "finished")  # type: ignore[union-attr]
        history = await b.workflows.history("q")
        assert [
            (type(item).__name__, item.revision, item.status) for item in history
        ] == [
            ("SaveLogEntry", 2, "finished"),
            ("InboxEntry", 2, "refused"),  # b's "go": stored, then the instance closed
            ("InboxEntry", 2, "transitioned"),  # done
            ("InboxEntry", 2, "transitioned"),  # go
            ("SaveLogEntry", 1, "halted"),
        ]
        assert await b.recovery.list() == []


async def test_one_sweep_pass_goes_on_while_batches_come_back_full(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before: a pass took one batch (100 instances) and stopped until the next interval.
    from phronomy.durability import _leases

    monkeypatch.setattr(_leases, "SWEEP_BATCH", 10)
    monkeypatch.setattr(_leases, "SWEEP_BATCHES", 5)  # a pass is bounded
    store = phronomy.MemoryStore()
    for n in range(73):
        assert store.begin(f"x{n}", "wf", lease_owner="gone", ttl_ms=0) == 1
    writes: list[int] = []

    async def run(op: Any) -> Any:
        result = await trio.to_thread.run_sync(store.run, op)
        writes.append(len(result))
        return result

    leases = _leases.Leases(run, _leases.LeaseSettings())
    await leases.sweep_once()
    assert writes == [10] * 5  # bounded: 50 of the 73 in this pass
    await leases.sweep_once()
    assert writes[5:] == [10, 10, 3]  # the rest in the next, which stops when short
    rows = store.list_instances(status="running", limit=100).records
    assert rows == ()


async def test_a_renewal_of_many_leases_is_written_in_bounded_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: one statement renewed every held lease; at 100k leases it held the
    # store's one writer for ~0.9 s, and a start waited behind it.
    from phronomy.durability import _leases

    monkeypatch.setattr(_leases, "RENEW_CHUNK", 10)
    store = phronomy.SQLiteStore(tmp_path / "leases.db")
    store.open()
    leases = _leases.Leases(store_run(store), _leases.LeaseSettings())
    count = 2 * _leases.RENEW_CHUNK + 3
    claimed = _hold_many(store, leases, count)
    renewals: list[int] = []
    run = leases._run

    async def counting(op: Any) -> Any:
        renewals.append(len(op.instance_ids))
        return await run(op)

    leases._run = counting
    await trio.sleep(0.01)
    await leases.renew()
    assert renewals == [_leases.RENEW_CHUNK, _leases.RENEW_CHUNK, 3]
    assert len(leases._held) == count
    first = claimed + leases.settings.ttl - leases.settings.margin
    assert all(h.deadline > first for h in leases._held.values())  # all renewed
    store.close()


async def test_a_renewal_pass_does_not_look_at_every_lease_for_each_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: each chunk found the earliest deadline by a look at every held lease,
    # and the pass's end looked at all of them again: at 100k leases in chunks of 500
    # that was 20M looks per pass on the trio thread (a pass took 14 s, and starts
    # and saves waited up to 75 ms behind it). The deadlines are a heap now.
    from phronomy.durability import _leases

    class Counted(dict[str, Any]):
        looked = 0

        def values(self) -> Any:
            Counted.looked += len(self)
            return super().values()

        def items(self) -> Any:
            Counted.looked += len(self)
            return super().items()

    monkeypatch.setattr(_leases, "RENEW_CHUNK", 10)
    store = phronomy.SQLiteStore(tmp_path / "leases.db")
    store.open()
    leases = _leases.Leases(store_run(store), _leases.LeaseSettings())
    leases._held = Counted()
    count = 10 * _leases.RENEW_CHUNK
    claimed = _hold_many(store, leases, count)
    leases.drop("x3")
    await trio.sleep(0.01)
    await leases.renew()
    assert Counted.looked <= count, Counted.looked  # before: 11 x count
    renewed = claimed + leases.settings.ttl - leases.settings.margin
    assert leases._earliest() > renewed  # every deadline moved: the earliest too
    earliest = min(h.deadline for h in leases._held.values())
    assert earliest <= leases._earliest() < earliest + 1 / _leases.DEADLINE_GRAIN
    leases._expire(leases._earliest())  # the earliest lapses: those leases are lost
    assert len(leases._held) < count - 1
    assert all(h.deadline > leases._earliest() - 1 for h in leases._held.values())
    assert all(not h.lapsed() for h in leases._held.values())
    store.close()


async def test_renewal_passes_keep_one_heap_key_per_group_of_deadlines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: each renewal pushed one heap entry per lease, and the entries a later
    # renewal made stale stayed until their deadline: at 100k leases the heap held
    # 600k entries, and the end of each pass popped 100k of them in one step of the
    # trio thread (225 ms that every start and save waited behind).
    from phronomy.durability import _leases

    monkeypatch.setattr(_leases, "RENEW_CHUNK", 100)
    store = phronomy.SQLiteStore(tmp_path / "leases.db")
    store.open()
    leases = _leases.Leases(store_run(store), _leases.LeaseSettings())
    count, passes = 1_000, 4
    _hold_many(store, leases, count)
    for _ in range(passes):
        await leases.renew()
    chunks = count // _leases.RENEW_CHUNK
    assert len(leases._keys) <= 1 + passes * chunks  # before: count * (1 + passes)
    assert sum(due.live for due in leases._due.values()) == count
    for n in range(0, count, 2):
        leases.drop(f"x{n}")
    assert sum(due.live for due in leases._due.values()) == count // 2
    store.close()


async def test_a_lease_not_renewed_is_lost_at_its_deadline_not_before(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from phronomy.durability import _leases

    lost: list[float] = []

    class Listener(_Deaf):
        def lost(self, error: object) -> None:
            lost.append(trio.current_time())

    async def failing(op: Any) -> Any:
        raise OSError("the store is away")

    leases = _leases.Leases(failing, _leases.LeaseSettings())
    claimed = trio.current_time() + 0.001  # (no multiple of the grain)
    held = leases.hold("x", 1, Listener(), claimed_at=claimed)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(leases.heartbeat)
        await trio.sleep_until(held.deadline - 0.001)
        assert lost == []
        assert not held.lapsed()
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert len(lost) == 1
    assert held.deadline <= lost[0] <= held.deadline + 1 / _leases.DEADLINE_GRAIN
    assert leases.held_count == 0
    assert leases._earliest() == math.inf


def _hold_many(store: phronomy.SQLiteStore, leases: Any, count: int) -> float:
    """Claim ``x0`` ... on *store* for *leases* and hold them; return the claims' time."""
    claimed = trio.current_time()
    for n in range(count):
        epoch = store.begin(f"x{n}", "wf", lease_owner=leases.owner, ttl_ms=60_000)
        assert epoch is not None
        leases.hold(f"x{n}", epoch, _Deaf(), claimed_at=claimed)
    return claimed


def store_run(store: phronomy.storage.BaseStore[Any]) -> Any:
    async def run(op: Any) -> Any:
        return await trio.to_thread.run_sync(store.run, op)

    return run


class _Deaf:
    """A lease listener that ignores what it hears."""

    def lost(self, error: object) -> None:
        pass

    def cancel(self, reason: str | None) -> None:
        pass
