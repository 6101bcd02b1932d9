"""A database written by the previous release (schema 1) migrates on open."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import pytest

from phronomy import errors
from phronomy.storage import (
    SCHEMA_VERSION,
    Consumption,
    FireOp,
    InboxOp,
    Posting,
    PostOp,
    RevisionOp,
    SaveRequest,
    SQLiteStore,
    TimerSpec,
)
from records import durable_view

if TYPE_CHECKING:
    from collections.abc import Callable


FIXTURE = Path(__file__).parent.parent / "fixtures" / "schema_v1.db"


@pytest.fixture
def v1_file(tmp_path: Path) -> Path:
    path = tmp_path / "old.db"
    shutil.copy(FIXTURE, path)
    return path


def _read_only(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)  # never creates it


def test_the_fixture_is_schema_1() -> None:
    conn = _read_only(FIXTURE)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    finally:
        conn.close()


def test_every_row_and_its_history_survive_the_migration(
    open_sqlite: Callable[..., SQLiteStore], v1_file: Path
) -> None:
    store = open_sqlite(v1_file)
    before = _read_only(FIXTURE)
    rows = before.execute(
        "SELECT instance_id, revision, status, phase, snapshot, last_write_id, detail "
        "FROM phronomy_workflow_instances ORDER BY instance_id"
    ).fetchall()
    logs = before.execute(
        "SELECT instance_id, revision, write_id, status FROM phronomy_save_log "
        "ORDER BY instance_id, revision"
    ).fetchall()
    before.close()
    store.open()
    assert store.pragmas()["user_version"] == SCHEMA_VERSION == 7
    for iid, *saved in rows:
        record = store.load(iid)
        assert record is not None
        assert durable_view(record) == (*saved, "")
    for iid, revision, write_id, status in logs:
        assert store.find_write(iid, write_id) == revision
        (entry,) = [e for e in store.history(iid) if e.revision == revision]
        assert (entry.write_id, entry.status, entry.phase) == (write_id, status, None)
    page = store.list_instances(status="halted")
    assert [r.workflow_instance_id for r in page.records] == ["halted-1"]
    assert [
        r.workflow_instance_id
        for r in store.list_instances(workflow="fixture-flow", limit=10).records
    ] == ["failed-1", "finished-1", "halted-1", "recovery-1", "running-1"]


def test_the_migrated_file_takes_new_saves_and_statuses(
    open_sqlite: Callable[..., SQLiteStore], v1_file: Path
) -> None:
    store = open_sqlite(v1_file, save_log_depth=3)
    for revision in range(1, 5):
        store.save(
            SaveRequest(
                workflow_instance_id="halted-1",
                expected_revision=revision,
                snapshot=b'{"v":1}',
                write_id=f"new-{revision}",
                status="cancelled" if revision == 4 else "halted",
                phase="awaiting",
                definition_version="abc",
                detail="stopped by ops" if revision == 4 else None,
            )
        )
    record = store.load("halted-1")
    assert record is not None
    assert (record.revision, record.status, record.detail) == (
        5,
        "cancelled",
        "stopped by ops",
    )
    assert record.definition_version == "abc"
    history = store.history("halted-1")
    assert [e.revision for e in history] == [5, 4, 3]  # the depth setting applies
    assert history[0].detail == "stopped by ops"


def test_migration_is_idempotent_and_read_only_stores_refuse_old_files(
    open_sqlite: Callable[..., SQLiteStore], v1_file: Path
) -> None:
    with pytest.raises(errors.StoreUnavailableError, match="schema version 1 of an"):
        open_sqlite(v1_file, read_only=True).open()
    untouched = _read_only(v1_file)
    try:
        assert untouched.execute("PRAGMA user_version").fetchone()[0] == 1
    finally:
        untouched.close()
    open_sqlite(v1_file).open()
    second = open_sqlite(v1_file)
    second.open()  # already at the newest schema: nothing to do
    reader = open_sqlite(v1_file, read_only=True)
    assert reader.load("finished-1") is not None


def test_bad_log_depths_are_refused(tmp_path: Path) -> None:
    for depth in (1, 0, "3", True):
        with pytest.raises(errors.InvalidInputError, match="save_log_depth"):
            SQLiteStore(tmp_path / "x.db", save_log_depth=depth)  # type: ignore[arg-type]


def test_a_schema_2_file_gains_leases_and_keeps_every_row(
    open_sqlite: Callable[..., SQLiteStore], tmp_path: Path
) -> None:
    fixture = FIXTURE.with_name("schema_v2.db")
    before = _read_only(fixture)
    try:
        assert before.execute("PRAGMA user_version").fetchone()[0] == 2
        rows = before.execute(
            "SELECT instance_id, revision, status, phase, snapshot, last_write_id, "
            "detail, definition_version FROM phronomy_workflow_instances"
        ).fetchall()
    finally:
        before.close()
    path = tmp_path / "v2.db"
    shutil.copy(fixture, path)
    store = open_sqlite(path)
    store.open()
    assert store.pragmas()["user_version"] == SCHEMA_VERSION
    for iid, *saved in rows:
        record = store.load(iid)
        assert record is not None
        assert durable_view(record) == tuple(saved)
        assert (record.lease_owner, record.lease_epoch, record.takeovers) == (
            None,
            0,
            0,
        )
    assert [e.revision for e in store.history("finished-1")] == [2, 1]
    # a row left running by a runtime without leases can be claimed again
    assert store.begin("running-1", "fixture-flow", lease_owner="A", ttl_ms=1000) == 1


def test_a_schema_4_file_gains_an_inbox_and_keeps_every_row(
    open_sqlite: Callable[..., SQLiteStore], tmp_path: Path
) -> None:
    fixture = FIXTURE.with_name("schema_v4.db")
    before = _read_only(fixture)
    try:
        assert before.execute("PRAGMA user_version").fetchone()[0] == 4
        rows = before.execute(
            "SELECT instance_id, revision, status, phase, snapshot, last_write_id, "
            "detail, definition_version FROM phronomy_workflow_instances"
        ).fetchall()
        histories = before.execute(
            "SELECT instance_id, revision, write_id FROM phronomy_save_log "
            "ORDER BY instance_id, revision"
        ).fetchall()
    finally:
        before.close()
    path = tmp_path / "v4.db"
    shutil.copy(fixture, path)
    store = open_sqlite(path)
    store.open()
    assert store.pragmas()["user_version"] == SCHEMA_VERSION == 7
    for iid, *saved in rows:
        record = store.load(iid)
        assert record is not None
        assert durable_view(record) == tuple(saved)
    after = [
        (iid, e.revision, e.write_id)
        for iid in sorted({r[0] for r in rows})
        for e in reversed(store.history(iid))
    ]
    assert after == histories
    # the inbox works on the migrated rows: in order, once each
    posting = Posting(
        workflow_instance_id="finished-1", event_id="e", event="go", payload=b"{}"
    )
    assert store.run(PostOp(posting=posting)).outcome == "closed"
    posted = store.run(
        PostOp(
            posting=msgspec.structs.replace(posting, workflow_instance_id="failed-1")
        )
    )
    assert (posted.outcome, posted.entry.seq) == ("stored", 1)


def test_a_schema_5_file_gains_timers_and_keeps_its_inbox(
    open_sqlite: Callable[..., SQLiteStore], tmp_path: Path
) -> None:
    fixture = FIXTURE.with_name("schema_v5.db")
    before = _read_only(fixture)
    try:
        assert before.execute("PRAGMA user_version").fetchone()[0] == 5
        entries = before.execute(
            "SELECT instance_id, seq, event_id, status FROM phronomy_inbox "
            "ORDER BY instance_id"
        ).fetchall()
    finally:
        before.close()
    path = tmp_path / "v5.db"
    shutil.copy(fixture, path)
    store = open_sqlite(path, clock=lambda: 1_000)
    store.open()
    assert store.pragmas()["user_version"] == SCHEMA_VERSION == 7
    inbox = [
        (iid, e.seq, e.event_id, e.status)
        for iid in ("finished-1", "halted-1")
        for e in store.run(InboxOp(workflow_instance_id=iid, pending_only=False))
    ]
    assert inbox == entries
    # a save of a migrated row arms a timer, which fires once into its inbox
    halted = store.load("halted-1")
    assert halted is not None
    assert halted.snapshot is not None
    spec = TimerSpec(name="t", delay_ms=0, event="approve", payload=b"2")
    store.save(
        SaveRequest(
            workflow_instance_id="halted-1",
            expected_revision=1,
            snapshot=halted.snapshot,
            write_id="w-timer",
            status="halted",
            phase="awaiting",
            consumed=(Consumption(seq=1, status="dropped"),),
            arm=(spec,),
        )
    )
    # the save log keeps the states of saves made since version 7 (a fork's source)
    earlier = store.run(RevisionOp(workflow_instance_id="halted-1", revision=1))
    assert (earlier.status, earlier.snapshot) == ("halted", None)
    later = store.run(RevisionOp(workflow_instance_id="halted-1", revision=2))
    assert later.snapshot == halted.snapshot
    fire = FireOp(owner="o", workflows=("fixture-flow",))
    assert store.run(fire) == 1
    assert store.run(fire) == 0
    pending = store.run(InboxOp(workflow_instance_id="halted-1"))
    assert [(e.seq, e.event_id, e.payload) for e in pending] == [(2, "timer:t@2", b"2")]
