"""The operators' command line: what it shows, what it refuses, and what it never changes."""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import trio

import phronomy
from legacy_records import ExecutionRecord, record_request
from phronomy import _cli_commands as commands_module
from phronomy._cli_output import iso
from phronomy._cli_store import open_store
from phronomy.cli import EXIT_BROKEN_PIPE, main
from phronomy.storage import SaveOp, SaveRequest, encode_snapshot
from polling import until

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    OpenSQLite = Callable[..., phronomy.SQLiteStore]

FIXTURES = Path(__file__).parent / "fixtures"
ONE_ERROR_LINE = re.compile(r"phronomy: error: [^\n]+\n")


def _cells(out: str) -> list[list[str]]:
    """The rows of a table the CLI printed (columns are two or more spaces apart)."""
    return [re.split(r"  +", line) for line in out.splitlines()]


def _save(iid: str, *, workflow: str = "wf", status: str = "halted") -> SaveOp:
    return SaveOp(
        request=SaveRequest(
            workflow_instance_id=iid,
            expected_revision=None,
            snapshot=encode_snapshot(
                {"n": 1},
                workflow_instance_id=iid,
                revision=1,
                phase="p",
                workflow=workflow,
            ),
            write_id=f"w-{iid}",
            status=status,  # type: ignore[arg-type]
            phase="p",
            workflow=workflow,
        )
    )


def _execution(agent: str, status: str = "active") -> SaveOp:
    record = ExecutionRecord(execution_id=f"e-{agent}", status=status)  # type: ignore[arg-type]
    return SaveOp(request=record_request(agent, record, None))


def _phronomy(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "phronomy", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# --- supervised executions' records are not workflow instances -------------------------


def _fill_mixed(store: phronomy.SQLiteStore | phronomy.PostgresStore) -> None:
    """Workflow rows around 600 execution records (they sort between a-* and b-*)."""
    ops = [_save("a-0"), _save("a-1"), _save("b-0"), _save("b-1", status="failed")]
    ops += [_execution(f"{n:03d}", "completed") for n in range(600)]
    ops += [_execution("crashed")]
    assert all(r.unwrap().outcome == "success" for r in store.execute(ops))
    store.mark(
        "agent:stuck", "recovery_required", create=True, workflow="phronomy.execution"
    )
    store.close()


def _reader(db: str) -> phronomy.SQLiteStore | phronomy.PostgresStore:
    return open_store(db, read_only=True)


@pytest.fixture
def mixed_sqlite_db(open_sqlite: OpenSQLite, tmp_path: Path) -> str:
    """The mixed rows in an SQLite file."""
    db = str(tmp_path / "mixed.db")
    _fill_mixed(open_sqlite(db))
    return db


@pytest.fixture(scope="module")
def mixed_pg_db(postgres_dsn: str) -> Iterator[str]:
    """The mixed rows in a schema of the PostgreSQL server, shared by this module's
    tests (they change none of them, except for cancelling b-0)."""
    import psycopg

    schema = f"test_cli_{secrets.token_hex(6)}"
    _fill_mixed(phronomy.PostgresStore(postgres_dsn, schema=schema))
    sep = "&" if "?" in postgres_dsn else "?"
    yield f"{postgres_dsn}{sep}options=-csearch_path%3D{schema}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture(params=["sqlite", "postgres"])
def mixed_db(request: pytest.FixtureRequest) -> str:
    """The mixed rows in an SQLite file, or in a schema of the PostgreSQL server."""
    name = "mixed_sqlite_db" if request.param == "sqlite" else "mixed_pg_db"
    db: str = request.getfixturevalue(name)
    return db


def test_instances_list_skips_execution_records_and_keeps_pages_full(
    mixed_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: the executions were rows `agent:<id>` of workflow phronomy.execution.
    assert main(["instances", "list", "--db", mixed_db]) == 0
    rows = _cells(capsys.readouterr().out)
    assert [r[0] for r in rows] == ["ID", "a-0", "a-1", "b-0", "b-1"]
    # a page of 3 is full although 600 execution records lie between a-1 and b-0
    assert main(["instances", "list", "--db", mixed_db, "--limit", "3"]) == 0
    rows = _cells(capsys.readouterr().out)
    assert [r[0] for r in rows] == [
        "ID",
        "a-0",
        "a-1",
        "b-0",
        "... more: add --after b-0",
    ]
    assert main(["instances", "list", "--db", mixed_db, "--after", "b-0"]) == 0
    assert [r[0] for r in _cells(capsys.readouterr().out)] == ["ID", "b-1"]
    # the page ends where the workflow rows end: no next page of execution records
    assert main(["instances", "list", "--db", mixed_db, "--limit", "2"]) == 0
    assert [r[0] for r in _cells(capsys.readouterr().out)][
        -1
    ] == "... more: add --after a-1"
    assert main(["instances", "list", "--db", mixed_db, "--limit", "4", "--json"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["workflow_instance_id"] for x in lines] == ["a-0", "a-1", "b-0", "b-1"]
    for status, expected in (
        ("running", []),
        ("recovery_required", []),
        ("failed", ["b-1"]),
    ):
        argv = ["instances", "list", "--db", mixed_db, "--status", status, "--json"]
        assert main(argv) == 0
        listed = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
        assert [x["workflow_instance_id"] for x in listed] == expected
    argv = ["instances", "list", "--db", mixed_db, "--workflow", "phronomy.execution"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert ONE_ERROR_LINE.fullmatch(err)
    assert "`python -m phronomy executions list --db" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["show"],
        ["history"],
        ["cancel", "--force"],
        ["resolve", "adopt"],
        ["resolve", "release"],
    ],
    ids=lambda argv: "-".join(argv),
)
@pytest.mark.parametrize("agent", ["crashed", "stuck"])
def test_single_instance_commands_refuse_execution_records(
    mixed_db: str,
    open_sqlite: OpenSQLite,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    agent: str,
) -> None:
    # Before: `instances cancel agent:<id>` wrote a cancelled revision onto the record.
    key = f"agent:{agent}"
    reader = _reader(mixed_db)
    before = reader.load(key)
    reader.close()
    action, *rest = argv
    assert main(["instances", action, "--db", mixed_db, key, *rest]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert ONE_ERROR_LINE.fullmatch(captured.err)
    assert "is the record of a supervised execution" in captured.err
    shown = shlex.quote(mixed_db)
    assert f"`python -m phronomy executions show --db {shown} {agent}`" in captured.err
    reader = _reader(mixed_db)
    assert reader.load(key) == before
    reader.close()


def test_executions_commands_refuse_a_workflow_instance_under_an_agent_key(
    open_sqlite: OpenSQLite, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "keys.db")
    store = open_sqlite(db)
    store.execute([_save("agent:w", workflow="wf")])
    store.close()
    for action, *rest in (["show"], ["resolve", "release"]):
        assert main(["executions", action, "--db", db, "w", *rest]) == 1
        err = capsys.readouterr().err
        assert ONE_ERROR_LINE.fullmatch(err)
        assert "is a workflow instance of 'wf', not an execution record" in err
    assert main(["instances", "show", "--db", db, "agent:w"]) == 0


# --- what the output looks like ----------------------------------------------------------


def test_times_are_iso_8601_utc() -> None:
    assert iso(1_796_115_975_123) == "2026-12-01T09:06:15.123Z"
    assert iso(0) == "1970-01-01T00:00:00.000Z"
    assert iso(-1) == "1969-12-31T23:59:59.999Z"
    assert iso(None) is None
    assert iso(2**62) == f"{2**62} ms"  # a damaged row: shown, not a crash


def test_json_keeps_milliseconds_and_adds_iso_times(
    mixed_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["instances", "list", "--db", mixed_db, "--limit", "1", "--json"]) == 0
    row = json.loads(capsys.readouterr().out.splitlines()[0])
    assert isinstance(row["updated_at_ms"], int)
    assert row["updated_at"] == iso(row["updated_at_ms"])
    assert row["lease_expires_at"] is None
    assert main(["instances", "history", "--db", mixed_db, "a-0", "--json"]) == 0
    (entry,) = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert entry["committed_at"] == iso(entry["committed_at_ms"])
    for status, agents in (("active", ["crashed"]), ("recovery_required", ["stuck"])):
        argv = ["executions", "list", "--db", mixed_db, "--status", status, "--json"]
        assert main(argv) == 0
        listed = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
        assert [s["agent_id"] for s in listed] == agents
        assert all(s["updated_at"] == iso(s["updated_at_ms"]) for s in listed)
    assert main(["instances", "show", "--db", mixed_db, "a-0", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["updated_at"] == iso(shown["updated_at_ms"])
    assert main(["executions", "show", "--db", mixed_db, "crashed", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["updated_at"] == iso(shown["updated_at_ms"])


def test_a_closed_stdout_ends_quietly(mixed_sqlite_db: str, tmp_path: Path) -> None:
    mixed_db = mixed_sqlite_db
    # Before: a BrokenPipeError traceback (and "Exception ignored ... stdout").
    for argv in (
        ["instances", "show", "--db", mixed_db, "a-0"],
        ["instances", "list", "--db", mixed_db, "--json"],
        ["executions", "list", "--db", mixed_db],
    ):
        proc = subprocess.Popen(
            [sys.executable, "-m", "phronomy", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        proc.stdout.close()  # nobody reads: the first write meets a closed pipe
        _, err = proc.communicate(timeout=60)
        assert (proc.returncode, err) == (EXIT_BROKEN_PIPE, "")
    # `| head -n 1` on a listing longer than the pipe's buffer
    store = phronomy.SQLiteStore(tmp_path / "long.db")
    store.execute([_save(f"instance-{n:05d}") for n in range(2000)])
    store.close()
    done = subprocess.run(
        "set -o pipefail; "
        f"{sys.executable} -m phronomy instances list --db long.db --limit 2000 "
        "2>err.txt | head -n 1",
        shell=True,
        executable="/bin/bash",
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.stdout.split() == [
        "ID",
        "WORKFLOW",
        "STATUS",
        "REV",
        "PHASE",
        "UPDATED",
        "LEASE",
        "DETAIL",
    ]
    assert (tmp_path / "err.txt").read_text() == ""
    assert done.returncode == EXIT_BROKEN_PIPE


# --- hostile input ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "limit", ["9223372036854775807", "10001", "0", "-1", "1e3", "x"]
)
def test_limits_are_bounded(
    mixed_sqlite_db: str, capsys: pytest.CaptureFixture[str], limit: str
) -> None:
    # Before: --limit 9223372036854775807 printed an OverflowError traceback.
    mixed_db = mixed_sqlite_db
    for argv in (
        ["instances", "list", "--db", mixed_db, "--limit", limit],
        ["instances", "history", "--db", mixed_db, "a-0", "--limit", limit],
    ):
        with pytest.raises(SystemExit) as caught:
            main(argv)
        assert caught.value.code == 2
        err = capsys.readouterr().err
        assert "argument --limit:" in err
        assert limit in err
        assert "Traceback" not in err
    assert main(["instances", "list", "--db", mixed_db, "--limit", "10000"]) == 0


@pytest.mark.parametrize(
    "argv",
    [
        ["instances", "list"],
        ["instances", "show", "x"],
        ["instances", "cancel", "x"],
        ["executions", "resolve", "a", "release"],
        ["migrate"],
        ["demo"],
    ],
    ids=lambda argv: "-".join(argv[:2]),
)
def test_a_db_that_is_not_a_regular_file_is_refused_at_once(
    tmp_path: Path, argv: list[str]
) -> None:
    # Before: --db naming a FIFO hung (SQLite waited for a writer to open the pipe).
    fifo = tmp_path / "pipe.db"
    os.mkfifo(fifo)
    for path, kind in (
        (fifo, "FIFO"),
        (tmp_path, "directory"),
        (Path(os.devnull), "character device"),
    ):
        done = _phronomy(*argv[:2], "--db", str(path), *argv[2:], timeout=30)
        assert done.returncode == 1, done.stderr
        assert ONE_ERROR_LINE.fullmatch(done.stderr)
        assert f"{str(path)!r} is a {kind}" in done.stderr
    assert not list(tmp_path.glob("pipe.db-*"))


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize(
    "argv",
    [
        ["instances", "cancel", "halted-1"],
        ["instances", "cancel", "missing"],
        ["instances", "resolve", "recovery-1", "adopt"],
        ["executions", "resolve", "agent-1", "release"],
        ["instances", "list"],
        ["instances", "show", "halted-1"],
        ["executions", "list"],
    ],
    ids=lambda argv: "-".join(argv[:3]),
)
def test_only_migrate_migrates_an_earlier_release_s_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], version: int, argv: list[str]
) -> None:
    # Before: cancel and resolve migrated the file first, even when they then failed.
    db = tmp_path / f"v{version}.db"
    shutil.copy(FIXTURES / f"schema_v{version}.db", db)
    before = db.read_bytes()
    assert main([*argv[:2], "--db", str(db), *argv[2:]]) == 1
    err = capsys.readouterr().err
    assert ONE_ERROR_LINE.fullmatch(err)
    assert f"schema version {version} of an earlier release" in err
    assert f"`python -m phronomy migrate --db {db}`" in err
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [db.name]
    assert main(["migrate", "--db", str(db)]) == 0
    assert db.read_bytes() != before


def test_writing_commands_keep_the_database_s_settings(
    open_sqlite: OpenSQLite, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: every writing command opened the file like a runtime, resetting the
    # database's save_log_depth to the default.
    db = str(tmp_path / "deep.db")
    store = open_sqlite(db, save_log_depth=5)
    store.execute([_save("x")])
    store.close()
    assert main(["instances", "cancel", "--db", db, "x"]) == 0
    assert main(["instances", "cancel", "--db", db, "missing"]) == 1
    capsys.readouterr()
    raw = sqlite3.connect(db)
    try:
        (depth,) = raw.execute(
            "SELECT value FROM phronomy_settings WHERE name = 'save_log_depth'"
        ).fetchone()
    finally:
        raw.close()
    assert depth == 5


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["instances", "show", "nope"], "workflow instance 'nope' does not exist"),
        (["instances", "history", "nope"], "workflow instance 'nope' does not exist"),
        (["instances", "cancel", "nope"], "workflow instance 'nope' does not exist"),
        (
            ["instances", "resolve", "nope", "adopt"],
            "workflow instance 'nope' does not exist",
        ),
        (["instances", "resolve", "a-0", "adopt"], "does not require recovery"),
        (["instances", "cancel", "b-0", "--force"], "already cancelled"),
        (["executions", "show", "nope"], "agent 'nope' has no execution record"),
        (["executions", "resolve", "000", "adopt"], "does not require recovery"),
    ],
)
def test_every_error_is_one_line(
    mixed_db: str, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    if message == "already cancelled":  # not an error: said on stdout
        main(["instances", "cancel", "--db", mixed_db, "b-0"])  # PG: done before
        capsys.readouterr()
    status = main([*argv[:2], "--db", mixed_db, *argv[2:]])
    captured = capsys.readouterr()
    if message == "already cancelled":
        assert (status, captured.out, captured.err) == (
            0,
            "b-0: already cancelled\n",
            "",
        )
        return
    assert status == 1
    assert ONE_ERROR_LINE.fullmatch(captured.err)
    assert message in captured.err


def test_an_interrupt_is_one_line_and_status_130(
    mixed_sqlite_db: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def interrupted(*_: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(commands_module, "listing", interrupted)
    assert main(["instances", "list", "--db", mixed_sqlite_db]) == 130
    assert capsys.readouterr().err == "phronomy: error: interrupted\n"


# --- instances send: an event from the command line ------------------------------------


def test_instances_send_stores_an_event_a_serving_runtime_applies_once(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    db = str(tmp_path / "orders.db")
    flow = (
        phronomy.Workflow(_Order, name="orders")
        .wait_state("awaiting")
        .initial("awaiting")
        .transition(
            "awaiting",
            phronomy.FINISH,
            on="approve",
            action=lambda s, e: s.merge(by=e.payload["by"]),
        )
        .build()
    )

    async def run(serving: bool) -> phronomy.storage.StoredRecord | None:
        store = phronomy.SQLiteStore(db)
        try:
            async with phronomy.open_runtime(
                store=store, workflows=[flow] if serving else ()
            ) as rt:
                if not serving:
                    await rt.workflows.invoke(flow, workflow_instance_id="o-1")
                    return None

                def finished() -> bool:
                    row = store.load("o-1")
                    return row is not None and row.status == "finished"

                await until(finished, limit=10)  # the poll resumes it
                return store.load("o-1")
        finally:
            store.close()

    trio.run(run, False)
    send = ["instances", "send", "--db", db, "o-1", "approve"]
    assert main([*send, "--payload", '{"by": "ops"}', "--event-id", "cli-1"]) == 0
    out = capsys.readouterr().out
    assert "o-1: event 'approve' stored as seq 1 (event id cli-1)" in out
    assert "a runtime serving workflow 'orders' applies it" in out
    assert main(["instances", "show", "--db", db, "o-1", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [(e["seq"], e["event"], e["event_id"]) for e in shown["pending_events"]] == [
        (1, "approve", "cli-1")
    ]
    note = shown["pending_events_note"]
    assert "serves workflow 'orders' applies them at its next poll" in note
    monkeypatch.setattr(commands_module, "SETTLING_S", 0)  # as if it waited long
    assert main(["instances", "show", "--db", db, "o-1", "--json"]) == 0
    note = json.loads(capsys.readouterr().out)["pending_events_note"]
    assert "no live runtime serves workflow 'orders': the oldest has waited" in note
    # bad input stores nothing
    assert main([*send, "--payload", "{not json"]) == 1
    assert "--payload is not JSON" in capsys.readouterr().err
    assert main([*send, "--event-id", "x" * 300]) == 1
    assert "event_id" in capsys.readouterr().err
    assert main([*send, "--payload", json.dumps("x" * (1 << 20))]) == 1
    assert "the limit is 1048576" in capsys.readouterr().err
    row = trio.run(run, True)  # a runtime that serves the workflow applies it
    assert row is not None
    assert (row.status, row.revision) == ("finished", 2)
    assert main([*send, "--payload", '{"by": "ops"}', "--event-id", "cli-1"]) == 0
    assert "already stored (transitioned) as seq 1" in capsys.readouterr().out
    assert main([*send, "--payload", '{"by": "ops"}']) == 1  # a new one: closed
    assert "is finished (revision 2): it accepts no events" in capsys.readouterr().err
    store = phronomy.SQLiteStore(db)
    try:
        entries = store.run(
            phronomy.storage.InboxOp(workflow_instance_id="o-1", pending_only=False)
        )
    finally:
        store.close()
    assert [(e.event_id, e.status, e.revision) for e in entries] == [
        ("cli-1", "transitioned", 2)
    ]
    # the history: the event just below the save that consumed it
    assert main(["instances", "history", "--db", db, "o-1", "--json"]) == 0
    items = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(i.get("kind", "save"), i["revision"], i["status"]) for i in items] == [
        ("save", 2, "finished"),
        ("event", 2, "transitioned"),
        ("save", 1, "halted"),
    ]
    assert (items[1]["event_id"], items[1]["payload"]) == ("cli-1", '{"by":"ops"}')
    assert items[1]["stored_at"].endswith("Z")
    assert items[1]["consumed_at"].endswith("Z")
    assert main(["instances", "history", "--db", db, "o-1"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert [r[:4] for r in rows[1:]] == [
        ["2", "save", "finished", "__end__"],
        ["2", "event", "1", "transitioned"],
        ["1", "save", "halted", "awaiting"],
    ]
    assert 'payload {"by":"ops"}' in " ".join(rows[2])


def test_instances_show_says_an_expired_holder_no_longer_applies_events(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "held.db")
    store = phronomy.SQLiteStore(db)
    try:
        store.begin("h-1", "orders", lease_owner="vm:1:dead", ttl_ms=60_000)
        posting = phronomy.storage.Posting(
            workflow_instance_id="h-1", event_id="e1", event="approve", payload=b"1"
        )
        assert store.run(phronomy.storage.PostOp(posting=posting)).outcome == "stored"
    finally:
        store.close()
    assert main(["instances", "show", "--db", db, "h-1", "--json"]) == 0
    note = json.loads(capsys.readouterr().out)["pending_events_note"]
    assert note == "the runtime holding the instance (vm:1:dead) applies them"
    store = phronomy.SQLiteStore(db)
    try:  # the holder died: its lease runs out
        store.begin("h-1", "orders", lease_owner="vm:1:dead", ttl_ms=1)
    finally:
        store.close()
    time.sleep(0.01)
    assert main(["instances", "show", "--db", db, "h-1", "--json"]) == 0
    note = json.loads(capsys.readouterr().out)["pending_events_note"]
    assert note.startswith("the lease of vm:1:dead expired: a live runtime's recovery")


class _Order(phronomy.State):
    by: str = ""


class _Job(phronomy.State):
    n: int = 0


def _job_flow() -> phronomy.WorkflowDefinition[_Job]:
    wf = phronomy.Workflow(_Job, name="job")
    wf.state("run", entry=lambda s: s.merge(n=s.n + 1))
    wf.transition("run", phronomy.FINISH)
    return wf.build()


async def test_schedules_commands_edit_what_a_serving_runtime_carries_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "schedules.db")
    flow = _job_flow()
    async with phronomy.open_runtime(store=phronomy.SQLiteStore(db)) as rt:
        await rt.schedules.create(
            "nightly", flow, cron="0 3 * * *", timezone="Europe/Berlin", input={"n": 2}
        )
        await rt.schedules.create("hourly", flow, every=3600)
    capsys.readouterr()
    assert main(["schedules", "list", "--db", db]) == 0
    rows = _cells(capsys.readouterr().out)
    assert rows[0][:3] == ["ID", "WORKFLOW", "WHEN"]
    assert [r[0] for r in rows[1:]] == ["hourly", "nightly"]
    assert rows[2][2] == "cron 0 3 * * *"
    assert main(["schedules", "pause", "nightly", "--note", "db move", "--db", db]) == 0
    assert capsys.readouterr().out == "nightly: paused\n"
    assert main(["schedules", "show", "nightly", "--db", db, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["paused"], shown["note"], shown["input"]) == (
        True,
        "db move",
        {"n": 2},
    )
    assert len(shown["upcoming"]) == 5
    assert shown["upcoming"][0].endswith(("T02:00:00Z", "T01:00:00Z"))  # 03:00 Berlin
    assert main(["schedules", "trigger", "hourly", "--db", db]) == 0
    triggered = capsys.readouterr().out.split()[-1]
    assert triggered.startswith("hourly@")
    start = "2026-11-30T00:00Z"
    argv = ["schedules", "backfill", "hourly", "--start", start, "--end"]
    assert main([*argv, "2026-11-30T03:00Z", "--db", db]) == 0
    assert "3 ticks" in capsys.readouterr().out
    assert main([*argv, "2026-11-30T03:00", "--db", db]) == 1  # no offset
    assert "has no UTC offset" in capsys.readouterr().err
    assert main(["schedules", "delete", "nope", "--db", db]) == 1
    assert "no schedule 'nope'" in capsys.readouterr().err
    with phronomy.SQLiteStore(db, read_only=True) as store:
        assert store.load(triggered) is None  # no runtime served it yet
    store = phronomy.SQLiteStore(db)
    async with phronomy.open_runtime(store=store, workflows=[flow]):
        expected = [triggered] + [f"hourly@2026-11-30T0{h}:00:00Z" for h in range(3)]
        await until(
            lambda: all(
                (row := store.load(iid)) is not None and row.status == "finished"
                for iid in expected
            )
        )
    assert main(["schedules", "delete", "hourly", "--db", db]) == 0
    assert "deleted" in capsys.readouterr().out
