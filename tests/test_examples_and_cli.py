"""Every example runs; the CLI's demo (the README's main job) and operator commands work."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import phronomy
from legacy_records import ExecutionRecord, record_request
from phronomy.cli import build_parser, main
from phronomy.storage import SCHEMA_VERSION, SaveRequest, encode_snapshot

if TYPE_CHECKING:
    from collections.abc import Callable

ROOT = Path(__file__).parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


def _cells(out: str) -> list[list[str]]:
    """The rows of a table the CLI printed (columns are two or more spaces apart)."""
    return [re.split(r"  +", line) for line in out.splitlines()]


_ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def _run(*args: str, cwd: Path | None = None) -> str:
    done = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs(example: Path, tmp_path: Path) -> None:
    output = _run(str(example), cwd=tmp_path)
    expected = {
        "order_approval": "finished: approved=True",
        "durable_orders": "order-1 __end__ at revision 2, approved by alice",
        "supervised_agent": "cancelled after",
        "tutorial_expenses": "exp-1 is __end__ at revision 2",
        "instance_lifecycle": "dashboard saw: running@new, halted@awaiting_payment, "
        "running@charging, cancelled@charging",
        "web_service": "o-1 finished at revision 2: paid 30, shipped by dhl",
    }[example.stem]
    assert expected in output


def test_the_readme_sample_runs_twice(tmp_path: Path) -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = text.split("```python\n")[1:]
    (sample,) = [b.split("```")[0] for b in blocks if "trio.run(main)" in b]
    (tmp_path / "sample.py").write_text(sample, encoding="utf-8")
    first = _run("sample.py", cwd=tmp_path)
    assert first.splitlines() == ["halted awaiting_approval 1", "finished 2"]
    second = _run("sample.py", cwd=tmp_path)  # the stored result, nothing runs again
    assert second.splitlines() == ["finished __end__ 2", "finished 2"]


def test_the_readme_webhook_answers_once_the_event_is_stored(tmp_path: Path) -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = [b.split("```")[0] for b in text.split("```python\n")[1:]]
    (sample,) = [b for b in blocks if "trio.run(main)" in b]
    (webhook,) = [b for b in blocks if "def approval_webhook" in b]
    check = """
async def check():
    store = phronomy.SQLiteStore("orders.db")
    async with phronomy.open_runtime(store=store, workflows=[order_flow]) as rt:
        await rt.workflows.invoke(order_flow, workflow_instance_id="order-2")
        codes = [await approval_webhook(rt, "order-2", "d-1") for _ in range(2)]
        codes.append(await approval_webhook(rt, "nobody", "d-2"))
        while (await rt.workflows.receipt("order-2", "d-1")).status == "pending":
            await trio.sleep(0.01)
        codes.append(await approval_webhook(rt, "order-2", "d-3"))
        print(codes, store.load("order-2").status, store.load("order-2").revision)

trio.run(check)
"""
    (tmp_path / "webhook.py").write_text(sample + webhook + check, encoding="utf-8")
    out = _run("webhook.py", cwd=tmp_path).splitlines()
    # a retry of the same delivery is a repeat (202, applied once); an unknown order
    # is 404; a finished one accepts no new event (409)
    assert out[-1] == "[202, 202, 404, 409] finished 2"


def test_demo_survives_the_process(tmp_path: Path) -> None:
    first = _run("-m", "phronomy", "demo", "--db", "demo.db", cwd=tmp_path)
    assert "started order-1: halted at 'awaiting_approval', revision 1" in first
    assert "approved order-1 by id from a new runtime: __end__, revision 2" in first
    second = _run("-m", "phronomy", "demo", "--db", "demo.db", cwd=tmp_path)
    assert "2 order(s) from earlier runs, 1 waiting for approval" in second
    assert (
        "approved order-2 (halted by an earlier process): __end__, revision 2" in second
    )


def test_instances_commands(
    open_sqlite: Callable[..., phronomy.SQLiteStore],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    db = str(tmp_path / "ops.db")
    store = open_sqlite(db)
    store.save(
        SaveRequest(
            workflow_instance_id="ok",
            expected_revision=None,
            snapshot=b"",
            write_id="w1",
            status="finished",
            phase="__end__",
            workflow="wf",
        )
    )
    from phronomy.storage import encode_snapshot

    class S(phronomy.State):
        x: int = 1

    blob = encode_snapshot(
        S(), workflow_instance_id="stuck", revision=1, phase="waiting", workflow="wf"
    )
    store.save(
        SaveRequest(
            workflow_instance_id="stuck",
            expected_revision=None,
            snapshot=blob,
            write_id="w2",
            status="halted",
            phase="waiting",
            workflow="wf",
        )
    )
    store.mark("stuck", "recovery_required", detail="ack lost")
    store.close()
    assert main(["instances", "list", "--db", db]) == 0
    header, ok, stuck = _cells(capsys.readouterr().out)
    assert header == [
        "ID", "WORKFLOW", "STATUS", "REV", "PHASE", "UPDATED", "LEASE", "DETAIL"
    ]  # fmt: skip
    assert ok[:5] == ["ok", "wf", "finished", "1", "__end__"]
    assert stuck[:5] + stuck[6:] == [
        "stuck", "wf", "recovery_required", "1", "waiting", "-", "ack lost"
    ]  # fmt: skip
    assert _ISO.fullmatch(stuck[5])
    assert main(["instances", "list", "--db", db, "--status", "finished"]) == 0
    assert [row[0] for row in _cells(capsys.readouterr().out)] == ["ID", "ok"]
    assert main(["instances", "show", "--db", db, "stuck"]) == 0
    assert '"x": 1' in capsys.readouterr().out
    assert main(["instances", "show", "--db", db, "missing"]) == 1
    assert capsys.readouterr().err == (
        f"phronomy: error: workflow instance 'missing' does not exist in {db!r}\n"
    )
    assert main(["instances", "resolve", "--db", db, "ok", "adopt"]) == 1
    assert main(["instances", "resolve", "--db", db, "stuck", "adopt"]) == 0
    assert "recovery_required -> halted" in capsys.readouterr().out
    assert open_sqlite(db).load("stuck").status == "halted"  # type: ignore[union-attr]


def test_operator_commands_refuse_a_missing_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: a mistyped --db silently created an empty database.
    missing = str(tmp_path / "mistyped.db")
    for argv in (
        ["instances", "list", "--db", missing],
        ["instances", "show", "--db", missing, "x"],
        ["instances", "resolve", "--db", missing, "x", "adopt"],
        ["executions", "list", "--db", missing],
        ["executions", "resolve", "--db", missing, "a", "release"],
    ):
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert err.startswith("phronomy: error: ")
        assert "does not exist" in err
        assert "Traceback" not in err
    assert not (tmp_path / "mistyped.db").exists()


def test_usage_errors_help_and_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["instances", "list", "--db", "x.db", "--limit", "0"])
    assert caught.value.code == 2
    assert "must be from 1 to 10000, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit) as caught:
        main(["--version"])
    assert caught.value.code == 0
    assert capsys.readouterr().out.strip() == f"phronomy {phronomy.__version__}"
    # every option and argument of every command explains itself
    parsers = [build_parser()]
    missing_help: list[str] = []
    while parsers:
        parser = parsers.pop()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                parsers.extend(action.choices.values())
                continue
            if not action.help:
                missing_help.append(f"{parser.prog} {action.dest}")
    assert missing_help == []


def test_listing_pages_escapes_and_corrupt_rows(
    open_sqlite: Callable[..., phronomy.SQLiteStore],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    db = str(tmp_path / "ops.db")
    store = open_sqlite(db)
    for iid, snapshot in (
        ("a\tfake\nline", b""),
        ("b-corrupt", b"{not json"),
        ("c", b""),
    ):
        store.save(
            SaveRequest(
                workflow_instance_id=iid,
                expected_revision=None,
                snapshot=snapshot,
                write_id=f"w-{iid}",
                status="halted",
                phase="p\x1b[31m",
                workflow="wf",
            )
        )
    store.close()
    assert main(["instances", "list", "--db", db, "--limit", "2"]) == 0
    out = capsys.readouterr().out
    rows = _cells(out)
    assert rows[1][:5] == ["a\\x09fake\\x0aline", "wf", "halted", "1", "p\\x1b[31m"]
    assert rows[-1] == ["... more: add --after b-corrupt"]
    assert "\x1b" not in out
    assert main(["instances", "list", "--db", db, "--after", "b-corrupt"]) == 0
    assert [row[0] for row in _cells(capsys.readouterr().out)] == ["ID", "c"]
    assert main(["instances", "show", "--db", db, "b-corrupt", "--json"]) == 1
    shown = capsys.readouterr()
    assert '"snapshot_error": "stored snapshot of workflow instance' in shown.out
    assert shown.err.startswith("phronomy: error: stored snapshot of workflow instance")
    assert shown.err.count("\n") == 1


def test_executions_commands(
    open_sqlite: Callable[..., phronomy.SQLiteStore],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    db = str(tmp_path / "agents.db")
    store = open_sqlite(db)
    store.save(
        record_request(
            "crashed", ExecutionRecord(execution_id="e-1", status="active"), None
        )
    )
    store.save(
        record_request(
            "done", ExecutionRecord(execution_id="e-2", status="completed"), None
        )
    )
    store.close()
    # rows a release before schema 7 wrote read as executions too
    assert main(["executions", "list", "--db", db]) == 0
    header, crashed, done = _cells(capsys.readouterr().out)
    assert header == ["AGENT", "STATUS", "STEP", "DONE", "PLAN", "UPDATED", "EXECUTION"]
    assert crashed[:5] + crashed[6:] == ["crashed", "active", "0", "0", "-", "e-1"]
    assert _ISO.fullmatch(crashed[5])
    assert done[:2] == ["done", "completed"]
    assert main(["executions", "list", "--db", db, "--limit", "1"]) == 0
    out, err = capsys.readouterr()
    assert [r[0] for r in _cells(out)] == ["AGENT", "crashed"]
    assert "--after agent:crashed" in err
    assert main(["executions", "show", "--db", db, "done", "--json"]) == 0
    assert '"status": "completed"' in capsys.readouterr().out
    assert main(["executions", "resolve", "--db", db, "done", "release"]) == 1
    assert "does not require recovery" in capsys.readouterr().err
    assert main(["executions", "approve", "--db", db, "done"]) == 1
    assert "not waiting for an approval" in capsys.readouterr().err


def test_history_cancel_json_filters_and_migrate(
    open_sqlite: Callable[..., phronomy.SQLiteStore],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    db = str(tmp_path / "life.db")
    store = open_sqlite(db)
    for iid, workflow in (("a-1", "alpha"), ("a-2", "alpha"), ("b-1", "beta")):
        for revision in (None, 1):
            store.save(
                SaveRequest(
                    workflow_instance_id=iid,
                    expected_revision=revision,
                    snapshot=encode_snapshot(
                        {"n": revision or 0},
                        workflow_instance_id=iid,
                        revision=(revision or 0) + 1,
                        phase="waiting",
                        workflow=workflow,
                    ),
                    write_id=f"{iid}-{revision}",
                    status="halted",
                    phase="waiting",
                    workflow=workflow,
                )
            )
    store.close()
    assert main(["instances", "list", "--db", db, "--workflow", "alpha", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["workflow_instance_id"], r["revision"]) for r in lines] == [
        ("a-1", 2),
        ("a-2", 2),
    ]
    assert main(["instances", "list", "--db", db, "--limit", "1", "--json"]) == 0
    first, more = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert (first["workflow_instance_id"], more) == ("a-1", {"next_after": "a-1"})
    assert main(["instances", "cancel", "--db", db, "a-2", "--reason", "dup"]) == 0
    assert capsys.readouterr().out == "a-2: cancelled at revision 3\n"
    assert main(["instances", "cancel", "--db", db, "a-2"]) == 0
    assert capsys.readouterr().out == "a-2: already cancelled\n"
    assert main(["instances", "history", "--db", db, "a-2", "--json"]) == 0
    history = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [(e["revision"], e["status"]) for e in history] == [
        (3, "cancelled"),
        (2, "halted"),
        (1, "halted"),
    ]
    assert history[0]["detail"] == "cancelled: dup"
    assert main(["instances", "history", "--db", db, "a-2", "--limit", "1"]) == 0
    header, line = _cells(capsys.readouterr().out)
    assert header[:5] == ["REV", "KIND", "STATUS", "PHASE/EVENT", "AT"]
    assert line[:4] == ["3", "save", "cancelled", "waiting"]
    assert _ISO.fullmatch(line[4])
    assert line[-1] == "cancelled: dup"
    assert main(["instances", "list", "--db", db, "--status", "cancelled"]) == 0
    assert _cells(capsys.readouterr().out)[1][:4] == ["a-2", "alpha", "cancelled", "3"]
    assert main(["instances", "history", "--db", db, "nope"]) == 1
    assert "workflow instance 'nope' does not exist" in capsys.readouterr().err
    assert main(["instances", "cancel", "--db", db, "nope"]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_migrate_brings_an_old_database_up_to_date(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "old.db")
    shutil.copy(ROOT / "tests" / "fixtures" / "schema_v1.db", db)
    assert main(["instances", "list", "--db", db]) == 1  # read-only: refuses, explains
    assert "phronomy migrate" in capsys.readouterr().err
    assert main(["migrate", "--db", db]) == 0
    assert capsys.readouterr().out == f"{db}: schema version {SCHEMA_VERSION}\n"
    assert main(["instances", "list", "--db", db, "--status", "halted"]) == 0
    assert _cells(capsys.readouterr().out)[1][:4] == [
        "halted-1", "fixture-flow", "halted", "1"
    ]  # fmt: skip


def test_operators_see_who_holds_a_lease_and_whether_it_is_live(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "leases.db")
    store = phronomy.SQLiteStore(db)
    try:
        store.begin("held", "wf", lease_owner="host:1:abc", ttl_ms=60_000)
        store.begin("lapsed", "wf", lease_owner="host:2:def", ttl_ms=0)
    finally:
        store.close()
    assert main(["instances", "list", "--db", db]) == 0
    _, held, lapsed, note = _cells(capsys.readouterr().out)
    assert re.fullmatch(
        rf"live until {_ISO.pattern} \(owner host:1:abc, epoch 1\)", held[6]
    )
    assert re.fullmatch(
        rf"expired at {_ISO.pattern} \(owner host:2:def, epoch 1\)", lapsed[6]
    )
    assert "recovery sweep puts the instance back" in note[0]
    assert main(["instances", "show", "--db", db, "held", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["lease_owner"] == "host:1:abc"
    assert shown["lease_epoch"] == 1
    assert shown["lease"].startswith("live until ")
    assert shown["lease_expires_at"] in shown["lease"]
    assert _ISO.fullmatch(shown["lease_expires_at"])
