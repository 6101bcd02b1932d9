"""Purging closed instances: the pieces the recovery sweep (retention) and
``python -m phronomy instances purge`` share.

A purge is a :class:`~phronomy.storage.DeleteOp` (``closed_only``) of each closed row
found old enough, at the revision it was read at: a row that changed meanwhile
(claimed again by ``if_exists="restart"``, which keeps the revision) is left alone
(the delete conflicts, nothing is written).
Deleting a row deletes its save log, its inbox and its timers with it (the stores'
triggers). A purged id is free again: a new start under it creates a new instance.
Supervised executions' records are never purged here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from phronomy.errors import InvalidInputError

from ._ops import DeleteOp, ListOp
from ._records import is_execution_plan

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ._records import StoredRecord

__all__ = [
    "CLOSED_STATUSES",
    "PURGE_BATCH",
    "ClosedStatus",
    "check_retention",
    "closed_listing",
    "purge_ops",
]

ClosedStatus = Literal["finished", "cancelled"]
CLOSED_STATUSES: tuple[ClosedStatus, ...] = ("finished", "cancelled")
"""The statuses a purge deletes: instances that accept no more events."""

PURGE_BATCH = 100
"""Rows listed, and deleted in one write, per batch."""


def check_retention(retention: float | None, what: str = "retention") -> float | None:
    """*retention* (seconds; ``None`` or ``math.inf``: keep forever) if valid.

    Raises:
        InvalidInputError: not a number of seconds >= 0.
    """
    if retention is None:
        return None
    given: object = retention
    if isinstance(given, bool) or not isinstance(given, int | float) or not given >= 0:
        raise InvalidInputError(
            f"{what} must be a number of seconds >= 0 (or None: keep forever), got "
            f"{retention!r}"
        )
    return float(given)


def closed_listing(
    status: ClosedStatus,
    *,
    workflow: str | None = None,
    after: str | None = None,
    limit: int = PURGE_BATCH,
) -> ListOp:
    """The read of the next batch of *status* rows (of *workflow*) after *after*."""
    return ListOp(status=status, workflow=workflow, after=after, limit=limit)


def purge_ops(records: Iterable[StoredRecord], *, before_ms: int) -> list[DeleteOp]:
    """The deletes of the closed workflow rows of *records* last changed before
    *before_ms* (wall-clock milliseconds of the store's clock)."""
    return [
        DeleteOp(
            workflow_instance_id=r.workflow_instance_id,
            expected_revision=r.revision,
            closed_only=True,
        )
        for r in records
        if r.status in CLOSED_STATUSES
        and r.lease_owner is None
        and r.updated_at_ms < before_ms
        and not is_execution_plan(r.workflow)
    ]
