"""The operating commands on an instance another runtime runs, on both stores: cancel
(asked through the row), terminate (fencing its holder), and the history of the sweep's
takeovers."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
import trio

import phronomy
from cli_targets import live_runtime, refused, run_cli
from failing_orders import FLOW
from phronomy.errors import LeaseLostError

if TYPE_CHECKING:
    from collections.abc import Callable


async def test_cancel_reaches_an_instance_another_runtime_runs(
    target: tuple[str, Callable[[], Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    from workflow.helpers import live_flow, start_live

    db, make = target
    flow = live_flow()
    async with live_runtime(make) as (rt, store):
        with trio.fail_after(10):
            handle = await start_live(rt, flow, "live-1")
        cancel = ["instances", "cancel", "--db", db, "live-1"]
        status, out, err = await trio.to_thread.run_sync(
            lambda: run_cli(capsys, *cancel, "--reason", "ops", "--wait", "10")
        )
        assert status == 0, err
        assert out.startswith("live-1: cancelled at revision"), out
        with pytest.raises(phronomy.WorkflowCancelledError), trio.fail_after(10):
            await handle.result()
        with trio.fail_after(10):
            other = await start_live(rt, flow, "live-3")
        status, out, err = await trio.to_thread.run_sync(
            lambda: run_cli(
                capsys, "instances", "cancel", "--db", db, "live-3", "--no-wait",
                "--json",
            )
        )  # fmt: skip
        assert (status, json.loads(out)["status"]) == (0, "cancel_requested"), err
        with pytest.raises(phronomy.WorkflowCancelledError), trio.fail_after(10):
            await other.result()  # the heartbeat sees the request
        row = store.load("live-1")
        assert (row.status, row.lease_owner) == ("cancelled", None)
        status, out, _ = await trio.to_thread.run_sync(lambda: run_cli(capsys, *cancel))
        assert out == "live-1: already cancelled\n"


def test_history_shows_the_sweep_s_takeovers(
    target: tuple[str, Callable[[], Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    from phronomy.storage import BeginOp, RecoverOp

    db, make = target

    async def halted() -> None:
        store = make()
        try:
            async with phronomy.open_runtime(store=store, sweep_interval=0) as rt:
                await rt.workflows.invoke(FLOW, workflow_instance_id="t-1")
        finally:
            store.close()

    trio.run(halted)
    store = make()
    try:
        claim = BeginOp(
            workflow_instance_id="t-1",
            workflow="orders",
            expected_revision=1,
            lease_owner="a-stopped-runtime",
            ttl_ms=0,
        )
        assert store.run(claim) is not None
        assert store.run(RecoverOp(limit=10, max_takeovers=5)) == [("t-1", "halted")]
    finally:
        store.close()
    status, out, err = run_cli(
        capsys, "instances", "history", "--db", db, "t-1", "--json"
    )
    assert status == 0, err
    kinds = [(v["kind"], v.get("revision")) for v in map(json.loads, out.splitlines())]
    assert kinds == [("takeover", 1), ("save", 1)]
    (taken, _) = map(json.loads, out.splitlines())
    assert taken["status"] == "halted"
    assert taken["taken_at"].endswith("Z")
    status, out, _ = run_cli(capsys, "instances", "history", "--db", db, "t-1")
    assert "takeover" in out.splitlines()[1]
    assert "back at revision 1" in out


async def test_terminate_closes_a_live_instance_and_fences_its_holder(
    target: tuple[str, Callable[[], Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    from workflow.helpers import live_flow, start_live

    db, make = target
    flow = live_flow()
    async with live_runtime(make) as (rt, store):
        handle = await start_live(rt, flow, "live-2")
        held = store.load("live-2")
        terminate = ["instances", "terminate", "--db", db, "live-2"]
        status, out, err = await trio.to_thread.run_sync(
            lambda: run_cli(capsys, *terminate, "--reason", "stuck", "--json")
        )
        assert status == 0, err
        view = json.loads(out)
        assert (view["status"], view["lease_epoch"]) == (
            "cancelled",
            held.lease_epoch + 1,
        )
        row = store.load("live-2")
        assert (row.status, row.lease_owner, row.lease_epoch) == (
            "cancelled",
            None,
            held.lease_epoch + 1,
        )
        assert row.detail == "terminated by an operator (cli): stuck"
        # the holder learns it lost the lease; its later writes are refused
        with pytest.raises(LeaseLostError):
            with trio.fail_after(5):
                await handle.result()
        after = store.load("live-2")
        assert (after.status, after.revision) == ("cancelled", row.revision)
        err = await trio.to_thread.run_sync(lambda: refused(capsys, *terminate))
        assert "is cancelled already" in err
        err = await trio.to_thread.run_sync(
            lambda: refused(capsys, "instances", "terminate", "--db", db, "nope")
        )
        assert "does not exist" in err
