"""Resolving a ``recovery_required`` row: the store-side half of operator recovery."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from phronomy.errors import ConflictError, NotFoundError

from ._codec import FINISH_PHASE
from ._ops import LoadOp, MarkOp
from ._quarantine import quarantined, release_quarantine
from ._store import run_op

if TYPE_CHECKING:
    from ._records import InstanceStatus, StoredRecord
    from ._store import WorkflowStore

__all__ = ["resolution", "resolve_stored"]


def resolution(
    record: StoredRecord | None,
    workflow_instance_id: str,
    action: Literal["adopt", "release"],
    *,
    by: str,
    quarantined: bool,
) -> MarkOp:
    """The revision-checked write that resolves a ``recovery_required`` instance.

    ``adopt`` takes the durable record as the truth: ``finished`` or ``halted`` from its
    phase (``failed`` if it never saved a phase). ``release`` marks it ``failed`` so the
    instance can be retried from its last durable revision. An instance this process
    *quarantined* (its ``recovery_required`` mark could not be written) counts as
    requiring recovery too.

    Args:
        record: the instance's row, as read.
        workflow_instance_id: the instance.
        action: ``"adopt"`` or ``"release"``.
        by: who resolves it, recorded in the row's ``detail``.
        quarantined: whether this process refuses the instance (see
            :func:`~phronomy.storage.quarantined`).

    Raises:
        NotFoundError: the instance does not require recovery.
    """
    iid = workflow_instance_id
    if record is None or (record.status != "recovery_required" and not quarantined):
        raise NotFoundError(f"workflow instance {iid!r} does not require recovery")
    status: InstanceStatus
    if action == "release":
        status, detail = "failed", f"released for retry by {by}"
    else:
        status = (
            "finished"
            if record.phase == FINISH_PHASE
            else ("halted" if record.phase else "failed")
        )
        detail = f"durable revision {record.revision} adopted by {by}"
    return MarkOp(
        workflow_instance_id=iid,
        status=status,
        expected_revision=record.revision,
        detail=detail,
    )


def resolve_stored(
    store: WorkflowStore,
    workflow_instance_id: str,
    action: Literal["adopt", "release"],
    *,
    by: str = "an operator",
) -> StoredRecord:
    """Settle a ``recovery_required`` row in *store* (blocking; see :func:`resolution`).

    Resolving lifts the instance's quarantine in this process.

    Returns:
        The row after the resolution.

    Raises:
        NotFoundError: the instance does not require recovery.
        ConflictError: the row changed during the resolution (try again).
    """
    iid = workflow_instance_id
    record: StoredRecord | None = run_op(store, LoadOp(workflow_instance_id=iid))
    fenced = quarantined(store.identity, iid) is not None
    op = resolution(record, iid, action, by=by, quarantined=fenced)
    if not run_op(store, op):
        raise ConflictError(
            f"workflow instance {iid!r} changed during resolution; retry"
        )
    resolved: StoredRecord | None = run_op(store, LoadOp(workflow_instance_id=iid))
    if resolved is None:
        raise ConflictError(f"workflow instance {iid!r} was deleted during resolution")
    release_quarantine(store.identity, iid)
    return resolved
