"""What a stored row says about its instance, for comparing rows in tests."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from phronomy.storage import StoredRecord


def durable_view(record: StoredRecord) -> tuple[Any, ...]:
    """The row's saved content (not its lease or its timestamps): revision, status,
    phase, snapshot, write id, detail, definition version."""
    return (
        record.revision,
        record.status,
        record.phase,
        record.snapshot,
        record.write_id,
        record.detail,
        record.definition_version,
    )


def loaded(store: Any, workflow_instance_id: str) -> StoredRecord:
    """The instance's row (the test fails here if the store has none)."""
    row: StoredRecord | None = store.load(workflow_instance_id)
    assert row is not None, f"{workflow_instance_id!r} has no row"
    return row
