"""Resolving recovery_required rows in a store (the runtime and the CLI share this)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from phronomy import errors
from phronomy.storage import (
    FINISH_PHASE,
    MemoryStore,
    SaveRequest,
    SQLiteStore,
    resolve_stored,
)

from .test_contract import request

if TYPE_CHECKING:
    from pathlib import Path


def _stuck(store: MemoryStore, iid: str, phase: str | None) -> None:
    if phase is not None:
        store.save(
            SaveRequest(
                workflow_instance_id=iid,
                expected_revision=None,
                snapshot=b"{}",
                write_id=f"w-{iid}",
                status="halted",
                phase=phase,
            )
        )
    assert store.mark(iid, "recovery_required", create=True, detail="lost ack")


@pytest.mark.parametrize(
    ("phase", "adopted"),
    [("awaiting", "halted"), (FINISH_PHASE, "finished"), (None, "failed")],
)
def test_adopt_takes_the_durable_record_as_the_truth(
    phase: str | None, adopted: str
) -> None:
    store = MemoryStore()
    _stuck(store, "a", phase)
    record = resolve_stored(store, "a", "adopt", by="ops")
    assert record.status == adopted
    assert record.detail == f"durable revision {record.revision} adopted by ops"


def test_release_marks_failed_and_refuses_rows_that_need_nothing() -> None:
    store = MemoryStore()
    _stuck(store, "r", "awaiting")
    assert resolve_stored(store, "r", "release").status == "failed"
    with pytest.raises(errors.NotFoundError, match="'r' does not require recovery"):
        resolve_stored(store, "r", "release")
    with pytest.raises(errors.NotFoundError, match="'nobody'"):
        resolve_stored(store, "nobody", "adopt")


def test_a_row_that_changes_during_resolution_is_a_conflict(tmp_path: Path) -> None:
    path = tmp_path / "race.db"
    other = SQLiteStore(path)  # another writer on the same database
    raced: list[bool] = []

    def race(point: str) -> None:
        if (
            point == "load.after" and not raced
        ):  # between the resolution's read and mark
            raced.append(True)
            other.save(request("x", 1))

    with SQLiteStore(path, fault_hook=race) as store, other:
        other.save(request("x", None))
        other.mark("x", "recovery_required")
        with pytest.raises(errors.ConflictError, match="changed during resolution"):
            resolve_stored(store, "x", "adopt")
        assert raced == [True]
        row = store.load("x")
        assert row is not None
        assert (row.revision, row.status) == (2, "halted")
