"""Supervised executions as durable instances: leases, the inbox, time, takeover.

Steps here are module-level functions, so their plan is the same in every runtime
that builds it (another runtime can resume an execution).
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.testing

import phronomy
from phronomy.cli import main
from phronomy.storage import TerminateOp
from phronomy.testing import TestClock
from polling import until

if TYPE_CHECKING:
    from collections.abc import Callable
    from contextlib import AbstractAsyncContextManager
    from pathlib import Path

    OpenSQLite = Callable[..., phronomy.SQLiteStore]

# --- steps ---------------------------------------------------------------------------

RELEASE = threading.Event()
ATTEMPTS: list[int] = []


def draft(order: str) -> dict[str, Any]:
    return {"order": order, "lines": 2}


def ask(plan: dict[str, Any]) -> phronomy.ApprovalRequest:
    return phronomy.ApprovalRequest(question=f"ship {plan['order']}?", details=plan)


def ship(approval: phronomy.Approval) -> str:
    assert isinstance(approval, phronomy.Approval)  # rebuilt from its JSON
    return f"shipped {approval.request.details['order']} ({approval.response})"


def pair(value: Any) -> tuple[Any, Any]:
    return (value, value)  # saved as a list


def first(value: Any) -> Any:
    assert isinstance(value, list)  # with a store, values between steps are JSON
    return value[0]


def blocked(value: Any) -> Any:
    RELEASE.wait(10)
    return value


def flaky(value: int) -> int:
    ATTEMPTS.append(value)
    if len(ATTEMPTS) < 3:
        raise ConnectionError(f"attempt {len(ATTEMPTS)}")
    return value * 2


PLAN = phronomy.agent.execution_plan([draft, ask, ship], name="shipping")
RETRIED = phronomy.agent.execution_plan(
    [flaky],
    name="retried",
    retry=phronomy.RetryPolicy(max_attempts=3, initial_interval=0.01, jitter="none"),
)


@pytest.fixture
def clock() -> trio.testing.MockClock:
    """Trio's clock at wall speed, which a test jumps (see TestClock)."""
    return trio.testing.MockClock(rate=1)


def _runtime(
    store: phronomy.SQLiteStore, **options: Any
) -> AbstractAsyncContextManager[phronomy.Runtime]:
    return phronomy.open_runtime(
        store=store,
        workflows=[PLAN, RETRIED],
        inbox_poll_interval=0.05,
        lease_ttl=1.5,
        heartbeat_interval=0.2,
        lease_margin=0.3,
        **options,
    )


# --- tests ---------------------------------------------------------------------------


async def test_each_step_is_saved_and_the_record_says_where_it_is(
    open_sqlite: OpenSQLite, tmp_path: Path
) -> None:
    async with _runtime(open_sqlite(tmp_path / "a.db")) as rt:
        execution = rt.executions.start("k", PLAN, "o-1")
        request = await execution.wait_for_approval()
        assert request.details == {"order": "o-1", "lines": 2}
        record = await rt.executions.record("k")
        assert record is not None
        assert (record.status, record.plan, record.steps_completed, record.step) == (
            "suspended",
            "shipping",
            1,
            1,
        )
        assert record.pending_approval == request
        assert record.lease is None  # halted: nobody holds it
        execution.approve("ok")
        done = await execution.result()
        assert done.value == "shipped o-1 (ok)"
        record = await rt.executions.record("k")
        assert record is not None
        assert (record.status, record.steps_completed, record.value) == (
            "completed",
            3,
            "shipped o-1 (ok)",
        )
        # a save per step: a checkpoint, the approval's halt, the end
        assert record.revision == 3
        assert (await rt.executions.invoke("k", [pair, first], "v")).value == "v"
        replaced = await rt.executions.record("k")
        assert replaced is not None
        assert replaced.plan != "shipping"  # the key's latest execution, another plan


async def test_suspended_approvals_survive_shutdown_and_are_answered_elsewhere(
    open_sqlite: OpenSQLite, tmp_path: Path, clock: trio.testing.MockClock
) -> None:
    # Before: a clean shutdown closed a suspended approval as "abandoned", and only
    # the process that started it could answer it.
    test_clock = TestClock(clock)
    path = tmp_path / "later.db"
    async with _runtime(open_sqlite(path, clock=test_clock)) as rt:
        execution = rt.executions.start("k", PLAN, "o-2")
        await execution.wait_for_approval()
    with pytest.raises(phronomy.RuntimeShutdownError, match="stays suspended"):
        await execution.result()
    test_clock.skip(timedelta(days=3))
    async with _runtime(open_sqlite(path, clock=test_clock)) as other:
        record = await other.executions.record("k")
        assert record is not None
        assert record.status == "suspended"
        assert record.execution_id == execution.execution_id
        with pytest.raises(phronomy.BusyError, match="nonterminal"):
            await other.executions.invoke("k", PLAN, "o-3")
        await other.executions.decide("k", approve=True, response="three days on")

        async def finished() -> phronomy.agent.ExecutionRecord:
            while True:
                found = await other.executions.record("k")
                assert found is not None
                if found.status == "completed":
                    return found
                await trio.sleep(0.05)

        with trio.fail_after(30):
            done = await finished()
        assert done.value == "shipped o-2 (three days on)"
        with pytest.raises(phronomy.InstanceStateError, match="not waiting"):
            await other.executions.decide("k", approve=False)


async def test_the_command_line_answers_and_cancels_executions(
    open_sqlite: OpenSQLite, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "cli.db"
    db = str(path)
    async with _runtime(open_sqlite(path)) as rt:
        approved = rt.executions.start("a", PLAN, "o-a")
        rejected = rt.executions.start("r", PLAN, "o-r")
        await approved.wait_for_approval()
        await rejected.wait_for_approval()

        def cli(*argv: str) -> int:
            return main(list(argv))

        assert (
            await trio.to_thread.run_sync(
                cli, "executions", "list", "--db", db, "--status", "suspended"
            )
            == 0
        )
        rows = capsys.readouterr().out.splitlines()
        assert [r.split()[0] for r in rows] == ["AGENT", "a", "r"]
        argv = (
            "executions",
            "approve",
            "--db",
            db,
            "a",
            "--response",
            '"from the cli"',
        )
        assert await trio.to_thread.run_sync(cli, *argv) == 0
        argv = (
            "executions",
            "reject",
            "--db",
            db,
            "r",
            "--response",
            '{"why": "late"}',
        )
        assert await trio.to_thread.run_sync(cli, *argv) == 0
        with trio.fail_after(10):  # this runtime's poll finds them
            assert (await approved.result()).value == "shipped o-a (from the cli)"
            done = await rejected.result()
        assert (done.status, done.rejection) == ("rejected", {"why": "late"})
        capsys.readouterr()
        # a running execution: the runtime that holds it cancels at its heartbeat
        RELEASE.clear()
        running = rt.executions.start("c", [blocked, draft], "x")
        await until(lambda: (running.owner() or _none()).status == "executing")
        argv = ("executions", "cancel", "--db", db, "c", "--reason", "operator")
        async with trio.open_nursery() as nursery:
            code: list[int] = []

            async def cancel() -> None:
                code.append(await trio.to_thread.run_sync(cli, *argv))

            nursery.start_soon(cancel)
            await until(lambda: _cancel_asked(path, "agent:c"))
            await trio.sleep(0.5)  # its runtime's heartbeat (0.2 s) saw it
            assert not running.done  # its thread still runs: the caller waits for it
            RELEASE.set()
        assert code == [0]
        assert "cancelled" in capsys.readouterr().out
        with pytest.raises(phronomy.CancellationError, match="operator"):
            with trio.fail_after(20):
                await running.result()
        record = await rt.executions.record("c")
        assert record is not None
        assert record.status == "cancelled"
    assert main(["executions", "show", "--db", db, "a", "--json"]) == 0
    assert '"status": "completed"' in capsys.readouterr().out


def _cancel_asked(path: Path, key: str) -> bool:
    store = phronomy.SQLiteStore(path, read_only=True)
    try:
        row = store.load(key)
    finally:
        store.close()
    return row is not None and row.cancel_requested is not None


def _none() -> phronomy.agent.ExecutionOwner:
    return phronomy.agent.ExecutionOwner(
        execution_id="", agent_id="", status="starting", step_index=0
    )


async def test_steps_are_retried_durably_by_their_plan(
    open_sqlite: OpenSQLite, tmp_path: Path
) -> None:
    ATTEMPTS.clear()
    async with _runtime(open_sqlite(tmp_path / "retry.db")) as rt:
        done = await rt.executions.invoke("k", RETRIED, 21)
        assert done.value == 42
        assert ATTEMPTS == [21, 21, 21]
        record = await rt.executions.record("k")
        assert record is not None
        assert (record.status, record.value) == ("completed", 42)


async def test_a_deadline_ends_a_suspended_execution_from_the_store(
    open_sqlite: OpenSQLite, tmp_path: Path, clock: trio.testing.MockClock
) -> None:
    test_clock = TestClock(clock)
    path = tmp_path / "deadline.db"
    async with _runtime(open_sqlite(path, clock=test_clock)) as rt:
        execution = rt.executions.start("k", PLAN, "o-4", timeout=3600)
        await execution.wait_for_approval()
    test_clock.skip(timedelta(hours=2))
    # the deadline's timer was saved with the approval: another runtime fires it
    async with _runtime(open_sqlite(path, clock=test_clock)) as other:
        with trio.fail_after(60):
            while True:
                record = await other.executions.record("k")
                assert record is not None
                if record.status != "suspended":
                    break
                await trio.sleep(0.1)
        assert record.status == "cancelled"
        assert record.error == "the execution passed its deadline"


async def test_get_describes_an_execution_with_its_pending_answer_and_deadline(
    open_sqlite: OpenSQLite, tmp_path: Path
) -> None:
    path = tmp_path / "get.db"
    async with _runtime(open_sqlite(path)) as rt:
        execution = rt.executions.start("k", PLAN, "o-6", timeout=3600)
        await execution.wait_for_approval()
        with pytest.raises(phronomy.NotFoundError, match="'nobody' has no execution"):
            await rt.executions.get("nobody")
        with pytest.raises(phronomy.InvalidInputError, match="agent_id"):
            await rt.executions.get("")
        with pytest.raises(phronomy.InvalidInputError, match="limit must be"):
            await rt.executions.get("k", limit=0)
    # an answer from the command line, which no runtime applies yet
    argv = ["executions", "approve", "--db", str(path), "k", "--response", '"yes"']
    assert await trio.to_thread.run_sync(main, argv) == 0
    async with phronomy.open_runtime(store=open_sqlite(path)) as reader:  # serves none
        found = await reader.executions.get("k")
    record = found.record
    assert (record.agent_id, record.status, record.execution_id) == (
        "k",
        "suspended",
        execution.execution_id,
    )
    assert record.pending_approval is not None
    assert record.pending_approval.question == "ship o-6?"
    assert (record.steps_completed, record.lease) == (1, None)  # draft; ask waits
    assert [e.event for e in found.pending_events] == ["approve"]
    assert len(found.pending_timers) == 1  # its deadline, saved with the approval
    assert (found.cancel_requested, found.takeovers) == (None, 0)
    async with phronomy.open_runtime() as ephemeral:
        with pytest.raises(phronomy.InvalidInputError, match="reads the store"):
            await ephemeral.executions.get("k")


async def test_answers_and_listing_errors_are_clear(
    open_sqlite: OpenSQLite, tmp_path: Path
) -> None:
    async with _runtime(open_sqlite(tmp_path / "errors.db")) as rt:
        with pytest.raises(phronomy.NotFoundError, match="no execution"):
            await rt.executions.decide("nobody", approve=True)
        with pytest.raises(phronomy.NotFoundError, match="no execution"):
            await rt.executions.cancel_agent("nobody")
        with pytest.raises(phronomy.InvalidInputError, match="status must be"):
            await rt.executions.list(status="asleep")  # type: ignore[arg-type]
        with pytest.raises(phronomy.InvalidInputError, match="limit must be"):
            await rt.executions.list(limit=0)
        execution = rt.executions.start("k", PLAN, "o-5")
        await execution.wait_for_approval()
        with pytest.raises(phronomy.InvalidInputError, match="JSON"):
            await rt.executions.decide("k", approve=True, response=object())
        with pytest.raises(phronomy.BusyError, match="in progress"):
            await rt.executions.purge("k")
        for n in range(5):
            await rt.executions.invoke(f"p-{n}", [pair, first], n)
        page = await rt.executions.list(limit=2)
        assert [r.agent_id for r in page.records] == ["k", "p-0"]
        page = await rt.executions.list(limit=2, after=page.next_after)
        assert [r.agent_id for r in page.records] == ["p-1", "p-2"]
        some = await rt.executions.list(prefix="p-", limit=10)
        assert [r.agent_id for r in some.records] == [f"p-{n}" for n in range(5)]
        done = await rt.executions.list(status="completed", limit=10)
        assert [r.agent_id for r in done.records] == [f"p-{n}" for n in range(5)]
        assert done.next_after is None
        record = await rt.executions.cancel_agent("k", reason="changed my mind")
        assert record.status == "cancelled"
        with pytest.raises(phronomy.CancellationError, match="changed my mind"):
            await execution.result()
        assert await rt.executions.purge("k")


def counted(value: Any) -> Any:
    ATTEMPTS.append(0)
    return value


CHECKPOINTED = phronomy.agent.execution_plan(
    [counted, blocked, counted], name="checkpointed"
)


async def test_a_checkpoint_is_one_save_that_keeps_the_lease(
    open_sqlite: OpenSQLite, tmp_path: Path
) -> None:
    ATTEMPTS.clear()
    RELEASE.clear()
    store = open_sqlite(tmp_path / "c.db")
    async with phronomy.open_runtime(store=store, workflows=[CHECKPOINTED]) as rt:
        execution = rt.executions.start("k", CHECKPOINTED, "v")
        await until(lambda: _revision(store) == 1)
        row = _row(store)  # the first step's result is saved; the segment goes on
        assert (row.status, row.phase, row.lease_owner is not None) == (
            "running",
            "after_0",
            True,
        )
        epoch = row.lease_epoch
        RELEASE.set()
        assert (await execution.result()).value == "v"
        row = _row(store)
        assert (row.status, row.revision, row.lease_epoch) == ("finished", 3, epoch)
        assert ATTEMPTS == [0, 0]
        # one claim: the same lease from start to end (a halt would release it)


async def test_a_fenced_off_checkpoint_save_is_refused(
    open_sqlite: OpenSQLite, tmp_path: Path
) -> None:
    ATTEMPTS.clear()
    RELEASE.clear()
    store = open_sqlite(tmp_path / "z.db")
    async with phronomy.open_runtime(
        store=store, workflows=[CHECKPOINTED], lease_ttl=30, heartbeat_interval=10
    ) as rt:
        execution = rt.executions.start("k", CHECKPOINTED, "v")
        await until(lambda: _revision(store) == 1)  # in the blocked step
        # another runtime takes the instance over (an operator's forced stop here)
        assert store.run(
            TerminateOp(workflow_instance_id="agent:k", expected_revision=1)
        )
        RELEASE.set()  # the step returns before a heartbeat could tell the segment
        with pytest.raises(phronomy.LeaseLostError, match="cannot save"):
            await execution.result()
        row = _row(store)
        assert (row.status, row.revision) == ("cancelled", 1)  # nothing written
        assert ATTEMPTS == [0]  # and no step after it ran


def _revision(store: phronomy.SQLiteStore) -> int:
    row = store.load("agent:k")
    return 0 if row is None else row.revision


def _row(store: phronomy.SQLiteStore) -> Any:
    row = store.load("agent:k")
    assert row is not None
    return row


async def test_a_cancel_asked_of_a_runtime_that_died_is_carried_out_by_the_sweep(
    open_sqlite: OpenSQLite, tmp_path: Path
) -> None:
    # The execution twin of the workflow test: an operator cancels an execution whose
    # runtime died holding it, while its approval waits in the inbox; a runtime that
    # serves its plan sweeps it cancelled (it would otherwise apply the approval and
    # ship).
    from phronomy.agent._records import agent_key, answer_posting
    from phronomy.storage import BeginOp, EntryOp, PostOp, RequestCancelOp

    path = tmp_path / "died.db"
    async with _runtime(open_sqlite(path)) as rt:
        execution = rt.executions.start("k", PLAN, "o-9")
        await execution.wait_for_approval()
    with pytest.raises(phronomy.RuntimeShutdownError, match="stays suspended"):
        await execution.result()
    store = open_sqlite(path)
    key = agent_key("k")

    def a_runtime_claims_it_and_dies_then_an_operator_answers_and_cancels() -> str:
        row = store.load(key)
        assert row is not None
        claim = BeginOp(
            workflow_instance_id=key,
            workflow=row.workflow,
            expected_revision=row.revision,
            lease_owner="died",
            ttl_ms=0,  # its lease expired at once
        )
        assert store.run(claim) is not None
        posting = answer_posting(
            "k", execution.execution_id, approve=True, response="go"
        )
        assert store.run(PostOp(posting=posting)).outcome == "stored"
        asked = store.run(RequestCancelOp(workflow_instance_id=key, reason="ops"))
        assert asked == (row.lease_epoch + 1, True)  # the dead runtime's claim
        return posting.event_id

    event_id = await trio.to_thread.run_sync(
        a_runtime_claims_it_and_dies_then_an_operator_answers_and_cancels
    )
    async with _runtime(open_sqlite(path), sweep_interval=0.05) as other:
        await until(lambda: getattr(store.load(key), "status", "") != "running", 10)
        await trio.sleep(0.3)  # some polls: nothing resumes it
        found = await other.executions.get("k")
    record = found.record
    assert (record.status, record.steps_completed) == ("cancelled", 1)  # never shipped
    assert "cancelled (ops) by the recovery sweep" in (record.error or "")
    assert (found.pending_events, found.cancel_requested, record.lease) == (
        (),
        None,
        None,
    )
    entry = store.run(EntryOp(workflow_instance_id=key, event_id=event_id))
    assert entry is not None
    assert entry.status == "refused"
