"""SQLiteStore specifics: durability settings, schema, faults inside transactions, processes."""

from __future__ import annotations

import logging
import sqlite3
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING

import pytest

from phronomy import errors
from phronomy.storage import (
    SCHEMA_VERSION,
    SaveOp,
    SaveRequest,
    SQLiteStore,
    StoredRecord,
    _sqlite as sqlite_module,
    classify_uncertain_save,
)
from phronomy.testing import FaultyStore

from .test_contract import request

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    OpenSQLite = Callable[..., SQLiteStore]


def test_durability_pragmas_and_schema_version(
    open_sqlite: OpenSQLite, tmp_path: Path
) -> None:
    store = open_sqlite(tmp_path / "p.db")
    store.load("x")
    conn = store._connection()
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 30_000
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    store.close()
    store.close()  # idempotent
    assert store.load("x") is None  # reopens lazily


def test_a_newer_schema_is_refused(open_sqlite: OpenSQLite, tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    raw = sqlite3.connect(path)
    raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    raw.close()
    with pytest.raises(errors.UnsupportedBackendError, match="schema version 2"):
        open_sqlite(path).load("x")


def test_network_filesystems_are_refused_or_warned(
    open_sqlite: OpenSQLite,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(sqlite_module, "filesystem_type", lambda path: "nfs4")
    with pytest.raises(errors.UnsupportedBackendError, match="nfs4 network filesystem"):
        open_sqlite(tmp_path / "n.db").load("x")
    allowed = open_sqlite(tmp_path / "n.db", allow_network_filesystem=True)
    assert allowed.load("x") is None
    assert "allowed by allow_network_filesystem=True" in caplog.text
    allowed.close()


def test_filesystem_type_is_detected_here(tmp_path: Path) -> None:
    assert sqlite_module.filesystem_type(str(tmp_path)) is not None


def _faulty(
    open_sqlite: OpenSQLite, tmp_path: Path, point: str, error: BaseException
) -> SQLiteStore:
    fired: list[str] = []

    def hook(name: str) -> None:
        if name == point and not fired:
            fired.append(name)
            raise error

    return open_sqlite(tmp_path / f"fault-{point}.db", fault_hook=hook)


@pytest.mark.parametrize("point", ["save.statement", "commit.before"])
def test_uncertain_failure_before_commit_is_rolled_back_then_classified_pre_state(
    open_sqlite: OpenSQLite, tmp_path: Path, point: str
) -> None:
    error = OSError(f"disk hiccup at {point}")
    store = _faulty(open_sqlite, tmp_path, point, error)
    outcome = store.save_classified(request("u", None))
    assert outcome.outcome == "known_failure"
    assert outcome.error is error  # the very same error object
    assert store.load("u") is None
    assert not store._connection().in_transaction
    assert store.save(request("u", None)) == 1  # the connection is usable afterwards


def test_uncertain_failure_after_commit_is_classified_post_state(
    open_sqlite: OpenSQLite, tmp_path: Path
) -> None:
    store = _faulty(open_sqlite, tmp_path, "commit.after", OSError("ack lost"))
    saved = request("v", None)
    outcome = store.save_classified(saved)
    assert (outcome.outcome, outcome.revision) == ("success", 1)
    row = store.load("v")
    assert row is not None
    assert (row.revision, row.write_id) == (1, saved.write_id)


@pytest.mark.parametrize(
    ("point", "expected"),
    [("commit.before", "known_failure"), ("commit.after", "success")],
)
def test_group_commit_failure_reconciles_each_save(
    open_sqlite: OpenSQLite, tmp_path: Path, point: str, expected: str
) -> None:
    open_sqlite(tmp_path / f"fault-{point}.db").save(request("pre", None))
    store = _faulty(open_sqlite, tmp_path, point, OSError("batch failed"))
    results = store.execute(
        [SaveOp(request=request(f"g{i}", None)) for i in range(5)]
        + [SaveOp(request=request("pre", 1))]
    )
    outcomes = [r.unwrap().outcome for r in results]  # type: ignore[union-attr]
    assert outcomes == [expected] * 6
    present = [store.load(f"g{i}") is not None for i in range(5)]
    assert present == [expected == "success"] * 5


def test_a_third_state_is_neither_and_read_back_errors_are_unknown(
    open_sqlite: OpenSQLite,
    tmp_path: Path,
) -> None:
    inner = open_sqlite(tmp_path / "third.db")
    store = FaultyStore(inner)
    inner.save(request("t", None))  # another writer created the row meanwhile
    store.fail("save.before", OSError("connection reset"))
    outcome = store.save_classified(request("t", None))
    assert outcome.outcome == "outcome_unknown"
    assert isinstance(outcome.error, errors.ConflictError)
    assert "conflicts with both expected pre-state and intended post-state" in str(
        outcome.error
    )
    store.fail("save.before", OSError("reset again")).fail(
        "readback.before", OSError("read failed")
    )
    outcome = store.save_classified(request("t", 1))
    assert outcome.outcome == "outcome_unknown"
    assert str(outcome.error) == "read failed"
    assert store.count("save") == 2  # never saved a second time during reconciliation


def test_known_failures_are_not_read_back(
    open_sqlite: OpenSQLite, tmp_path: Path
) -> None:
    # scenario 76
    for error in (
        errors.ConflictError("c"),
        errors.NotFoundError("n"),
        errors.SerializationError("s"),
        errors.UnsupportedBackendError("u"),
    ):
        store = FaultyStore(open_sqlite(tmp_path / "known.db")).fail(
            "save.before", error
        )
        outcome = store.save_classified(request(f"k-{type(error).__name__}", None))
        assert outcome.outcome == "known_failure"
        assert outcome.error is error
        assert store.count("load") == 0
        assert store.count("reconcile") == 0
        store.close()


def _row(revision: int, write_id: str | None) -> StoredRecord:
    return StoredRecord(
        workflow_instance_id="x",
        workflow="wf",
        revision=revision,
        status="halted",
        write_id=write_id,
    )


def _req(expected: int | None, write_id: str = "mine") -> SaveRequest:
    return SaveRequest(
        workflow_instance_id="x",
        expected_revision=expected,
        snapshot=b"",
        write_id=write_id,
        status="halted",
        phase="p",
    )


def test_classification_rules() -> None:
    # scenario 89, restated with write ids
    assert (
        classify_uncertain_save(_row(2, "other"), 2, _req(1)) == "post"
    )  # logged: post even if superseded
    assert classify_uncertain_save(_row(2, "mine"), None, _req(1)) == "post"
    assert (
        classify_uncertain_save(_row(1, "other"), None, _req(1)) == "pre"
    )  # the pre revision is decisive
    assert classify_uncertain_save(None, None, _req(None)) == "pre"
    assert (
        classify_uncertain_save(_row(0, None), None, _req(None)) == "pre"
    )  # a claim placeholder
    assert classify_uncertain_save(None, None, _req(3)) == "neither"
    assert classify_uncertain_save(_row(3, "other"), None, _req(1)) == "neither"


def test_writers_wait_for_another_connections_lock(
    open_sqlite: OpenSQLite, tmp_path: Path
) -> None:
    path = tmp_path / "busy.db"
    store = open_sqlite(path, busy_timeout=5)
    store.load("x")
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    released = threading.Timer(0.3, lambda: other.execute("COMMIT"))
    released.start()
    started = time.monotonic()
    assert store.save(request("busy", None)) == 1
    assert time.monotonic() - started >= 0.25
    released.join()
    other.close()


_RACER = """
import sys
from phronomy import errors
from phronomy.storage import SaveRequest, SQLiteStore
store = SQLiteStore(sys.argv[1])
request = SaveRequest(workflow_instance_id=sys.argv[2], expected_revision=None, snapshot=b"{}",
                      write_id=sys.argv[3], status="halted", phase="p")
try:
    store.save(request)
    print("won")
except errors.ConflictError:
    print("conflict")
"""


@pytest.mark.slow
def test_processes_racing_to_create_an_instance_have_one_winner(
    open_sqlite: OpenSQLite, tmp_path: Path
) -> None:
    path = str(tmp_path / "race.db")
    open_sqlite(path).load("init")
    for round_id in range(4):
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    _RACER,
                    path,
                    f"race-{round_id}",
                    f"w-{round_id}-{n}",
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            for n in range(6)
        ]
        outcomes = sorted(proc.communicate(timeout=60)[0].strip() for proc in procs)
        assert [proc.returncode for proc in procs] == [0] * 6
        assert outcomes == ["conflict"] * 5 + ["won"]


def test_busy_lock_timeout_is_reported_not_called_a_conflict(
    open_sqlite: OpenSQLite, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    path = tmp_path / "locked.db"
    store = open_sqlite(path, busy_timeout=0.1)
    store.load("x")
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            store.save(request("locked", None))
        outcome = store.save_classified(request("locked", None))
        assert outcome.outcome == "known_failure"  # proven pre-state after the rollback
        assert isinstance(outcome.error, sqlite3.OperationalError)
    finally:
        other.execute("ROLLBACK")
        other.close()
