"""A runtime on PostgreSQL while the server crashes and restarts under it: callers
hear a success or an error that nothing was written, and an instance requires recovery
only when the server truly cannot tell what a save did."""

from __future__ import annotations

import collections
import os
import subprocess
from typing import TYPE_CHECKING

import pytest
import trio

import phronomy

from .helpers import Value

if TYPE_CHECKING:
    from collections.abc import Callable

CRASHES = int(os.environ.get("PHRONOMY_PG_CRASHES", "3"))


def ticking_flow() -> phronomy.WorkflowDefinition[Value]:
    """Halts at 'waiting'; each 'tick' counts and halts there again (one save)."""
    wf = phronomy.Workflow(Value, name="ticking")
    wf.wait_state("waiting").initial("waiting")
    wf.transition(
        "waiting", "waiting", on="tick", action=lambda s: s.merge(count=s.count + 1)
    )
    return wf.build()


@pytest.fixture
def crash_server() -> Callable[[], None]:
    ctl = os.environ.get("PHRONOMY_TEST_POSTGRES_CTL")
    if not ctl:
        reason = "no PostgreSQL server of scripts/postgres-test-server to crash"
        if os.environ.get("PHRONOMY_REQUIRE_POSTGRES"):
            pytest.fail(reason)
        pytest.skip(reason)

    def crash() -> None:
        subprocess.run([ctl, "crash-restart"], check=True, timeout=120)

    return crash


@pytest.mark.slow
async def test_server_crashes_leave_no_instance_requiring_recovery(
    open_postgres: Callable[..., phronomy.PostgresStore],
    crash_server: Callable[[], None],
) -> None:
    """8 instances take events in a loop while the server crashes (immediate stop,
    WAL replay) and restarts: every event is acknowledged or refused with an error;
    none leaves its caller pending or its instance recovery_required, and each
    instance's revision counts exactly its acknowledged events (a tick that failed
    may have been stored: it is sent again by its event id, and applied once).

    Before: the fence proved the failed transactions aborted (the server restarted),
    but the read-back ran on the broken read connection and failed, and instances went
    to recovery_required with their callers pending (8 in 30 s of crash-restarts).
    """
    store = open_postgres(connect_timeout=2)
    flow = ticking_flow()
    ids = [f"c{n}" for n in range(8)]
    acked: collections.Counter[str] = collections.Counter()
    outcomes: collections.Counter[str] = collections.Counter()
    async with phronomy.open_runtime(store=store, shutdown_timeout=5) as rt:
        for iid in ids:
            await rt.workflows.invoke(flow, workflow_instance_id=iid)  # revision 1
        crashing = True

        async def drive(iid: str) -> None:
            # tick n goes by the event id f"{iid}-{n}": after an error it may be
            # stored (and applied later), so it is sent again under the same id until
            # acknowledged, also once the crashes are over
            n, retrying, late = 0, False, 0
            while crashing or (retrying and late < 100):
                late += not crashing
                with trio.move_on_after(20) as stuck:
                    try:
                        await rt.workflows.send_event(
                            flow,
                            "tick",
                            workflow_instance_id=iid,
                            event_id=f"{iid}-{n}",
                        )
                    except phronomy.PhronomyError as exc:
                        outcomes[type(exc).__name__] += 1
                        retrying = True
                        await trio.sleep(0.05)  # the server is down: try again soon
                    else:
                        acked[iid] += 1
                        outcomes["acknowledged"] += 1
                        n, retrying = n + 1, False
                if stuck.cancelled_caught:
                    outcomes["caller pending"] += 1
                    return
            if retrying:
                outcomes["never acknowledged"] += 1

        async with trio.open_nursery() as nursery:
            for iid in ids:
                nursery.start_soon(drive, iid)
            for _ in range(CRASHES):
                await trio.sleep(0.5)
                await trio.to_thread.run_sync(crash_server)
            await trio.sleep(0.5)
            crashing = False
        entries = await rt.recovery.list()
    rows = {iid: store.load(iid) for iid in ids}
    counted = {iid: row.revision - 1 for iid, row in rows.items() if row is not None}
    print(  # noqa: T201 - the figures of the run
        f"postgres crash-restarts under a runtime: {CRASHES} crashes, 8 instances: "
        f"{dict(outcomes)}; {len(entries)} requiring recovery"
    )
    assert entries == []
    assert outcomes["caller pending"] == 0
    assert outcomes["RecoveryRequiredError"] == 0
    assert outcomes["never acknowledged"] == 0
    assert counted == {iid: acked[iid] for iid in ids}  # no lost or invented events
    assert {row.status for row in rows.values() if row is not None} == {"halted"}
    assert outcomes["acknowledged"] > 8
