"""Durable workflows: hydration, resume validation, the terminal barrier, reconciliation
and recovery (spec §4, scenarios 53-85, 129-133), on MemoryStore and SQLiteStore."""

from __future__ import annotations

import contextlib
import enum
import threading
import time
from typing import TYPE_CHECKING, Any

import msgspec
import pytest
import trio

import phronomy
from phronomy.engine import Event
from phronomy.storage import (
    SAVE_LOG_DEPTH,
    InboxEntry,
    Lease,
    LoadOp,
    SaveOp,
    SaveRequest,
    StoredRecord,
    decode_snapshot_builtins,
    encode_snapshot,
)
from phronomy.testing import FaultyStore
from phronomy.workflow._definition import FINISH
from phronomy.workflow._persistence import TERMINAL_RESULT
from records import durable_view

from .helpers import (
    Value,
    admission_state,
    approval_flow,
    counter_flow,
    guarded_flow,
    halting_flow,
    live_flow,
    runtime_on,
    segment_id,
    start_live,
    until,
)

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path


def fields(
    store: phronomy.storage.BaseStore[Any], iid: str
) -> tuple[StoredRecord, dict[str, Any]]:
    record = store.load(iid)
    assert record is not None
    assert record.snapshot is not None
    decoded = decode_snapshot_builtins(
        record.snapshot, workflow_instance_id=iid, revision=record.revision
    )
    return record, decoded.fields


def status_of(store: phronomy.storage.BaseStore[Any], iid: str) -> str | None:
    record = store.load(iid)
    return None if record is None else record.status


# --- when persistence happens, hydration ----------------------------------------------


async def test_durable_invocations_hydrate_and_save_revisions(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # scenario 64
    store = make_store()
    flow = counter_flow()
    async with runtime_on(store) as rt:
        first = await rt.workflows.invoke(flow, {"count": 0}, workflow_instance_id="t1")
        assert (first.revision, first.state.count) == (1, 1)
        record, stored = fields(store, "t1")
        assert (record.revision, record.phase, record.status, stored["count"]) == (
            1,
            FINISH,
            "finished",
            1,
        )
        # a finished instance is refused by default (nothing runs twice silently)
        with pytest.raises(phronomy.InstanceExistsError, match="finished"):
            await rt.workflows.invoke(flow, {}, workflow_instance_id="t1")
        assert fields(store, "t1")[0].revision == 1
        # restart hydrates from the stored fields (the Ruby runtime's start)
        again = {"workflow_instance_id": "t1", "if_exists": "restart"}
        second = await rt.workflows.invoke(flow, {}, **again)  # type: ignore[arg-type]
        assert (second.revision, second.state.count) == (2, 2)
        await rt.workflows.invoke(flow, {"count": 10}, **again)  # type: ignore[arg-type]
        overridden = await rt.workflows.invoke(flow, {"count": 0}, **again)  # type: ignore[arg-type]
        assert (overridden.state.count, overridden.revision) == (1, 4)


async def test_no_explicit_id_means_no_persistence(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # scenario 65
    store = make_store()
    async with runtime_on(store) as rt:
        result = await rt.workflows.invoke(counter_flow())
    assert result.revision is None
    assert store.list_instances().records == ()


async def test_durable_halt_then_resume(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # scenarios 16 and 68 on a store
    store = make_store()
    flow = approval_flow()
    async with runtime_on(store) as rt:
        halted = await rt.workflows.invoke(
            flow, {"value": "start"}, workflow_instance_id="order-1"
        )
        assert (halted.revision, store.load("order-1").status) == (1, "halted")  # type: ignore[union-attr]
        done = await rt.workflows.send_event(flow, "approve", halted=halted)
    assert (done.revision, done.phase, done.state.value) == (
        2,
        FINISH,
        "start:prepared:confirmed",
    )
    record, stored = fields(store, "order-1")
    assert (record.phase, record.status, stored["value"]) == (
        FINISH,
        "finished",
        "start:prepared:confirmed",
    )


async def test_resume_by_id_across_runtimes(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    flow = approval_flow()
    async with runtime_on(make_store()) as rt:
        halted = await rt.workflows.invoke(
            flow, {"value": "x"}, workflow_instance_id="order-2"
        )
    assert halted.revision == 1
    async with runtime_on(make_store()) as rt:  # another runtime (a restarted process)
        done = await rt.workflows.send_event(
            flow, event="approve", workflow_instance_id="order-2"
        )
        assert (done.revision, done.state.value) == (2, "x:prepared:confirmed")
        with pytest.raises(phronomy.InstanceStateError, match="is finished"):
            await rt.workflows.send_event(
                flow, event="approve", workflow_instance_id="order-2"
            )
        with pytest.raises(phronomy.NotFoundError, match="no durable state"):
            await rt.workflows.send_event(
                flow, event="approve", workflow_instance_id="never-started"
            )
        with pytest.raises(phronomy.InvalidInputError):
            await rt.workflows.send_event(
                flow, event="bogus", workflow_instance_id="order-2"
            )


async def test_a_rejected_resume_does_not_touch_the_status(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    store = make_store()
    wf = (
        phronomy.Workflow(Value, name="two-events")
        .wait_state("w")
        .initial("w")
        .state("s")
    )
    wf.transition("w", "s", on="go").transition("s", FINISH, on="later")
    flow = wf.build()
    async with runtime_on(store) as rt:
        await rt.workflows.invoke(flow, workflow_instance_id="r")
        with pytest.raises(
            phronomy.TransitionError, match="Transition from 'w' via event 'later'"
        ):
            await rt.workflows.send_event(flow, event="later", workflow_instance_id="r")
        assert store.load("r").status == "halted"  # type: ignore[union-attr]


async def test_an_event_every_guard_rejects_answers_at_once_and_changes_nothing(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # Before: the caller hung while the store said "halted" (the segment stayed live).
    store = make_store()
    flow = guarded_flow()
    with trio.fail_after(10):
        async with runtime_on(store) as rt:
            halted = await rt.workflows.invoke(flow, workflow_instance_id="order-1")
            before = store.load("order-1")
            assert before is not None
            attempts: list[dict[str, Any]] = [
                {"workflow_instance_id": "order-1"},
                {"halted": halted},
            ]
            for target in attempts:
                with pytest.raises(phronomy.EventRejectedError) as caught:
                    await rt.workflows.send_event(
                        flow, "approve", payload="no", **target
                    )
                rejected = caught.value
                assert (rejected.phase, rejected.revision, rejected.event) == (
                    "awaiting",
                    1,
                    "approve",
                )
                assert rejected.instance_id == "order-1"
                assert "order-1" in str(rejected)
                assert admission_state(rt, "order-1") is None  # released
                # the row is back as it was (its claim, and the lease, are released)
                after = store.load("order-1")
                assert after is not None
                assert durable_view(after) == durable_view(before)
                assert (after.lease_owner, after.lease_expires_at_ms) == (None, None)
            done = await rt.workflows.send_event(
                flow, "approve", workflow_instance_id="order-1", payload="yes"
            )
            assert (done.phase, done.revision) == (FINISH, 2)
            assert done.state.steps == ["drafted", "shipped"]
        assert rt.shutdown_result is not None
        assert rt.shutdown_result.clean, rt.shutdown_result


async def test_resume_validation_detects_divergence(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # scenario 69
    store = make_store()
    flow = approval_flow()
    async with runtime_on(store) as rt:
        halted = await rt.workflows.invoke(
            flow, {"value": "a"}, workflow_instance_id="div"
        )
        blob = encode_snapshot(
            Value(value="changed elsewhere"),
            workflow_instance_id="div",
            revision=2,
            phase="awaiting",
            workflow="approval",
        )
        store.save(
            SaveRequest(
                workflow_instance_id="div",
                expected_revision=1,
                snapshot=blob,
                write_id="ext",
                status="halted",
                phase="awaiting",
                workflow="approval",
            )
        )
        with pytest.raises(
            phronomy.ConflictError, match="changed since the supplied halted result"
        ):
            await rt.workflows.send_event(flow, "approve", halted=halted)
        assert admission_state(rt, "div") is None
        done = await rt.workflows.send_event(
            flow, event="approve", workflow_instance_id="div"
        )  # by id: from the durable state
        assert done.state.value == "changed elsewhere:confirmed"


async def test_resume_of_an_ephemeral_halt_creates_the_record(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # scenarios 70, 133
    flow = approval_flow()
    async with phronomy.open_runtime() as rt:
        halted = await rt.workflows.invoke(flow, {"value": "e"})
    store = make_store()
    async with runtime_on(store) as rt:
        done = await rt.workflows.send_event(flow, "approve", halted=halted)
    assert done.revision == 1
    assert store.load(halted.workflow_instance_id).revision == 1  # type: ignore[union-attr]


class Color(enum.Enum):
    RED = "red"


class Rich(phronomy.State):
    color: Color = Color.RED
    pair: tuple[int, int] = (1, 2)
    tags: dict[str, list[int]] = {}  # noqa: RUF012


async def test_normalised_comparison_has_no_false_conflicts(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # scenario 71
    wf = phronomy.Workflow(Rich, name="rich").wait_state("w").initial("w")
    wf.transition("w", FINISH, on="go")
    flow = wf.build()
    async with runtime_on(make_store()) as rt:
        halted = await rt.workflows.invoke(
            flow, {"tags": {"b": [2], "a": [1]}}, workflow_instance_id="rich"
        )
        done = await rt.workflows.send_event(flow, "go", halted=halted)
    assert done.state.color is Color.RED  # the live state keeps the enum
    assert done.state.pair == (1, 2)


async def test_stream_over_a_durable_instance(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # scenario 73
    store = make_store()
    flow = counter_flow()
    async with runtime_on(store) as rt:
        await rt.workflows.invoke(flow, {"count": 9}, workflow_instance_id="s")
        names = []
        async with rt.workflows.stream(
            flow, workflow_instance_id="s", if_exists="restart"
        ) as steps:
            async for step in steps:
                names.append(step.phase)
        result = await steps.result()
    assert (result.state.count, result.revision) == (11, 2)
    assert names == ["increment"]  # stable states are published; FINISH itself is not


# --- the terminal barrier ----------------------------------------------------------------


async def test_no_halted_step_before_the_save_succeeds(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # scenarios 62, 74
    store = FaultyStore(make_store())
    gate = store.block("save.before")
    flow = halting_flow()
    async with runtime_on(store) as rt:
        steps: list[str] = []
        handle = rt.workflows.start(
            flow,
            workflow_instance_id="barrier",
            on_step=lambda s: steps.append(s.phase),
        )
        await until(lambda: admission_state(rt, "barrier") == "persisting_terminal")
        await trio.sleep(0.05)
        assert steps == []
        assert not handle.done
        # scenario 54: the segment is saving; the event is stored and applied after
        # the halt is saved (by the next segment), not by this one
        assert rt.workflows.signal(flow, "barrier", "approve", event_id="late")
        gate.set()
        result = await handle.result()
        assert steps == ["awaiting"]
        assert (result.halted, result.revision) == (True, 1)
        await until(lambda: status_of(store, "barrier") == "finished")
        receipt = await rt.workflows.receipt("barrier", "late")
        assert receipt is not None
        assert (receipt.status, receipt.revision) == ("transitioned", 2)


async def test_stray_events_while_persisting_are_discarded(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # scenario 54
    store = FaultyStore(make_store())
    gate = store.block("save.before")
    async with runtime_on(store) as rt:
        handle = rt.workflows.start(halting_flow(), workflow_instance_id="stray")
        await until(lambda: admission_state(rt, "stray") == "persisting_terminal")
        session_id = segment_id(rt, "stray")
        assert session_id is not None
        assert rt.engine.post_nowait(Event(type="approve", target_id=session_id))
        await trio.sleep(0.02)
        assert admission_state(rt, "stray") == "persisting_terminal"
        gate.set()
        assert (await handle.result()).state.steps == []


async def test_competitors_are_refused_while_loading_and_saving(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # scenarios 53, 54, 55, 56. One workflow throughout, which declares the signalled
    # event: each False below comes from the admission's state, not from a name check.
    store = FaultyStore(make_store())
    flow = live_flow()
    async with runtime_on(store) as rt:
        load_gate = store.block("claim.before")
        first = rt.workflows.start(flow, workflow_instance_id="c")
        await until(lambda: admission_state(rt, "c") == "admitting")
        # 53: still loading: the event is stored, the segment applies it once it runs
        assert rt.workflows.signal(flow, "c", "mark", event_id="early")
        with pytest.raises(phronomy.BusyError, match="live execution segment"):
            await rt.workflows.invoke(flow, workflow_instance_id="c")  # 55
        load_gate.set()
        save_gate = store.block("save.before")
        assert rt.workflows.signal(flow, "c", "finish")
        await until(lambda: admission_state(rt, "c") == "persisting_terminal")
        # 54: saving, the segment takes no more events (this one is refused: closed)
        assert rt.workflows.signal(flow, "c", "mark", event_id="late")
        with pytest.raises(phronomy.BusyError, match="live execution segment"):
            await rt.workflows.invoke(flow, workflow_instance_id="c")  # 56
        save_gate.set()
        done = await first.result()
        assert (done.phase, done.state.count) == (FINISH, 1)
        assert admission_state(rt, "c") is None
        early = await rt.workflows.receipt("c", "early")
        assert early is not None
        assert (early.status, early.revision) == ("transitioned", 1)
        # the late one was refused when it was posted, or by the save that closed
        # the instance: never applied
        late = await rt.workflows.receipt("c", "late")
        assert late is None or late.status == "refused"
    assert store.count("claim") == 1  # the competitors never touched the store


async def test_load_errors_fail_the_caller_and_release(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # scenario 61
    store = FaultyStore(make_store())
    flow = approval_flow()
    async with runtime_on(store) as rt:
        halted = await rt.workflows.invoke(flow, workflow_instance_id="le")
        store.fail("claim.before", OSError("disk unplugged"))
        with pytest.raises(OSError, match="disk unplugged"):
            await rt.workflows.invoke(flow, workflow_instance_id="le2")
        assert admission_state(rt, "le2") is None
        store.fail("claim.before", OSError("still unplugged"))
        with pytest.raises(OSError, match="still unplugged"):
            await rt.workflows.send_event(flow, "approve", halted=halted)
        assert admission_state(rt, "le") is None


async def test_conflicting_save_fails_the_caller(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # scenarios 75, 130
    store = make_store()
    flow = live_flow()
    async with runtime_on(store) as rt:
        handle = await start_live(rt, flow, "cf")
        # another writer creates revision 1 meanwhile (with the segment's own lease:
        # without it, the store refuses it)
        claimed = store.load("cf")
        assert claimed is not None
        assert claimed.lease_owner is not None
        store.save(
            SaveRequest(
                workflow_instance_id="cf",
                expected_revision=None,
                snapshot=encode_snapshot(
                    Value(), workflow_instance_id="cf", revision=1, phase=FINISH
                ),
                write_id="other",
                status="running",
                phase=FINISH,
                lease=Lease(owner=claimed.lease_owner, epoch=claimed.lease_epoch),
            )
        )
        rt.workflows.signal(flow, "cf", "finish")
        with pytest.raises(phronomy.ConflictError):
            await handle.result()
        assert admission_state(rt, "cf") is None
    assert store.load("cf").write_id == "other"  # type: ignore[union-attr]


async def test_saved_snapshot_is_taken_when_the_segment_ends(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # scenario 77
    store = FaultyStore(make_store())
    gate = store.block("save.before")
    kept: list[Value] = []
    wf = (
        phronomy.Workflow(Value, name="snap")
        .state("s", entry=lambda s: kept.append(s))
        .transition("s", FINISH)
    )
    async with runtime_on(store) as rt:
        handle = rt.workflows.start(
            wf.build(), {"steps": ["before"]}, workflow_instance_id="snap"
        )
        await until(lambda: admission_state(rt, "snap") == "persisting_terminal")
        kept[0].steps.append("mutated after submission")
        gate.set()
        await handle.result()
    _, stored = fields(store.inner, "snap")
    assert stored["steps"] == ["before"]


async def test_commit_then_error_is_reconciled_to_success(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # scenario 78
    store = FaultyStore(make_store())
    store.fail("save.after", OSError("response lost"))
    async with runtime_on(store) as rt:
        result = await rt.workflows.invoke(
            counter_flow(), {"count": 0}, workflow_instance_id="p"
        )
        assert (result.state.count, result.revision) == (1, 1)
        assert admission_state(rt, "p") is None
    assert store.inner.load("p").revision == 1  # type: ignore[union-attr]
    assert store.count("save") == 1


async def test_proven_non_commit_returns_the_original_error(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # scenario 79
    store = FaultyStore(make_store())
    error = OSError("write failed")
    store.fail("save.before", error)
    async with runtime_on(store) as rt:
        with pytest.raises(OSError) as caught:
            await rt.workflows.invoke(counter_flow(), workflow_instance_id="n")
        assert caught.value is error
        assert admission_state(rt, "n") is None
    record = store.inner.load("n")
    assert record is not None
    assert (record.revision, record.status) == (
        0,
        "failed",
    )  # a placeholder, marked failed


@pytest.mark.parametrize("readback", ["history-pruned", "raises"])
async def test_unknown_outcome_requires_recovery(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
    readback: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # scenarios 57, 80, 81
    inner = make_store()
    store = FaultyStore(inner)
    flow = live_flow()
    async with runtime_on(store) as rt:
        handle = await start_live(rt, flow, "u")
        running = segment_id(rt, "u")
        assert running is not None
        if readback == "history-pruned":
            # another writer saved the row past the save log's depth meanwhile: the
            # revision this save would have produced is forgotten, nobody can tell
            claimed = inner.load("u")
            assert claimed is not None
            assert claimed.lease_owner is not None
            for revision in range(SAVE_LOG_DEPTH + 8):
                inner.save(
                    SaveRequest(
                        workflow_instance_id="u",
                        expected_revision=revision or None,
                        snapshot=b"{}",
                        write_id=f"third-{revision}",
                        status="running",
                        phase="x",
                        lease=Lease(
                            owner=claimed.lease_owner, epoch=claimed.lease_epoch
                        ),
                    )
                )
        else:
            store.fail("readback.before", OSError("cannot read back"))
        store.fail("save.before", OSError("connection reset"))
        rt.workflows.signal(flow, "u", "finish")
        await until(lambda: admission_state(rt, "u") == "recovery_required")
        segment = rt.workflows.segment("u")
        assert segment is not None
        assert segment.segment_id is None  # the session retired: nothing runs it
        assert segment.error is not None
        assert not handle.done
        with pytest.raises(phronomy.BusyError, match="live execution segment"):
            await rt.workflows.invoke(flow, workflow_instance_id="u")
        entries = await rt.recovery.list()
        assert [e.workflow_instance_id for e in entries] == ["u"]
        assert entries[0].in_process
        expected = (
            "conflicts with both expected pre-state"
            if readback == "history-pruned"
            else "cannot read back"
        )
        assert expected in (entries[0].error or "")
    # shutdown completes (recovery does not block idleness) and settles the pending caller
    result = rt.shutdown_result
    assert result is not None
    assert result.dispatcher_status == "terminated"
    with pytest.raises(
        phronomy.RecoveryRequiredError, match="'u' requires recovery"
    ) as caught:
        await handle.result()
    assert caught.value.instance_id == "u"
    assert "requires recovery" in caplog.text


async def test_a_save_whose_revision_another_write_produced_is_a_known_failure(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # Before: "neither pre- nor post-state" -> recovery_required, although the save log
    # proves the save never committed (a revision is produced by one write only).
    inner = make_store()
    store = FaultyStore(inner)
    flow = live_flow()
    async with runtime_on(store) as rt:
        handle = await start_live(rt, flow, "u")
        claimed = inner.load("u")
        assert claimed is not None
        assert claimed.lease_owner is not None
        inner.save(  # another writer (here with the same lease) saved revision 1
            SaveRequest(
                workflow_instance_id="u",
                expected_revision=None,
                snapshot=b"{}",
                write_id="third",
                status="running",
                phase="x",
                lease=Lease(owner=claimed.lease_owner, epoch=claimed.lease_epoch),
            )
        )
        store.fail("save.before", OSError("connection reset"))
        rt.workflows.signal(flow, "u", "finish")
        with pytest.raises(phronomy.ConflictError) as caught:
            await handle.result()
        assert "this save never committed" in "\n".join(caught.value.__notes__)
        assert admission_state(rt, "u") is None  # not recovery_required
        assert (await rt.recovery.list()) == []
    assert inner.load("u").write_id == "third"  # type: ignore[union-attr]


async def test_recovery_is_fail_closed_across_runtimes_and_resolvable(
    open_sqlite: Callable[..., phronomy.SQLiteStore],
    tmp_path: Path,
) -> None:
    path = tmp_path / "recovery.db"
    store = FaultyStore(open_sqlite(path))
    flow = approval_flow()
    async with runtime_on(store) as rt:
        halted = await rt.workflows.invoke(flow, workflow_instance_id="rr")
        store.fail("save.before", OSError("reset")).fail(
            "readback.before", OSError("unreadable")
        )
        pending = rt.workflows.start_event(
            flow,
            "approve",
            halted=halted,
        )
        await until(lambda: admission_state(rt, "rr") == "recovery_required")
        reader = open_sqlite(path)  # another connection to the file
        await until(lambda: status_of(reader, "rr") == "recovery_required")
        # another process sharing the file refuses the instance too
        async with runtime_on(open_sqlite(path)) as other:
            with pytest.raises(
                phronomy.RecoveryRequiredError, match="requires recovery"
            ):
                await other.workflows.invoke(flow, workflow_instance_id="rr")
            listed = await other.recovery.list()
            assert [(e.workflow_instance_id, e.in_process) for e in listed] == [
                ("rr", False)
            ]
            view = await other.recovery.inspect("rr")
            assert view.record is not None
            assert view.fields is not None
            assert (view.record.revision, view.phase, view.fields["value"]) == (
                1,
                "awaiting",
                ":prepared",
            )
        adopted = await rt.recovery.resolve("rr", action="adopt")
        assert adopted is not None
        assert (adopted.status, adopted.revision) == ("halted", 1)
        with pytest.raises(
            phronomy.RecoveryRequiredError, match=r"resolved by an operator \(adopt\)"
        ):
            await pending.result()
        # the approval stayed stored: applied to the adopted revision, once
        await until(lambda: status_of(reader, "rr") == "finished")
        history = await rt.workflows.history("rr")
        assert [
            (type(item).__name__, item.revision, item.status) for item in history
        ] == [
            ("SaveLogEntry", 2, "finished"),
            ("InboxEntry", 2, "transitioned"),
            ("SaveLogEntry", 1, "halted"),
        ]
        with pytest.raises(phronomy.NotFoundError, match="does not require recovery"):
            await rt.recovery.resolve("rr", action="release")
        with pytest.raises(phronomy.InvalidInputError, match="adopt"):
            await rt.recovery.resolve("rr", action="forget")  # type: ignore[arg-type]


async def test_release_marks_failed_so_it_can_be_retried(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    store = FaultyStore(make_store())
    flow = counter_flow()
    async with runtime_on(store) as rt:
        store.fail("save.before", OSError("reset")).fail(
            "readback.before", OSError("unreadable")
        )
        handle = rt.workflows.start(flow, workflow_instance_id="rel")
        await until(lambda: admission_state(rt, "rel") == "recovery_required")
        await until(lambda: status_of(store, "rel") == "recovery_required")
        released = await rt.recovery.resolve("rel", action="release")
        assert released is not None
        assert released.status == "failed"
        with pytest.raises(phronomy.RecoveryRequiredError, match="release"):
            await handle.result()
        assert (
            await rt.workflows.invoke(flow, workflow_instance_id="rel")
        ).revision == 1


async def test_failed_offloaded_save_is_an_unknown_outcome(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # scenario 82: the offloaded batch itself fails (not one save inside it)
    class ExplodingBatches(FaultyStore):  # type: ignore[misc]  # a test double
        explode = False

        def execute(self, ops: Any) -> Any:
            # the batch that would save (the event it applies was stored before)
            if self.explode and any(isinstance(op, SaveOp) for op in ops):
                raise RuntimeError("worker crashed")
            return super().execute(ops)

    store = ExplodingBatches(make_store())
    flow = live_flow()
    async with runtime_on(store) as rt:
        handle = await start_live(rt, flow, "x")
        store.explode = True
        assert rt.workflows.signal(flow, "x", "finish")
        await until(lambda: admission_state(rt, "x") == "recovery_required")
        assert store.count("save") == 0
        # never read back either (before: it counted "load", which a reconciliation
        # never records, so the line could not fail)
        assert store.count("readback") == 0
        store.explode = False
    with pytest.raises(phronomy.RecoveryRequiredError):
        await handle.result()


async def test_refused_save_submission_is_a_known_failure(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # scenario 85
    store = FaultyStore(make_store())
    flow = live_flow()
    async with runtime_on(store) as rt:
        handle = await start_live(rt, flow, "ref")
        stored = store.block("post.after")
        assert rt.workflows.signal(flow, "ref", "finish")
        await until(lambda: store.count("post") == 2)
        # the event is stored; the store refuses what comes next (the terminal save)
        rt.pool("phronomy.store").close()
        stored.set()
        with pytest.raises(phronomy.RuntimeShutdownError):
            await handle.result()
        assert admission_state(rt, "ref") is None
    assert store.load("ref").revision == 0  # type: ignore[union-attr]  # nothing saved


async def test_late_save_result_after_cut_off_is_dropped_with_a_warning(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # scenario 83
    store = FaultyStore(make_store())
    gate = store.block("save.before")
    async with runtime_on(store, shutdown_timeout=0.1, cancel_grace=3) as rt:
        handle = rt.workflows.start(halting_flow(), workflow_instance_id="late")
        await until(lambda: admission_state(rt, "late") == "persisting_terminal")
        threading.Timer(0.3, gate.set).start()
    with pytest.raises(
        phronomy.RecoveryRequiredError, match="terminal save was in flight"
    ):
        await handle.result()
    assert "rejected Workflow terminal persistence result" in caplog.text
    assert store.count("save") == 1
    assert store.inner.load("late").revision == 1  # type: ignore[union-attr]  # it did land: outcome was unknown


async def test_a_claim_answered_after_the_dispatcher_stopped_releases_its_lease(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # Before: the claim's answer, arriving once the engine stopped accepting, failed
    # the caller and left the row leased to this runtime (no segment, nothing renewing
    # it) until its TTL ran out and another runtime's sweep took it over.
    store = FaultyStore(make_store())
    gate = store.block("claim.after")
    async with runtime_on(store, shutdown_timeout=0.1, cancel_grace=3) as rt:
        handle = rt.workflows.start(halting_flow(), workflow_instance_id="late")
        await until(lambda: store.count("claim") == 1)

        def answer_once_stopped() -> None:  # the claim's answer comes after the stop
            while rt.state in ("running", "draining"):
                time.sleep(0.005)
            gate.set()

        threading.Thread(target=answer_once_stopped, daemon=True).start()
    with pytest.raises(phronomy.RuntimeShutdownError):
        await handle.result()
    assert store.count("claim") == 1
    assert store.inner.load("late") is None  # the claim made the row; it is gone
    async with runtime_on(store) as rt:  # free at once, not after the lease's TTL
        result = await rt.workflows.invoke(halting_flow(), workflow_instance_id="late")
        assert result.status == "halted"


async def test_an_old_incarnations_sink_cannot_reach_a_new_one(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # scenario 84
    store = make_store()
    flow = live_flow()
    async with runtime_on(store) as rt:
        first = await start_live(rt, flow, "inc")
        old_session = segment_id(rt, "inc")
        rt.workflows.signal(flow, "inc", "finish")
        assert (await first.result()).revision == 1
        second = await start_live(rt, flow, "inc", if_exists="restart")
        stale = phronomy.engine.Event(
            type=TERMINAL_RESULT, target_id=old_session or "", payload=None
        )
        assert not rt.engine.post_nowait(stale)
        rt.workflows.signal(flow, "inc", "finish")
        assert (await second.result()).revision == 2


async def test_observer_error_at_a_durable_halt(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # scenario 43 (durable): the record stays saved, the caller gets the observer's error
    store = make_store()
    error = LookupError("observer failed")

    def observe(step: Any) -> None:
        raise error

    async with runtime_on(store) as rt:
        with pytest.raises(LookupError) as caught:
            await rt.workflows.invoke(
                halting_flow(), workflow_instance_id="obs", on_step=observe
            )
        assert caught.value is error
        assert admission_state(rt, "obs") is None
    assert store.load("obs").revision == 1  # type: ignore[union-attr]


# --- bad input and faults -----------------------------------------------------------------


class Anything(phronomy.State):
    blob: Any = None
    text: str = ""


async def test_values_outside_the_json_domain_fail_without_writing(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # scenario 129
    store = make_store()
    wf = phronomy.Workflow(Anything, name="any").state("s").transition("s", FINISH)
    flow = wf.build()
    async with runtime_on(store) as rt:
        with pytest.raises(
            phronomy.SerializationError,
            match=r"\$\.fields\.blob holds a builtins\.object",
        ):
            await rt.workflows.invoke(
                flow, {"blob": object()}, workflow_instance_id="j"
            )
        with pytest.raises(phronomy.SerializationError, match="nan"):
            await rt.workflows.invoke(
                flow, {"blob": {"x": float("nan")}}, workflow_instance_id="j"
            )
        assert admission_state(rt, "j") is None
        assert (
            await rt.workflows.invoke(
                flow, {"blob": [1, "ok"]}, workflow_instance_id="j"
            )
        ).revision == 1


async def test_values_that_cannot_be_saved_faithfully_leave_the_store_intact(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # Before: a deep list escaped as RecursionError, and bytes under Any were saved and
    # came back as base64 text.
    store = make_store()
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    unsaveable = {"deep": deep, "bytes": b"\x00raw", "int-key": {1: "x"}}
    wf = phronomy.Workflow(Anything, name="any")
    wf.wait_state("parked").initial("parked")
    wf.transition(
        "parked",
        FINISH,
        on="store",
        action=lambda s, e: s.merge(
            blob=unsaveable[e.payload] if isinstance(e.payload, str) else e.payload
        ),
    )
    flow = wf.build()
    async with runtime_on(store) as rt:
        await rt.workflows.invoke(flow, {"blob": [1, "ok"]}, workflow_instance_id="j")
        before = store.load("j")
        assert before is not None
        # as an event's payload: refused before it is stored
        for payload, message in [
            (deep, r"payload of event 'store' for workflow instance 'j' is nested too"),
            (b"\x00raw", r"'j' would not come back as it was"),
            ({1: "x"}, r"'j' would not come back as it was"),
            ((1, 2), r"'j' would not come back as it was"),
        ]:
            with pytest.raises(phronomy.SerializationError, match=message):
                await rt.workflows.send_event(
                    flow, "store", workflow_instance_id="j", payload=payload
                )
        # as the state an action produced: the save is refused
        for name, message in [
            ("deep", r"'j' revision 2 is nested too deeply"),
            ("bytes", r"\$\.fields\.blob holds a bytes .* str .*'j' revision 2"),
            ("int-key", r"\$\.fields\.blob has a key of type int"),
        ]:
            with pytest.raises(phronomy.SerializationError, match=message):
                await rt.workflows.send_event(
                    flow, "store", workflow_instance_id="j", payload=name
                )
            after = store.load("j")
            assert after is not None
            assert (after.revision, after.snapshot) == (1, before.snapshot)
        done = await rt.workflows.send_event(
            flow, "store", workflow_instance_id="j", payload={"ok": [1, 2]}
        )
        assert (done.revision, done.state.blob) == (2, {"ok": [1, 2]})
        # the refused events are recorded as failed, not applied again
        history = await rt.workflows.history("j")
        events = [item for item in history if isinstance(item, InboxEntry)]
        assert [e.status for e in events] == ["transitioned"] + ["failed"] * 3


async def test_a_stored_blob_nested_too_deeply_is_a_corrupt_record(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    store = make_store()
    depth = 100_000
    store.save(
        SaveRequest(
            workflow_instance_id="deep",
            expected_revision=None,
            snapshot=b'{"type": "phronomy.workflow_state", "format": 1, '
            b'"workflow_instance_id": "deep", "revision": 1, "workflow": "counter", '
            b'"phase": "__end__", "fields": {"steps": '
            + b"[" * depth
            + b"]" * depth
            + b"}}",
            write_id="w",
            status="finished",
            phase=FINISH,
            workflow="counter",
        )
    )
    async with runtime_on(store) as rt:
        with pytest.raises(
            phronomy.CorruptRecordError, match="nested too deeply"
        ) as caught:
            await rt.workflows.invoke(counter_flow(), workflow_instance_id="deep")
        assert (caught.value.instance_id, caught.value.revision) == ("deep", 1)
        assert (
            await rt.workflows.invoke(counter_flow(), workflow_instance_id="ok")
        ).revision == 1
    record = store.load("deep")
    assert record is not None
    assert record.revision == 1


async def test_snapshot_size_limit(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    store = make_store()
    flow = (
        phronomy.Workflow(Anything, name="any")
        .state("s")
        .transition("s", FINISH)
        .build()
    )
    async with runtime_on(store, max_snapshot_bytes=500) as rt:
        assert (
            await rt.workflows.invoke(
                flow, {"text": "small"}, workflow_instance_id="big"
            )
        ).revision == 1
        with pytest.raises(phronomy.SerializationError, match="limit is 500 bytes"):
            await rt.workflows.invoke(
                flow,
                {"text": "x" * 1000},
                workflow_instance_id="big",
                if_exists="restart",
            )
    record, stored = fields(store, "big")
    assert (record.revision, stored["text"]) == (1, "small")


async def test_corrupt_stored_blobs_are_typed_errors_and_others_keep_running(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    store = make_store()
    flow = counter_flow()
    store.save(
        SaveRequest(
            workflow_instance_id="bad",
            expected_revision=None,
            snapshot=b'{"type": "phronomy.workflow_state", "form',
            write_id="w",
            status="halted",
            phase="p",
            workflow="counter",
        )
    )
    async with runtime_on(store) as rt:
        with pytest.raises(
            phronomy.CorruptRecordError, match="'bad' revision 1"
        ) as caught:
            await rt.workflows.invoke(flow, workflow_instance_id="bad")
        assert (caught.value.instance_id, caught.value.revision) == ("bad", 1)
        assert (
            await rt.workflows.invoke(flow, workflow_instance_id="good")
        ).revision == 1
    assert store.load("bad").snapshot.endswith(b'"form')  # type: ignore[union-attr]  # unchanged


async def test_an_instance_belongs_to_its_workflow(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    store = make_store()
    async with runtime_on(store) as rt:
        await rt.workflows.invoke(counter_flow("orders"), workflow_instance_id="owned")
        with pytest.raises(
            phronomy.InstanceStateError, match="belongs to workflow 'orders'"
        ):
            await rt.workflows.invoke(
                counter_flow("payments"), workflow_instance_id="owned"
            )
    assert store.load("owned").status == "finished"  # type: ignore[union-attr]


async def test_status_is_running_while_parked_and_failed_after_an_error(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    store = FaultyStore(make_store())
    flow = live_flow()

    def boom(state: Value) -> None:
        raise ValueError("action exploded")

    wf = (
        phronomy.Workflow(Value, name="boom")
        .state("s", entry=boom)
        .transition("s", FINISH)
    )
    async with runtime_on(store) as rt:
        # straight through to FINISH: one write that loads and claims it (the
        # lease), one save that releases it
        assert (
            await rt.workflows.invoke(counter_flow(), workflow_instance_id="quick")
        ).revision == 1
        assert (store.count("load"), store.count("claim"), store.count("save")) == (
            0,
            1,
            1,
        )
        # parked at a state waiting for a signal: running (claimed), then finished
        handle = await start_live(rt, flow, "st")
        await until(lambda: status_of(store, "st") == "running")
        rt.workflows.signal(flow, "st", "finish")
        await handle.result()
        assert status_of(store, "st") == "finished"
        assert store.count("claim") == 2
        # a fresh instance that failed before any save is listed as failed
        with pytest.raises(ValueError, match="action exploded"):
            await rt.workflows.invoke(wf.build(), workflow_instance_id="broken")
        await until(lambda: status_of(store, "broken") == "failed")
        broken = store.load("broken")
        assert broken is not None
        assert (broken.revision, broken.workflow) == (0, "boom")
        assert "action exploded" in (broken.detail or "")


async def test_shutdown_refuses_new_starts_but_lets_signals_through(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # scenario 131
    store = make_store()
    flow = live_flow()
    async with runtime_on(store) as rt, trio.open_nursery() as nursery:
        handle = await start_live(rt, flow, "live")
        nursery.start_soon(rt.shutdown)
        await until(lambda: rt.state == "draining")
        with pytest.raises(
            phronomy.RuntimeShutdownError,
            match=r"the runtime is shutting down \(draining\); it refused the workflow start",
        ):
            await rt.workflows.invoke(flow, workflow_instance_id="new")
        assert rt.workflows.signal(flow, "live", "finish")
        assert (await handle.result()).revision == 1
    assert rt.shutdown_result is not None
    assert rt.shutdown_result.clean


async def test_store_reads_housekeeping_starts_after_the_drain_leave_it_clean(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # Before: the drain, idle once, looked at the pools again, found the next read of
    # a pass like the inbox poll's already running and said "cancel_timeout" (not
    # clean) with nothing cut off; CI saw it on PostgreSQL, whose notifications wake
    # the poll often.
    store = FaultyStore(make_store())
    store.delay("load.before", 0.002, times=None)
    async with runtime_on(store) as rt:
        gateway: Any = rt.workflows._coordinator.gateway

        async def reads() -> None:  # one read after another, until the poll would end
            with contextlib.suppress(phronomy.PhronomyError):
                while rt.state in ("running", "draining"):
                    await gateway.run(LoadOp(workflow_instance_id="none"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reads)
            await until(lambda: store.count("load") >= 3)
            await rt.shutdown()
    assert rt.shutdown_result is not None
    assert rt.shutdown_result.clean, rt.shutdown_result


def _slow_approval() -> phronomy.WorkflowDefinition[Value]:
    """approval_flow's twin whose 'confirm' waits (live) for an event that never comes."""
    wf = (
        phronomy.Workflow(Value, name="approval")
        .wait_state("awaiting")
        .initial("awaiting")
        .state("confirm")
    )
    wf.transition("awaiting", "confirm", on="approve")
    wf.transition("confirm", FINISH, on="never")
    return wf.build()


async def test_a_segment_cut_off_at_shutdown_leaves_an_honest_row(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # Before: the rows of cut-off segments stayed "running" after a clean shutdown.
    store = make_store()
    async with runtime_on(store) as rt:
        halted = await rt.workflows.invoke(approval_flow(), workflow_instance_id="cut")
    errors: list[BaseException] = []

    async def resume(rt: phronomy.Runtime) -> None:
        try:
            await rt.workflows.send_event(
                _slow_approval(), "approve", halted=halted, event_id="approve-1"
            )
        except phronomy.RuntimeShutdownError as exc:
            errors.append(exc)

    async with trio.open_nursery() as nursery:
        async with runtime_on(store, shutdown_timeout=0.05) as rt:
            nursery.start_soon(resume, rt)
            fresh = rt.workflows.start(live_flow(), workflow_instance_id="fresh")
            await until(
                lambda: (
                    status_of(store, "cut") == "running"
                    and status_of(store, "fresh") == "running"
                )
            )
    result = rt.shutdown_result
    assert result is not None
    assert "workflow approval instance cut (executing)" in result.cut_off
    assert len(errors) == 1
    with pytest.raises(phronomy.RuntimeShutdownError):
        await fresh.result()
    cut = store.load("cut")
    assert cut is not None
    assert (cut.status, cut.revision) == ("halted", 1)  # its last durable revision
    assert "cut off when the runtime shut down; revision 1 is unchanged" in (
        cut.detail or ""
    )
    never_saved = store.load("fresh")
    assert never_saved is not None
    assert (never_saved.status, never_saved.revision) == ("failed", 0)
    assert "had not saved yet" in (never_saved.detail or "")
    async with runtime_on(store) as rt:
        # the event stayed stored: its retry (the same event id) is applied once
        done = await rt.workflows.send_event(
            approval_flow(), "approve", workflow_instance_id="cut", event_id="approve-1"
        )
        assert (done.revision, status_of(store, "cut")) == (2, "finished")
        history = await rt.workflows.history("cut")
        events = [item for item in history if isinstance(item, InboxEntry)]
        assert [(e.event_id, e.status, e.revision) for e in events] == [
            ("approve-1", "transitioned", 2)
        ]


async def test_resume_rejects_state_of_another_class(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    flow = approval_flow()
    async with runtime_on(make_store()) as rt:
        halted = await rt.workflows.invoke(flow, workflow_instance_id="typed")
        wrong = msgspec.structs.replace(halted, state=Rich())
        with pytest.raises(phronomy.InvalidInputError, match="runs Value"):
            await rt.workflows.send_event(flow, "approve", halted=wrong)


async def test_every_caller_settles_before_the_runtime_block_exits() -> None:
    # Before: a start whose load was blocked past both deadlines was listed as cut off
    # but its handle stayed pending after the block (same for a durable execution).
    store = FaultyStore(phronomy.MemoryStore())
    gate = store.block("claim.before", times=None)
    try:
        async with runtime_on(store, shutdown_timeout=0.1, cancel_grace=0.1) as rt:
            workflow = rt.workflows.start(
                counter_flow(), workflow_instance_id="blocked"
            )
            execution = rt.executions.start("agent-blocked", [lambda v: v])
            await until(
                lambda: (
                    store.count("claim") == 1  # the start is blocked in its claim
                    and rt.executions.is_admitted("agent-blocked")
                )
            )
        assert workflow.done
        assert execution.done
        with pytest.raises(phronomy.RuntimeShutdownError, match="shut down before"):
            await workflow.result()
        with pytest.raises(phronomy.RuntimeShutdownError, match="shut down before"):
            await execution.result()
        result = rt.shutdown_result
        assert result is not None
        assert "workflow counter instance blocked (admitting)" in result.cut_off
        assert not result.cleanup_complete  # the blocked loads are still in threads
    finally:
        gate.set()


async def test_an_unknown_outcome_stays_refused_in_the_process_when_its_mark_fails(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # Before: when the recovery_required mark could not be written either, a second
    # runtime of the same process (on the same database) was admitted and saved
    # revision 2 while the first caller was still pending.
    inner = make_store()
    first = FaultyStore(inner)
    first.fail("save.after", OSError("lost")).fail("readback.before", OSError("gone"))
    first.fail("mark.before", OSError("mark lost"), times=None)
    second = make_store()  # a second store object on the same database
    assert second.identity == first.identity
    flow = counter_flow()
    async with (
        runtime_on(first, shutdown_timeout=0.5) as a,
        runtime_on(second, shutdown_timeout=0.5) as b,
    ):
        pending = a.workflows.start(flow, workflow_instance_id="q")
        await until(lambda: admission_state(a, "q") == "recovery_required")
        await until(lambda: first.count("mark") >= 1)  # the mark was tried, and failed
        first.clear()  # (for MemoryStore both runtimes share one store object)
        assert status_of(inner, "q") == "finished"  # the save landed, unknown to a
        with pytest.raises(phronomy.RecoveryRequiredError, match="requires recovery"):
            await b.workflows.invoke(flow, workflow_instance_id="q")
        listed = await b.recovery.list()
        assert [(e.workflow_instance_id, e.in_process) for e in listed] == [
            ("q", False)
        ]
        assert "unknown" in (listed[0].error or "")
        assert not pending.done
        await b.recovery.resolve("q", action="adopt")  # from the other runtime
        rerun = await b.workflows.invoke(
            flow, workflow_instance_id="q", if_exists="restart"
        )
        assert rerun.revision == 2
        await a.recovery.resolve("q", action="adopt")  # its own admission
        with pytest.raises(phronomy.RecoveryRequiredError, match="resolved"):
            await pending.result()


async def test_faults_inside_group_commits_are_reconciled_save_by_save(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # Every commit lands but its acknowledgement fails: each save of each batch is
    # reconciled on its own (FaultyStore fires inside the store's batched execute).
    store = FaultyStore(make_store())
    store.fail("commit.after", OSError("ack lost"), times=None)
    flow = counter_flow()
    async with runtime_on(store) as rt:
        handles = [
            rt.workflows.start(flow, workflow_instance_id=f"g{i}") for i in range(40)
        ]
        results = [await h.result() for h in handles]
    assert [r.revision for r in results] == [1] * 40
    assert store.count("save") == 40
    assert store.count("commit") < 40  # saves shared transactions
    for i in range(40):
        assert status_of(store, f"g{i}") == "finished"


async def test_a_failed_segments_caller_hears_it_once_the_row_says_failed(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    """The settlement order of a failure, pinned: the caller of a durable segment whose
    action raised hears the error only once the row says ``failed`` (the status rides
    the write lane like a save), so anything it does next, in any process, sees the
    failed row; a failing status write still lets the error through."""
    inner = make_store()
    store = FaultyStore(inner)

    def boom(state: Value, event: Any) -> None:
        raise ValueError("action exploded")

    wf = phronomy.Workflow(Value, name="fails").wait_state("w")
    wf.state("s", entry=boom).transition("w", "s", on="go")
    wf.transition("s", FINISH)
    flow = wf.build()
    async with runtime_on(store) as rt:
        await rt.workflows.invoke(flow, workflow_instance_id="f")
        gate = store.block("mark.before")  # a slow store
        handle = rt.workflows.start_event(flow, "go", workflow_instance_id="f")
        await until(lambda: store.count("mark") == 1)
        await trio.sleep(0.05)
        assert not handle.done  # the row does not say "failed" yet: no answer yet
        gate.set()
        with pytest.raises(ValueError, match="action exploded"):
            await handle.result()
        assert status_of(inner, "f") == "failed"  # already, when the caller heard
        # the status write fails: the caller still hears the error (it is logged)
        store.fail("mark.before", OSError("disk full"))
        retried = rt.workflows.start_event(flow, "go", workflow_instance_id="f")
        with pytest.raises(ValueError, match="action exploded"):
            with trio.fail_after(5):
                await retried.result()
