"""The listing statements of both SQL stores (named parameters, SQLite's style)."""

from __future__ import annotations

__all__ = ["LIST_COLUMNS", "LIST_STATEMENTS"]

LIST_COLUMNS = (
    "instance_id, workflow, revision, status, phase, NULL, last_write_id, detail, "
    "updated_at_ms, definition_version, lease_owner, lease_epoch, lease_expires_at_ms, "
    "takeovers, cancel_requested"
)
"""A row's columns without its snapshot (a listing never reads one)."""


def _listing(status: bool, workflow: bool) -> str:
    where = ["instance_id > :after"]  # a seek in the index, not a filter on every row
    where += ["status = :status"] * status + ["workflow = :workflow"] * workflow
    return (
        f"SELECT {LIST_COLUMNS} FROM phronomy_workflow_instances "  # noqa: S608
        f"WHERE {' AND '.join(where)} ORDER BY instance_id LIMIT :limit"
    )


LIST_STATEMENTS = tuple(_listing(s, w) for s in (False, True) for w in (False, True))
"""A page of rows, by (status filter?, workflow filter?), ``2 * status + workflow``:
each filter is a condition of its own, which the status or workflow index serves in
id order. The form ``:status IS NULL OR status = :status`` made SQLite walk the whole
table, and left a PostgreSQL prepared statement's generic plan no index."""
