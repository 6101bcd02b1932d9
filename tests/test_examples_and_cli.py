"""Every example runs; the CLI's demo (the README's main job) and operator commands work."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import phronomy
from phronomy.cli import main
from phronomy.storage import SaveRequest

if TYPE_CHECKING:
    from collections.abc import Callable

ROOT = Path(__file__).parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


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
    }[example.stem]
    assert expected in output


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
    listing = capsys.readouterr().out
    assert "stuck\twf\trecovery_required\trev 1\twaiting  (ack lost)" in listing
    assert main(["instances", "list", "--db", db, "--status", "finished"]) == 0
    assert capsys.readouterr().out.startswith("ok\t")
    assert main(["instances", "show", "--db", db, "stuck"]) == 0
    assert '"x": 1' in capsys.readouterr().out
    assert main(["instances", "show", "--db", db, "missing"]) == 1
    assert main(["instances", "resolve", "--db", db, "ok", "adopt"]) == 1
    assert main(["instances", "resolve", "--db", db, "stuck", "adopt"]) == 0
    assert "recovery_required -> halted" in capsys.readouterr().out
    assert open_sqlite(db).load("stuck").status == "halted"  # type: ignore[union-attr]
