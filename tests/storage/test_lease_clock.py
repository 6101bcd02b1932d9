"""Lease times on a clock that wall-clock steps do not move (SQLite, MemoryStore), the
boot they belong to, and the watch that notices a step of a store's lease clock.

The same properties across real processes with a stepped wall clock (libfaketime):
tests/test_clock_steps.py.
"""

from __future__ import annotations

import logging
import sqlite3
import sys
import time
from typing import TYPE_CHECKING, Any

import pytest

from phronomy import MemoryStore, SQLiteStore
from phronomy.cli import main
from phronomy.storage import SCHEMA_VERSION, RecoverOp, RenewOp, _clock
from phronomy.storage._sqlite_schema import MIGRATIONS

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from phronomy.storage import BaseStore

STEP_MS = 300_000
SWEEP = RecoverOp(limit=100, max_takeovers=5)


def test_the_lease_clock_is_the_monotonic_clock_of_one_boot_on_linux(
    tmp_path: Path,
) -> None:
    boot_id = tmp_path / "boot_id"
    boot_id.write_text("0f5b8ac2-5b1e-4c5e-9a55-3c2d1e0f9a77\n")
    assert _clock.lease_clock("linux", str(boot_id)) == (
        0x0F5B8AC25B1E4C5,
        _clock.monotonic_ms,
    )
    # without a boot id, the wall clock (a reboot cannot be told apart otherwise)
    assert _clock.lease_clock("darwin", str(boot_id)) == (0, _clock.wall_ms)
    assert _clock.lease_clock("linux", str(tmp_path / "none")) == (0, _clock.wall_ms)
    boot_id.write_text("not a boot id")
    assert _clock.lease_clock("linux", str(boot_id)) == (0, _clock.wall_ms)


@pytest.mark.skipif(sys.platform != "linux", reason="the boot id is Linux's")
def test_this_machine_keeps_lease_times_on_its_monotonic_clock() -> None:
    with open(_clock.BOOT_ID_PATH, encoding="ascii") as file:  # this machine's
        assert int(file.read().replace("-", "")[:15], 16) == _clock.LEASE_CLOCK_ID
    assert _clock.lease_ms is _clock.monotonic_ms
    assert (
        abs(_clock.monotonic_ms() - time.clock_gettime(time.CLOCK_MONOTONIC) * 1e3) < 50
    )


@pytest.fixture(params=["memory", "sqlite"])
def make_store(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    open_sqlite: Callable[..., SQLiteStore],
) -> Callable[[], BaseStore[Any]]:
    """A new store on the one database of the test (MemoryStore: the same store)."""
    if request.param == "memory":
        memory = MemoryStore()
        return lambda: memory
    return lambda: open_sqlite(tmp_path / "leases.db")


def test_lease_times_are_on_the_lease_clock_and_timestamps_on_the_wall_clock(
    make_store: Callable[[], BaseStore[Any]],
) -> None:
    store = make_store()
    lease_before, wall_before = _clock.monotonic_ms(), _clock.wall_ms()
    assert store.begin("a", "wf", lease_owner="A", ttl_ms=60_000) == 1
    assert store.run(RenewOp(owner="A", instance_ids=("a",), ttl_ms=90_000)) == {
        "a": (1, None, True)
    }
    lease_after, wall_after = _clock.monotonic_ms(), _clock.wall_ms()
    row = store.load("a")
    assert row is not None
    assert row.lease_expires_at_ms is not None
    assert lease_before + 90_000 <= row.lease_expires_at_ms <= lease_after + 90_000
    assert wall_before <= row.updated_at_ms <= wall_after


@pytest.mark.parametrize("step_ms", [STEP_MS, -STEP_MS])
def test_a_wall_clock_step_moves_no_lease(
    make_store: Callable[[], BaseStore[Any]],
    monkeypatch: pytest.MonkeyPatch,
    step_ms: int,
) -> None:
    """A live owner's lease survives another store's sweep and claim whose wall clock
    stepped by *step_ms*; a lease that expired is still recovered at once."""
    owner = make_store()
    owner.begin("live", "wf", lease_owner="A", ttl_ms=60_000)
    owner.begin("dead", "wf", lease_owner="A", ttl_ms=0)
    real = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: real() + step_ms * 1_000_000)
    other = make_store()
    assert other.run(SWEEP) == [("dead", "failed")]
    assert other.begin("live", "wf", lease_owner="B", ttl_ms=60_000) is None
    row = other.load("live")
    assert row is not None
    assert (row.lease_owner, row.lease_epoch, row.status) == ("A", 1, "running")
    recovered = other.load("dead")
    assert recovered is not None  # its human timestamp is the stepped wall clock's
    assert abs(recovered.updated_at_ms - _clock.wall_ms()) < 5_000


def test_control_leases_on_the_wall_clock_are_swept_by_a_forward_step(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    open_sqlite: Callable[..., SQLiteStore],
) -> None:
    """The behaviour of earlier releases (lease times on the wall clock), for contrast:
    a sweep whose wall clock stepped 300 s forward takes a live owner's lease."""
    monkeypatch.setattr(_clock, "lease_ms", _clock.wall_ms)
    owner = open_sqlite(tmp_path / "wall.db")
    owner.begin("live", "wf", lease_owner="A", ttl_ms=60_000)
    real = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: real() + STEP_MS * 1_000_000)
    assert open_sqlite(tmp_path / "wall.db").run(SWEEP) == [("live", "failed")]


def _set_lease_clock(path: Path, value: int) -> None:
    conn = sqlite3.connect(path)
    with conn:
        conn.execute(
            "UPDATE phronomy_settings SET value = ? WHERE name = 'lease_clock'",
            (value,),
        )
    conn.close()


def _lease_clock(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        row = conn.execute(
            "SELECT value FROM phronomy_settings WHERE name = 'lease_clock'"
        ).fetchone()
        return int(row[0])
    finally:
        conn.close()


def test_leases_written_before_a_reboot_expire_when_the_file_is_opened(
    tmp_path: Path,
    open_sqlite: Callable[..., SQLiteStore],
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    db = tmp_path / "boot.db"
    first = open_sqlite(db)
    first.begin("held", "wf", lease_owner="A", ttl_ms=3_600_000)
    first.close()
    assert _lease_clock(db) == _clock.LEASE_CLOCK_ID
    reopened = open_sqlite(db)  # the same boot: the lease stays live
    assert reopened.run(SWEEP) == []
    reopened.close()

    _set_lease_clock(db, _clock.LEASE_CLOCK_ID ^ 1)  # as if written on another boot
    reader = open_sqlite(db, read_only=True)
    assert reader.lease_now_ms() is None  # a reader cannot change it: it says so
    assert main(["instances", "list", "--db", str(db)]) == 0
    assert "written before this machine restarted" in capsys.readouterr().out
    after = open_sqlite(db)
    after.open()
    assert "1 leases were written on another boot or clock" in caplog.text
    assert _lease_clock(db) == _clock.LEASE_CLOCK_ID
    row = after.load("held")
    assert row is not None
    assert row.lease_expires_at_ms is not None
    assert row.lease_expires_at_ms <= _clock.lease_ms()
    assert after.run(SWEEP) == [("held", "failed")]  # recovered by the next sweep
    assert reader.lease_now_ms() is not None


def _schema_3(path: Path) -> None:
    """A database as the release before this one left it (schema 3: wall-clock lease
    times), with a leased instance whose lease looks live for another minute."""
    conn = sqlite3.connect(path, isolation_level=None)
    for step in MIGRATIONS[:3]:
        for statement in step:
            conn.execute(statement)
    conn.execute("PRAGMA user_version = 3")
    wall = _clock.wall_ms()
    conn.execute(
        "INSERT INTO phronomy_workflow_instances (instance_id, workflow, revision, "
        "status, last_write_id, created_at_ms, updated_at_ms) "
        "VALUES ('old', 'wf', 1, 'halted', 'w1', ?, ?)",
        (wall, wall),
    )
    conn.execute(
        "UPDATE phronomy_workflow_instances SET status = 'running', lease_owner = "
        "'host:1:old', lease_epoch = 1, lease_expires_at_ms = ? "
        "WHERE instance_id = 'old'",
        (wall + 60_000,),
    )
    conn.close()


def test_wall_clock_leases_of_schema_3_expire_on_migration(
    tmp_path: Path, open_sqlite: Callable[..., SQLiteStore]
) -> None:
    """Their runtimes belong to an earlier release (stopped before the upgrade): the
    instance is put back by the first sweep, not a wall-clock age later."""
    db = tmp_path / "v3.db"
    _schema_3(db)
    store = open_sqlite(db)
    store.open()
    assert store.pragmas()["user_version"] == SCHEMA_VERSION
    assert _lease_clock(db) == _clock.LEASE_CLOCK_ID
    assert store.run(SWEEP) == [("old", "halted")]
    row = store.load("old")
    assert row is not None
    assert (row.status, row.revision, row.lease_owner, row.lease_epoch) == (
        "halted",
        1,
        None,
        2,
    )


# --- the step watch ------------------------------------------------------------------


def _watch(caplog: pytest.LogCaptureFixture) -> Callable[[int, float], float | None]:
    """Readings of a lease clock at monotonic seconds, each taking 2 ms."""
    watch = _clock.StepWatch("the test clock")
    caplog.set_level(logging.WARNING, logger="phronomy")

    def observe(lease_ms: int, at: float) -> float | None:
        sent = int(at * 1e9)
        return watch.observe(lease_ms, sent, sent + 2_000_000)

    return observe


def test_the_watch_reports_a_step_once_with_its_size(
    caplog: pytest.LogCaptureFixture,
) -> None:
    observe = _watch(caplog)
    assert observe(5_000, 100.0) is None  # the first reading: nothing to compare
    assert observe(15_000, 110.0) is None  # 10 s on both clocks
    assert observe(25_400, 120.0) is None  # 0.4 s off: within the threshold
    step = observe(335_400, 130.0)  # 300 s forward
    assert step is not None
    assert step == pytest.approx(300, abs=0.5)
    assert observe(345_400, 140.0) is None  # once per step
    back = observe(55_400, 150.0)
    assert back is not None
    assert back == pytest.approx(-300, abs=0.5)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert warnings[0].startswith("the test clock stepped forward by 300.0 s")
    assert (
        "other runtimes may take over instances whose runtime is alive" in warnings[0]
    )
    assert warnings[1].startswith("the test clock stepped back by 300.0 s")
    assert "recovered up to that much later" in warnings[1]


def test_the_watch_allows_for_drift_over_long_gaps(
    caplog: pytest.LogCaptureFixture,
) -> None:
    observe = _watch(caplog)
    observe(0, 0.0)
    assert observe(3_600_000 + 3_000, 3_600.0) is None  # 3 s in an hour (833 ppm)
    assert observe(3_600_000 + 3_000 + 10_000 + 1_200, 3_610.0) is not None


def test_a_renewal_feeds_the_watch_with_the_lease_clock(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    open_sqlite: Callable[..., SQLiteStore],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A store whose lease clock steps (the wall clock, where there is no boot id)
    warns at the next renewal; a renewal that renews nothing reads no clock."""
    offset = [0]
    monkeypatch.setattr(_clock, "lease_ms", lambda: _clock.wall_ms() + offset[0])
    store = open_sqlite(tmp_path / "watch.db")
    store.begin("a", "wf", lease_owner="A", ttl_ms=60_000)
    renew = RenewOp(owner="A", instance_ids=("a",), ttl_ms=60_000)
    store.run(renew)
    offset[0] = -STEP_MS
    assert store.run(RenewOp(owner="B", instance_ids=("a",), ttl_ms=1)) == {}
    assert "stepped" not in caplog.text
    store.run(renew)
    assert "the SQLite store's lease clock stepped back by 300.0 s" in caplog.text


def test_a_step_of_the_postgresql_server_clock_is_reported(
    open_postgres: Callable[..., BaseStore[Any]], caplog: pytest.LogCaptureFixture
) -> None:
    """The server's clock cannot be stepped here: this process's monotonic clock is
    stepped 300 s back instead, which the watch sees as the server's clock stepping
    300 s forward between two renewals."""
    store = open_postgres()
    store.begin("a", "wf", lease_owner="A", ttl_ms=60_000)
    renew = RenewOp(owner="A", instance_ids=("a",), ttl_ms=60_000)
    store.run(renew)
    store.run(renew)
    assert "stepped" not in caplog.text
    watch = store._clock.watch  # type: ignore[attr-defined]
    watch.monotonic_ns = lambda: time.monotonic_ns() - STEP_MS * 1_000_000
    store.run(renew)
    assert (
        f"the clock of PostgreSQL at {store.address} stepped forward by 300.0 s"  # type: ignore[attr-defined]
        in caplog.text
    )
