"""SQLiteStore specifics: durability settings, schema, faults inside transactions, processes."""

from __future__ import annotations

import logging
import os
import sqlite3
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING

import pytest

import phronomy
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
    from collections.abc import Callable, Iterator
    from pathlib import Path

    OpenSQLite = Callable[..., SQLiteStore]


def test_durability_pragmas_and_schema_version(
    open_sqlite: OpenSQLite, tmp_path: Path
) -> None:
    store = open_sqlite(tmp_path / "p.db")
    store.load("x")
    assert store.pragmas() == {
        "journal_mode": "wal",
        "synchronous": 2,  # FULL
        "busy_timeout": 30_000,
        "user_version": SCHEMA_VERSION,
    }
    store.close()
    store.close()  # idempotent
    assert store.load("x") is None  # reopens lazily


def test_a_newer_schema_is_refused(open_sqlite: OpenSQLite, tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    raw = sqlite3.connect(path)
    raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    raw.close()
    with pytest.raises(
        errors.StoreUnavailableError, match=f"schema version {SCHEMA_VERSION + 1}"
    ):
        open_sqlite(path).load("x")


def test_network_filesystems_are_refused_or_warned(
    open_sqlite: OpenSQLite,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(sqlite_module, "filesystem_type", lambda path: "nfs4")
    with pytest.raises(errors.StoreUnavailableError, match="nfs4 network filesystem"):
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


@pytest.mark.parametrize("point", ["save.applied", "commit.before"])
def test_uncertain_failure_before_commit_is_rolled_back_then_classified_pre_state(
    open_sqlite: OpenSQLite, tmp_path: Path, point: str
) -> None:
    error = OSError(f"disk hiccup at {point}")
    store = _faulty(open_sqlite, tmp_path, point, error)
    outcome = store.save_classified(request("u", None))
    assert outcome.outcome == "known_failure"
    assert outcome.error is error  # the very same error object
    assert store.load("u") is None
    # the failed transaction was rolled back: another connection can take the write lock
    other = sqlite3.connect(tmp_path / f"fault-{point}.db", timeout=0)
    other.execute("BEGIN IMMEDIATE")
    other.rollback()
    other.close()
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
    saves = store.count("save")
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
    assert store.count("save") == saves + 2  # never saved again during reconciliation


def test_known_failures_are_not_read_back(
    open_sqlite: OpenSQLite, tmp_path: Path
) -> None:
    # scenario 76
    for error in (
        errors.ConflictError("c"),
        errors.NotFoundError("n"),
        errors.SerializationError("s"),
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
import phronomy
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
        with pytest.raises(
            errors.StoreUnavailableError, match="stayed locked"
        ) as caught:
            store.save(request("locked", None))
        assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
        assert str(path) in str(caught.value)
        outcome = store.save_classified(request("locked", None))
        assert outcome.outcome == "known_failure"  # proven pre-state after the rollback
        assert isinstance(outcome.error, errors.StoreUnavailableError)
        assert not isinstance(outcome.error, errors.ConflictError)
    finally:
        other.execute("ROLLBACK")
        other.close()


# --- unusable files are refused when the store opens, with errors that say what to do


@pytest.fixture
def read_only_file() -> Iterator[Callable[[Path], None]]:
    """Make a file read-only for this process (root included, through chattr +i)."""
    made: list[Path] = []

    def make(path: Path) -> None:
        if os.geteuid() != 0:
            path.chmod(0o444)
        else:
            done = subprocess.run(["chattr", "+i", str(path)], check=False)
            if done.returncode != 0:
                pytest.skip("chattr +i is unavailable here: no read-only file for root")
        made.append(path)

    yield make
    for path in made:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(path)], check=False)
        path.chmod(0o644)


async def _open_runtime_with(store: SQLiteStore) -> list[str]:
    ran: list[str] = []
    async with phronomy.open_runtime(store=store, shutdown_timeout=0.5):
        ran.append("body")
    return ran


@pytest.mark.parametrize("kind", ["garbage", "missing-dir", "foreign", "read-only"])
async def test_an_unusable_file_is_refused_before_anything_runs(
    kind: str,
    tmp_path: Path,
    open_sqlite: OpenSQLite,
    read_only_file: Callable[[Path], None],
) -> None:
    # Before: raw sqlite3 errors ("file is not a database", "unable to open database
    # file", "attempt to write a readonly database") from the first action.
    path = tmp_path / f"{kind}.db"
    expected = {
        "garbage": "is not an SQLite database",
        "missing-dir": "cannot be opened; check that its directory exists",
        "foreign": "belongs to another application",
        "read-only": "is read-only for this store",
    }[kind]
    if kind == "garbage":
        path.write_bytes(b"not a database " * 100)
    elif kind == "missing-dir":
        path = tmp_path / "no" / "such" / "dir" / "x.db"
    elif kind == "foreign":
        raw = sqlite3.connect(path)
        raw.execute("CREATE TABLE invoices (id INTEGER)")
        raw.commit()
        raw.close()
    else:
        open_sqlite(path).open()
        read_only_file(path)
    before = path.read_bytes() if path.exists() else None
    with pytest.raises(errors.StoreUnavailableError, match=expected) as caught:
        await _open_runtime_with(open_sqlite(path))
    assert caught.value.path == str(path)
    assert str(path) in str(caught.value)
    assert isinstance(caught.value.__cause__, sqlite3.Error) or kind == "foreign"
    assert (path.read_bytes() if path.exists() else None) == before  # untouched
    assert not (tmp_path / "no").exists()


def test_a_read_only_store_reads_and_refuses_writes_clearly(
    open_sqlite: OpenSQLite, tmp_path: Path
) -> None:
    path = tmp_path / "inspect.db"
    writer = open_sqlite(path)
    writer.save(request("one", None))
    reader = open_sqlite(path, read_only=True)
    reader.open()
    assert reader.read_only
    record = reader.load("one")
    assert record is not None
    assert record.revision == 1
    with pytest.raises(errors.StoreUnavailableError, match="read-only") as caught:
        reader.save(request("two", None))
    assert not isinstance(caught.value, errors.ConflictError)
    outcome = reader.save_classified(request("two", None))
    assert (outcome.outcome, type(outcome.error)) == (
        "known_failure",
        errors.StoreUnavailableError,
    )
    missing = tmp_path / "missing.db"
    with pytest.raises(errors.StoreUnavailableError, match="does not exist"):
        open_sqlite(missing, read_only=True).load("x")
    assert not missing.exists()  # a read-only store never creates one
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()
    with pytest.raises(errors.StoreUnavailableError, match="no phronomy schema"):
        open_sqlite(empty, read_only=True).open()


async def test_a_runtime_refuses_a_read_only_store(
    open_sqlite: OpenSQLite, tmp_path: Path
) -> None:
    path = tmp_path / "ro.db"
    open_sqlite(path).open()
    with pytest.raises(errors.InvalidInputError, match="read_only=True"):
        await _open_runtime_with(open_sqlite(path, read_only=True))
