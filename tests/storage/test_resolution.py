"""Resolving recovery_required rows in a store (the runtime and the CLI share this)."""

from __future__ import annotations

import pytest

from phronomy import errors
from phronomy.storage import FINISH_PHASE, MemoryStore, SaveRequest, resolve_stored

from .test_contract import request


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


def test_a_row_that_changes_during_resolution_is_a_conflict() -> None:
    class Racing(MemoryStore):
        def mark(self, *args: object, **kwargs: object) -> bool:
            self.save(request("x", 1))  # another writer got there first
            return super().mark(*args, **kwargs)  # type: ignore[arg-type]

    store = Racing()
    store.save(request("x", None))
    MemoryStore.mark(store, "x", "recovery_required")
    with pytest.raises(errors.ConflictError, match="changed during resolution"):
        resolve_stored(store, "x", "adopt")
    assert store.load("x").status == "halted"  # type: ignore[union-attr]
