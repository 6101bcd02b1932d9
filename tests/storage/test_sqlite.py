"""SQLiteStore specifics: durability settings, schema, faults inside transactions, processes."""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import pytest

import phronomy
from phronomy import errors, storage
from phronomy.storage import (
    SCHEMA_VERSION,
    ClaimOp,
    Lease,
    Posting,
    RenewOp,
    SaveOp,
    SaveRequest,
    SQLiteStore,
    StoredRecord,
    _sqlite as sqlite_module,
    classify_uncertain_save,
)
from phronomy.storage._sqlite_schema import filesystem_type
from phronomy.testing import FaultyStore

from .test_contract import request

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

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
    assert filesystem_type(str(tmp_path)) is not None


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
    outcomes = [r.unwrap().outcome for r in results]
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
    # the save log proves it: revision 1 was another write's, so this one never
    # committed (a known failure, not an unknown outcome)
    assert outcome.outcome == "known_failure"
    assert isinstance(outcome.error, errors.ConflictError)
    assert "never committed" in "\n".join(outcome.error.__notes__)
    # neither pre- nor post-state, and nothing to prove it: the row was deleted
    inner.delete("t", 1)
    store.fail("save.before", OSError("connection reset"))
    outcome = store.save_classified(request("t", 1))
    assert outcome.outcome == "outcome_unknown"
    assert isinstance(outcome.error, errors.ConflictError)
    assert "conflicts with both expected pre-state and intended post-state" in str(
        outcome.error
    )
    assert store.count("save") == saves + 2  # never saved again during reconciliation
    inner.save(request("t", None))
    saves = store.count("save")
    store.fail("save.before", OSError("reset again")).fail(
        "readback.before", OSError("read failed")
    )
    outcome = store.save_classified(request("t", 1))
    assert outcome.outcome == "outcome_unknown"
    assert str(outcome.error) == "read failed"
    assert store.count("save") == saves + 1


def test_known_failures_are_not_read_back(
    open_sqlite: OpenSQLite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # scenario 76. Before: the faults were injected at save.before, where a failure
    # abandons the transaction and IS read back, and the test counted "load" and
    # "reconcile", names nothing records: it could not fail. Now the store itself
    # refuses the saves (a revision conflict, a lost lease), and the read-back is
    # counted where it happens (the readback fault point).
    store = FaultyStore(open_sqlite(tmp_path / "known.db"))
    store.save(request("k", None))
    assert store.begin("l", "wf", lease_owner="A", ttl_ms=60_000) == 1
    stale = msgspec.structs.replace(
        request("l", None), lease=storage.Lease(owner="A", epoch=0)
    )

    def refused() -> list[Any]:
        outcomes = [
            store.save_classified(request("k", None)),
            store.save_classified(stale),
        ]
        return [(o.outcome, type(o.error)) for o in outcomes]

    assert refused() == [
        ("known_failure", errors.ConflictError),
        ("known_failure", errors.LeaseLostError),
    ]
    assert store.count("readback") == 0
    # the negative control: a store that treated them as unknown reads them back
    monkeypatch.setattr(storage._base, "KNOWN_FAILURES", ())
    refused()
    assert store.count("readback") == 2


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


# --- opening: special files, earlier schemas, the WAL switch -----------------------------

_OPEN_IN_A_CHILD = """
import sys
from phronomy import errors
from phronomy.storage import SQLiteStore
try:
    SQLiteStore(sys.argv[1], read_only=sys.argv[2] == "ro").open()
except errors.StoreUnavailableError as exc:
    print(exc)
"""


@pytest.mark.parametrize("read_only", [False, True], ids=["writable", "read-only"])
def test_a_path_that_is_not_a_regular_file_is_refused_before_sqlite_opens_it(
    open_sqlite: OpenSQLite, tmp_path: Path, read_only: bool
) -> None:
    # Before: a FIFO hung the open (in a child here, so that a hang is a timeout).
    fifo = tmp_path / "pipe.db"
    os.mkfifo(fifo)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _OPEN_IN_A_CHILD,
            str(fifo),
            "ro" if read_only else "rw",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        f"{str(fifo)!r} is a FIFO (named pipe), not a regular"
    )
    specials = [(tmp_path, "directory")]
    if read_only:  # a writable store would create files beside /dev/null
        specials.append((Path(os.devnull), "character device"))
    for path, kind in specials:
        with pytest.raises(
            errors.StoreUnavailableError, match=f"is a {kind}"
        ) as caught:
            open_sqlite(path, read_only=read_only).open()
        assert caught.value.path == str(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe.db"]


@pytest.mark.parametrize("fixture", ["schema_v1.db", "schema_v2.db", "empty"])
def test_opening_without_migrating_refuses_an_earlier_schema_and_changes_nothing(
    open_sqlite: OpenSQLite, tmp_path: Path, fixture: str
) -> None:
    path = tmp_path / "old.db"
    if fixture == "empty":
        sqlite3.connect(path).close()
    else:
        shutil.copy(Path(__file__).parent.parent / "fixtures" / fixture, path)
    before = path.read_bytes()
    expected = "no phronomy schema" if fixture == "empty" else "of an earlier release"
    with pytest.raises(errors.StoreUnavailableError, match=expected) as caught:
        open_sqlite(path).open(migrate=False)
    if fixture != "empty":
        assert f"`python -m phronomy migrate --db {path}`" in str(caught.value)
        assert "left the file unchanged" in str(caught.value)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.db"]
    store = open_sqlite(path)
    store.open()  # migrating is the default
    assert store.pragmas()["user_version"] == SCHEMA_VERSION


def test_a_current_database_opened_without_migrating_is_used_as_it_is(
    open_sqlite: OpenSQLite, tmp_path: Path
) -> None:
    path = tmp_path / "current.db"
    open_sqlite(path, save_log_depth=7).save(request("a", None))
    store = open_sqlite(path)  # the default depth, 32: not written
    store.open(migrate=False)
    assert store.save(request("a", 1)) == 2
    raw = sqlite3.connect(path)
    try:
        row = raw.execute("SELECT value FROM phronomy_settings").fetchone()
    finally:
        raw.close()
    assert row == (7,)


def _statements(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The statements of each connection opened from now on, in opening order."""
    opened: list[list[str]] = []
    connect = sqlite3.connect

    def traced(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn: sqlite3.Connection = connect(*args, **kwargs)
        log: list[str] = []
        opened.append(log)
        conn.set_trace_callback(log.append)
        return conn

    monkeypatch.setattr(sqlite3, "connect", traced)  # the module the store uses
    return opened


def test_the_wal_switch_runs_once_and_the_read_connection_changes_nothing(
    open_sqlite: OpenSQLite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened = _statements(monkeypatch)
    path = tmp_path / "fresh.db"
    assert open_sqlite(path).load("x") is None  # a read first: both connections open
    writer, reader = opened
    assert "PRAGMA journal_mode = WAL" in writer
    assert "BEGIN IMMEDIATE" in writer
    # Before: the read connection switched the journal mode and migrated too.
    assert not [s for s in reader if "journal_mode" in s or s.startswith("BEGIN ")]
    assert "BEGIN" in reader  # a deferred read transaction: one snapshot per batch
    again = open_sqlite(path)
    again.open()
    assert again.load("x") is None
    # Before: every opening asked to switch a file in WAL mode to WAL mode.
    assert "PRAGMA journal_mode = WAL" not in opened[2]
    assert "PRAGMA journal_mode" in opened[2]  # read, not set
    assert again.pragmas()["journal_mode"] == "wal"


def test_the_wal_switch_waits_for_a_lock_the_busy_handler_does_not(
    open_sqlite: OpenSQLite, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Before: SQLITE_BUSY at once ("stayed locked longer than busy_timeout"): the
    # switch reads the header first, and a reader does not wait for a reserved lock.
    path = tmp_path / "contended.db"
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")  # a writer's reserved lock, file in rollback mode
    released = threading.Timer(0.3, lambda: other.execute("COMMIT"))
    released.start()
    started = time.monotonic()
    try:
        store = open_sqlite(path, busy_timeout=10)
        store.open()
        assert store.pragmas()["journal_mode"] == "wal"
    finally:
        released.join()
        other.close()
    assert time.monotonic() - started >= 0.25
    assert any(r.getMessage().startswith("wal.retry") for r in caplog.records)


def test_the_wal_switch_gives_up_after_busy_timeout(
    open_sqlite: OpenSQLite, tmp_path: Path
) -> None:
    path = tmp_path / "held.db"
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    started = time.monotonic()
    try:
        with pytest.raises(errors.StoreUnavailableError, match="stayed locked"):
            open_sqlite(path, busy_timeout=0.3).open()
    finally:
        other.rollback()
        other.close()
    assert 0.3 <= time.monotonic() - started < 5


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
@pytest.mark.parametrize("limit", [2**63, 10_001, 0, -1, "5", 2.0, True, None])
def test_listing_and_history_limits_are_bounded(
    open_sqlite: OpenSQLite, tmp_path: Path, kind: str, limit: object
) -> None:
    # Before: limit=2**63 raised OverflowError from sqlite3 (and "5" a TypeError).
    store = (
        open_sqlite(tmp_path / "l.db") if kind == "sqlite" else phronomy.MemoryStore()
    )
    store.save(request("x", None))
    for call in (store.list_instances, lambda limit: store.history("x", limit=limit)):
        with pytest.raises(errors.InvalidInputError, match=re.escape(repr(limit))):
            call(limit=limit)  # type: ignore[arg-type]  # bad on purpose
    assert len(store.list_instances(limit=10_000).records) == 1
    assert len(store.history("x", limit=10_000)) == 1


_WRITER = r"""
import os, signal, sys
from phronomy.storage import SaveRequest, SQLiteStore

signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the writers are reaped by the kernel
for line in sys.stdin:  # one path per writer: fork it, say its pid
    pid = os.fork()
    if pid == 0:
        store = SQLiteStore(line.strip())
        for n in range(10**9):
            store.save(SaveRequest(workflow_instance_id=f"w-{os.getpid()}-{n}",
                expected_revision=None, snapshot=b"{}", write_id=f"{n}",
                status="halted", phase="p"))
    print(pid, flush=True)
"""

KILLED_WRITER_ROUNDS = int(os.environ.get("PHRONOMY_KILLED_WRITER_ROUNDS", "60"))
"""Rounds of the killed-writer test (three new stores open in each)."""


@pytest.mark.slow
def test_stores_open_beside_killed_writers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Before: 1 start in about 100 failed at once with SQLITE_BUSY from the WAL switch.
    # A writer process (forked by a helper, which imported phronomy once) opens a store
    # and saves in a tight loop; it is killed at a random moment while three stores
    # open beside it and save. Every other round uses a new file, where the stores race
    # the writer to switch it to WAL mode; the others reopen a file with hot WAL.
    helper = subprocess.Popen(
        [sys.executable, "-c", _WRITER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert helper.stdin is not None
    assert helper.stdout is not None
    rng = random.Random(os.environ.get("PHRONOMY_KILLED_WRITER_SEED"))
    failures: list[str] = []
    opens = 0

    def open_and_save(path: Path, iid: str, delay: float) -> None:
        time.sleep(delay)
        store = SQLiteStore(path)
        try:
            store.save(request(iid, None))
        except errors.StoreUnavailableError as exc:
            failures.append(str(exc))
        finally:
            store.close()

    try:
        for round_id in range(KILLED_WRITER_ROUNDS):
            path = tmp_path / (f"new-{round_id}.db" if round_id % 2 else "reused.db")
            helper.stdin.write(f"{path}\n")
            helper.stdin.flush()
            writer = int(helper.stdout.readline())
            kill = threading.Timer(
                rng.uniform(0, 0.01), os.kill, (writer, signal.SIGKILL)
            )
            kill.start()
            openers = [
                threading.Thread(
                    target=open_and_save,
                    args=(path, f"r{round_id}-{n}", rng.uniform(0, 0.0005)),
                )
                for n in range(3)
            ]
            for opener in openers:
                opener.start()
            for opener in openers:
                opener.join()
            kill.join()
            opens += len(openers)
    finally:
        helper.stdin.close()
        helper.wait(timeout=30)
        helper.stdout.close()
    retried = sum(
        1
        for r in caplog.records
        if r.getMessage().startswith("wal.retry")
        and isinstance(r.args, tuple)
        and r.args[1] == 1
    )
    print(  # noqa: T201 - the figures of the run (pytest -s)
        f"{opens} stores opened beside killed writers ({KILLED_WRITER_ROUNDS // 2} new "
        f"files), {retried} retried the WAL switch, {len(failures)} failed"
    )
    assert failures == []


def test_only_batches_that_write_nothing_but_leases_skip_the_sync(
    tmp_path: Path,
) -> None:
    # One fsync per run: a claim (with no event) and a renewal commit with
    # synchronous=NORMAL, every batch that saves, marks or stores an event with FULL.
    store = phronomy.SQLiteStore(tmp_path / "sync.db")
    store.open()
    statements: list[str] = []
    conn = store._connection()
    conn.set_trace_callback(statements.append)

    def levels(ops: list[Any]) -> list[str]:
        statements.clear()
        for done in store.execute(ops):
            done.unwrap()
        return [s for s in statements if s.startswith("PRAGMA synchronous")]

    claim = ClaimOp(
        workflow_instance_id="a",
        workflow="wf",
        lease_owner="me",
        ttl_ms=60_000,
        create=True,
    )
    assert levels([claim]) == [
        "PRAGMA synchronous = NORMAL",
        "PRAGMA synchronous = FULL",  # the connection's own again
    ]
    assert store.pragmas()["synchronous"] == 2
    epoch = store.load("a")
    assert epoch is not None
    assert epoch.lease_epoch == 1
    save = SaveOp(
        request=SaveRequest(
            workflow_instance_id="a",
            workflow="wf",
            snapshot=b"{}",
            status="halted",
            phase="awaiting",
            write_id="w1",
            expected_revision=None,
            lease=Lease(owner="me", epoch=1),
        )
    )
    assert (
        levels(
            [
                save,
                ClaimOp(
                    workflow_instance_id="b",
                    workflow="wf",
                    lease_owner="me",
                    ttl_ms=60_000,
                    create=True,
                ),
            ]
        )
        == []
    )  # FULL (the connection's own): it saves
    posting = ClaimOp(
        workflow_instance_id="a",
        workflow="wf",
        lease_owner="me",
        ttl_ms=60_000,
        statuses=("halted",),
        post=Posting(
            workflow_instance_id="a", event_id="e1", event="go", payload=b"null"
        ),
    )
    assert levels([posting]) == []  # FULL: it stores an event
    renew = RenewOp(owner="me", instance_ids=("b",), ttl_ms=60_000)
    assert store.execute([renew])[0].unwrap()["b"][2]  # renewed
    assert levels([renew]) == [  # on the write connection, under its lock
        "PRAGMA synchronous = NORMAL",
        "PRAGMA synchronous = FULL",
    ]
    store.close()
