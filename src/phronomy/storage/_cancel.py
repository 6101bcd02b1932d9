"""Cancelling a stored instance that no segment runs: the store-side half."""

from __future__ import annotations

from typing import TYPE_CHECKING

from phronomy.errors import InstanceStateError, NotFoundError, RecoveryRequiredError

from ._codec import FINISH_PHASE, decode_snapshot_builtins, encode_snapshot
from ._ops import MarkOp, SaveOp
from ._records import SaveRequest

if TYPE_CHECKING:
    from ._records import StoredRecord

__all__ = ["cancellation"]


def cancellation(
    record: StoredRecord | None,
    workflow_instance_id: str,
    *,
    reason: str | None,
    write_id: str,
    force: bool = False,
) -> SaveOp | MarkOp | None:
    """The revision-checked write that cancels a stored instance (not live here).

    A saved instance gets a new revision with the same state and phase and the status
    ``cancelled`` (the reason in its detail); one that never saved is marked. Pure:
    it decides and encodes, the caller writes.

    Args:
        record: the instance's row, as read.
        workflow_instance_id: the instance.
        reason: why, saved with the row.
        write_id: the save's ``write_id``.
        force: cancel a ``running`` row that holds no lease too (left by a release
            without leases; only when no process runs it).

    Returns:
        The write, or ``None`` when the instance is cancelled already (idempotent).

    Raises:
        NotFoundError: nothing is stored under that id.
        InstanceStateError: it is finished, or ``running`` under another runtime's
            lease, or ``running`` without a lease and without *force*.
        RecoveryRequiredError: it requires recovery first.
        CorruptRecordError: its snapshot does not decode.
    """
    iid = workflow_instance_id
    if record is None:
        raise NotFoundError(f"workflow instance {iid!r} does not exist")
    if record.status == "cancelled":
        return None
    if record.status == "recovery_required":
        raise RecoveryRequiredError(
            f"workflow instance {iid!r} requires recovery; resolve it before "
            "cancelling it",
            instance_id=iid,
        )
    if record.status == "finished":
        raise InstanceStateError(
            f"workflow instance {iid!r} is finished (revision {record.revision}); "
            "there is nothing to cancel"
        )
    if record.status == "running" and record.lease_owner is not None:
        raise InstanceStateError(
            f"workflow instance {iid!r} is running in another runtime (lease epoch "
            f"{record.lease_epoch}, owner {record.lease_owner}): cancel it from that "
            "runtime, or once it halts. If that runtime stopped, a recovery sweep puts "
            "the instance back at its last saved revision once the lease expired; "
            "cancel it then"
        )
    if record.status == "running" and not force:
        raise InstanceStateError(
            f"workflow instance {iid!r} is running without a lease: a runtime of a "
            "release without leases left it so (it may still run it). If you know no "
            "process runs it, cancel with force=True"
        )
    detail = f"cancelled: {reason}" if reason else "cancelled"
    if record.snapshot is None:
        return MarkOp(
            workflow_instance_id=iid,
            status="cancelled",
            expected_revision=record.revision,
            detail=detail,
            workflow=record.workflow,
        )
    stored = decode_snapshot_builtins(
        record.snapshot, workflow_instance_id=iid, revision=record.revision
    )
    revision = record.revision + 1
    phase = record.phase if record.phase is not None else FINISH_PHASE
    snapshot = encode_snapshot(
        stored.fields,
        workflow_instance_id=iid,
        revision=revision,
        phase=phase,
        workflow=record.workflow,
    )
    return SaveOp(
        request=SaveRequest(
            workflow_instance_id=iid,
            expected_revision=record.revision,
            snapshot=snapshot,
            write_id=write_id,
            status="cancelled",
            phase=phase,
            workflow=record.workflow,
            definition_version=record.definition_version,
            detail=detail,
        )
    )
