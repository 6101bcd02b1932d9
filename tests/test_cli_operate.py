"""The operating commands on both stores: retry, fork, purge, start, and the list's
time filters; bad input changes nothing (an instance another runtime runs:
``test_cli_live``)."""

from __future__ import annotations

import json
import os
import secrets
from typing import TYPE_CHECKING, Any

import trio

import phronomy
from cli_targets import refused, run_cli
from failing_orders import FAILING, FLOW
from phronomy._cli_output import iso
from phronomy.storage import InboxOp
from polling import until

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    import pytest


def test_retry_fork_purge_and_time_filters(
    target: tuple[str, Callable[[], Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    db, make = target

    async def runtime(body: Callable[[Any, Any], Any], *, serving: bool) -> Any:
        store = make()
        try:
            async with phronomy.open_runtime(
                store=store, workflows=[FLOW] if serving else (), sweep_interval=0
            ) as rt:
                return await body(rt, store)
        finally:
            store.close()

    async def setup(rt: Any, store: Any) -> None:
        for iid in ("o-1", "o-2"):
            await rt.workflows.invoke(FLOW, workflow_instance_id=iid)

    def status_of(iid: str, wanted: str) -> Callable[[Any, Any], Any]:
        async def wait(rt: Any, store: Any) -> Any:
            def done() -> bool:
                row = store.load(iid)
                return row is not None and row.status == wanted

            await until(done, limit=10)
            return store.load(iid)

        return wait

    trio.run(lambda: runtime(setup, serving=False))
    assert run_cli(capsys, "instances", "list", "--db", db, "--since", "1h")[0] == 0
    FAILING["on"] = True
    send = ["instances", "send", "--db", db, "o-1", "approve", "--json"]
    status, out, _ = run_cli(capsys, *send, "--payload", '{"by": "ops"}')
    assert status == 0
    assert json.loads(out)["status"] == "pending"
    failed = trio.run(lambda: runtime(status_of("o-1", "failed"), serving=True))
    assert failed.revision == 1

    # bad input to retry and fork: one line, exit 1, nothing changes
    before = run_cli(capsys, "instances", "list", "--db", db, "--json")[1]
    assert "is halted, not failed" in refused(
        capsys, "instances", "retry", "--db", db, "o-2"
    )
    assert "does not exist" in refused(capsys, "instances", "retry", "--db", db, "x")
    fork = ["instances", "fork", "--db", db, "o-2", "--new-id"]
    assert "exists already" in refused(capsys, *fork, "o-1")
    assert "revision 7 of 'o-2' is not in its history" in refused(
        capsys, *fork, "o-3", "--revision", "7"
    )
    assert "--new-id: workflow_instance_id is required" in refused(capsys, *fork, "")
    assert "reserved" in refused(capsys, *fork, "agent:x")
    assert "does not exist" in refused(
        capsys, "instances", "fork", "--db", db, "../x", "--new-id", "y"
    )
    purge = ["instances", "purge", "--db", db, "--older-than"]
    assert "is not a duration" in refused(capsys, *purge, "7 days")
    assert "--since 'yesterday' is neither" in refused(
        capsys, "instances", "list", "--db", db, "--since", "yesterday"
    )
    assert "has no UTC offset" in refused(
        capsys, "instances", "list", "--db", db, "--until", "2026-01-01T00:00:00"
    )
    assert run_cli(capsys, "instances", "list", "--db", db, "--json")[1] == before

    # retry: halted at its last good revision, the failed event stored again
    FAILING["on"] = False
    status, out, _ = run_cli(capsys, "instances", "retry", "--db", db, "o-1", "--json")
    assert status == 0
    retried = json.loads(out)
    assert retried["updated_at"] == iso(retried.pop("updated_at_ms"))
    del retried["updated_at"]
    assert retried == {
        "event": "approve",
        "id": "o-1",
        "revision": 1,
        "status": "halted",
    }
    status, out, _ = run_cli(capsys, "instances", "retry", "--db", db, "o-1")
    assert "is halted, not failed" in _  # retried once: halted now
    done = trio.run(lambda: runtime(status_of("o-1", "finished"), serving=True))
    assert done.revision == 2

    # fork: a new instance at the state and phase of o-2's current revision
    status, out, _ = run_cli(capsys, *fork, "o-3", "--revision", "1", "--json")
    assert status == 0
    assert json.loads(out)["status"] == "halted"
    send3 = ["instances", "send", "--db", db, "o-3", "approve"]
    assert run_cli(capsys, *send3, "--payload", '{"by": "fork"}')[0] == 0
    forked = trio.run(lambda: runtime(status_of("o-3", "finished"), serving=True))
    assert forked.revision == 2

    # list's time filters (ISO times and durations)
    status, out, _ = run_cli(capsys, "instances", "list", "--db", db, "--since", "1h")
    assert [line.split()[0] for line in out.splitlines()] == ["ID", "o-1", "o-2", "o-3"]
    status, out, _ = run_cli(
        capsys, "instances", "list", "--db", db, "--until", "2000-01-01T00:00:00Z"
    )
    assert out.splitlines() == [out.splitlines()[0]]  # only the header
    status, out, _ = run_cli(capsys, "instances", "list", "--db", db, "--until", "1h")
    assert len(out.splitlines()) == 1

    # purge: the closed ones older than the cutoff, with their history and inbox
    status, out, _ = run_cli(capsys, *purge, "1d")
    assert status == 0
    assert out.splitlines()[-1] == "0 instances deleted"
    status, out, _ = run_cli(capsys, *purge, "0s", "--dry-run", "--json")
    assert sorted(json.loads(x)["id"] for x in out.splitlines()) == ["o-1", "o-3"]
    status, out, _ = run_cli(capsys, *purge, "0s")
    assert out.splitlines()[-1] == "2 instances deleted"
    store = make()
    try:
        assert store.load("o-1") is None
        assert store.history("o-1") == []
        assert store.run(InboxOp(workflow_instance_id="o-1", pending_only=False)) == ()
        assert store.load("o-2") is not None  # halted: kept
    finally:
        store.close()
    assert "does not exist" in refused(
        capsys, "instances", "history", "--db", db, "o-1"
    )

    # a purged id can be started again: a new instance
    async def again(rt: Any, store: Any) -> Any:
        return await rt.workflows.invoke(FLOW, workflow_instance_id="o-1")

    trio.run(lambda: runtime(again, serving=False))
    status, out, _ = run_cli(
        capsys, "instances", "history", "--db", db, "o-1", "--json"
    )
    assert [json.loads(x)["revision"] for x in out.splitlines()] == [1]


def test_hostile_input_to_new_commands_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "none.db")
    for argv in (
        ["instances", "retry", "--db", db, "x"],
        ["instances", "fork", "--db", db, "x", "--new-id", "y"],
        ["instances", "purge", "--db", db, "--older-than", "1d"],
        ["instances", "cancel", "--db", db, "x"],
    ):
        assert "does not exist" in refused(capsys, *argv)
    assert not os.path.exists(db)


FLOWS_MODULE = """
import phronomy


class Ticket(phronomy.State):
    title: str = ""


flow = (
    phronomy.Workflow(Ticket, name="tickets")
    .wait_state("open")
    .initial("open")
    .transition("open", phronomy.FINISH, on="close")
    .build()
)
not_a_flow = 3
"""


def _your_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, prefix: str
) -> str:
    """A module of *source* (its name, starting with *prefix*: unique per test) in a
    directory the test then runs in: code of yours that a command names."""
    home = tmp_path / "app"
    home.mkdir(exist_ok=True)
    module = f"{prefix}_{secrets.token_hex(4)}"
    (home / f"{module}.py").write_text(source)
    monkeypatch.chdir(home)
    return module


def test_start_runs_the_first_segment_of_a_definition_in_your_code(
    target: tuple[str, Callable[[], Any]],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    db, make = target
    module = _your_code(tmp_path, monkeypatch, FLOWS_MODULE, "cli_flows")
    store = make()
    store.open()  # a database a runtime created
    store.close()
    start = ["instances", "start", "--db", db, f"{module}:flow"]
    status, out, err = run_cli(capsys, *start, "t-1", "--input", '{"title": "x"}')
    assert status == 0, err
    header, row, said = out.splitlines()
    assert header.split() == [
        "ID", "WORKFLOW", "STATUS", "REV", "PHASE", "UPDATED", "DETAIL"
    ]  # fmt: skip
    assert row.split()[:5] == ["t-1", "tickets", "halted", "1", "open"]
    assert row.split()[5].endswith("Z")
    assert said == "t-1: started (halted at revision 1, phase open)"
    status, out, _ = run_cli(capsys, "instances", "show", "--db", db, "t-1", "--json")
    assert json.loads(out)["fields"] == {"title": "x"}
    before = run_cli(capsys, "instances", "list", "--db", db, "--json")[1]
    for argv, message in (
        ([*start, "t-1"], "exists and is halted"),
        ([*start, "t-2", "--input", "{oops"], "--input is not JSON"),
        ([*start, "t-2", "--input", "[1]"], "must be a JSON object"),
        ([*start, "t-2", "--input", '{"title": 5}'], "title"),
        ([*start, "t\n2"], "control characters"),
        (["instances", "start", "--db", db, "flow", "t-2"], "module:attribute"),
        (["instances", "start", "--db", db, "no_such_mod:flow", "t-2"], "import"),
        (["instances", "start", "--db", db, f"{module}:not_a_flow", "t-2"], "not a"),
    ):
        assert message in refused(capsys, *argv), argv
    assert run_cli(capsys, "instances", "list", "--db", db, "--json")[1] == before


ESCALATING_MODULE = """
from datetime import timedelta

import phronomy


class Claim(phronomy.State):
    notes: list[str] = []


flow = (
    phronomy.Workflow(Claim, name="claims")
    .wait_state("awaiting")
    .wait_state("reviewing")
    .wait_state("escalated")
    .initial("awaiting")
    .transition("awaiting", "escalated", after=timedelta(days=2))
    .transition(
        "awaiting", "reviewing", on="review",
        action=lambda s: s.merge(notes=[*s.notes, "reviewed"]),
    )
    .transition("reviewing", phronomy.FINISH, on="close")
    .transition("escalated", phronomy.FINISH, on="close")
    .build()
)
"""


def test_fork_starts_from_any_revision_of_the_history_with_its_timeouts(
    target: tuple[str, Callable[[], Any]],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before: only the current revision could be forked ("the store keeps the state
    # of the current revision only"), and a fork armed no timer: one at a state with
    # a timeout never escalated.
    from phronomy.storage import TimersOp

    db, make = target
    module = _your_code(tmp_path, monkeypatch, ESCALATING_MODULE, "cli_claims")
    store = make()
    store.open()
    store.close()
    start = ["instances", "start", "--db", db, f"{module}:flow", "c-1"]
    assert run_cli(capsys, *start)[0] == 0  # halted at awaiting, its timeout armed
    review = ["instances", "send", "--db", db, "c-1", "review"]
    assert run_cli(capsys, *review)[0] == 0

    async def serve() -> None:
        runtime_store = make()
        try:
            flow = __import__(module).flow
            async with phronomy.open_runtime(
                store=runtime_store, workflows=[flow], sweep_interval=0
            ):
                await until(
                    lambda: getattr(runtime_store.load("c-1"), "revision", 0) == 2, 10
                )
        finally:
            runtime_store.close()

    trio.run(serve)  # c-1 reviewed: revision 2, at reviewing, no timeout armed
    fork = ["instances", "fork", "--db", db, "c-1", "--json", "--new-id"]
    status, out, err = run_cli(capsys, *fork, "c-2", "--revision", "1")
    assert status == 0, err
    forked = json.loads(out)
    assert "c-2 has no timeout armed" in forked["warning"]
    assert "--app MODULE:ATTR" in forked["warning"]
    assert err == ""  # --json: the warning is in the object
    assert (forked["source_revision"], forked["status"], forked["timeouts"]) == (
        1,
        "halted",
        [],  # the source no longer has awaiting's timeout: without --app, none
    )
    status, out, err = run_cli(
        capsys, *fork, "c-3", "--revision", "1", "--app", f"{module}:flow"
    )
    assert status == 0, err
    assert json.loads(out)["timeouts"] == ["after:172800000:awaiting"]
    assert json.loads(out)["warning"] is None  # armed from the definition
    human = ["instances", "fork", "--db", db, "c-1", "--new-id", "c-5"]
    status, out, err = run_cli(capsys, *human, "--revision", "1")
    assert status == 0, err
    assert err.startswith("phronomy: warning: c-5 has no timeout armed")
    status, out, _ = run_cli(capsys, "instances", "show", "--db", db, "c-3", "--json")
    shown = json.loads(out)
    assert (shown["phase"], shown["fields"]) == ("awaiting", {"notes": []})
    status, out, _ = run_cli(capsys, "instances", "show", "--db", db, "c-1", "--json")
    assert json.loads(out)["fields"] == {"notes": ["reviewed"]}  # the source's now
    opened = make()
    try:
        (timer,) = opened.run(TimersOp(workflow_instance_id="c-3"))
        assert (timer.name, timer.kind, timer.state) == (
            "after:172800000:awaiting",
            "timeout",
            "awaiting",
        )
        assert timer.due_at_ms - timer.armed_at_ms == 172_800_000
    finally:
        opened.close()
    before = run_cli(capsys, "instances", "list", "--db", db, "--json")[1]
    tickets = _your_code(tmp_path, monkeypatch, FLOWS_MODULE, "cli_tickets")
    for argv, message in (
        ([*fork, "c-4", "--revision", "9"], "revisions that can be forked: [1, 2]"),
        ([*fork, "c-4", "--app", f"{tickets}:flow"], "is workflow 'tickets', but"),
        ([*fork, "c-4", "--app", "no_such_module:flow"], "cannot import module"),
        ([*fork, "c-4", "--app", f"{module}:nothing"], "not a compiled workflow"),
    ):
        assert message in refused(capsys, *argv), argv
    assert run_cli(capsys, "instances", "list", "--db", db, "--json")[1] == before
