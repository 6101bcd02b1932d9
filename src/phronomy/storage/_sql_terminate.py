"""The statement of :class:`~phronomy.storage.TerminateOp` (SQLite's style; the
PostgreSQL store converts it with ``pyformat``)."""

from __future__ import annotations

__all__ = ["SQL_TERMINATE_ROW"]

SQL_TERMINATE_ROW = """
    UPDATE phronomy_workflow_instances SET status = :status, detail = :detail,
        updated_at_ms = :now, lease_owner = NULL, lease_expires_at_ms = NULL,
        cancel_requested = NULL, lease_epoch = lease_epoch + 1
    WHERE instance_id = :id AND revision = :expected
      AND status NOT IN ('finished', 'cancelled')
"""
"""Close the row whoever holds it: released, its epoch incremented (the holder's
later writes are refused as a lost lease)."""
