"""Claims and their outcomes: which stored instances a command runs on, why a claim
was refused, and what a segment that ended without its save writes instead."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from phronomy.durability import mark_op
from phronomy.errors import (
    BusyError,
    ConflictError,
    EventRejectedError,
    LeaseLostError,
    NotFoundError,
    RecoveryRequiredError,
    RuntimeShutdownError,
)
from phronomy.storage import DeleteOp

from ._hydration import DurableBase
from ._messages import ResumeCommand, StartCommand

if TYPE_CHECKING:
    from phronomy.storage import InstanceStatus, Lease, MarkOp, StoredRecord

__all__ = [
    "UNCHANGED",
    "Command",
    "Loaded",
    "busy_elsewhere",
    "refused",
    "release_op",
    "runs_on",
    "segment_mark",
]

Command = StartCommand | ResumeCommand

Loaded = tuple["StoredRecord | None", Any, "Exception | None", "int | None"]
"""A load's result: the row, its decoded snapshot, a decoding error, the claim's epoch."""

_ANY_STATUS: tuple[InstanceStatus, ...] = (
    "running",
    "halted",
    "finished",
    "failed",
    "cancelled",
)


def runs_on(cmd: Command) -> tuple[tuple[InstanceStatus, ...], bool]:
    """The stored statuses the command runs on (its load claims them) and whether it
    runs on a new instance; other cases are decided once the row is read."""
    if isinstance(cmd, ResumeCommand):
        return ("halted", "running", "failed"), False
    if cmd.if_exists == "restart":
        return _ANY_STATUS, True
    if cmd.if_exists == "refuse":
        return ("finished", "failed", "cancelled"), True
    return (), True  # "return": only a new instance runs without a stored result


UNCHANGED = (
    RuntimeShutdownError,
    RecoveryRequiredError,
    EventRejectedError,
    LeaseLostError,
    NotFoundError,
)
"""Segment errors that leave the durable instance's last revision as it was: a
cut-off at shutdown and a rejected event (the row goes back to what that revision
says), an unknown save outcome (marked separately), a lost lease (another runtime
owns the instance now)."""


def release_op(
    cmd: Command, record: StoredRecord | None, lease: Lease
) -> MarkOp | DeleteOp:
    """The write that gives back a claim the load made for a command that then did
    not run: the row goes back as it was (a row the claim created goes away)."""
    iid = cmd.workflow_instance_id
    if record is None:
        return DeleteOp(workflow_instance_id=iid, expected_revision=0)
    status = record.status
    if status == "running":  # its runtime stopped: what its last save says
        status = DurableBase.of(record).status
    return mark_op(
        iid,
        status,
        expected_revision=record.revision or None,
        detail=record.detail,
        workflow=record.workflow,
        lease=lease,
    )


def segment_mark(
    cmd: Command, base: DurableBase, error: BaseException, lease: Lease | None
) -> MarkOp | None:
    """The status write a durable segment that failed with *error* needs, if any."""
    iid, expected = cmd.workflow_instance_id, base.expected or 0
    detail: str | None
    if isinstance(error, RuntimeShutdownError):
        # The claim marked the row "running" but nothing runs it any more: back to
        # what its last durable revision says (the lease goes with it).
        unchanged = (
            f"revision {base.expected} is unchanged"
            if base.expected
            else "it had not saved yet"
        )
        status = base.status
        detail = f"its segment was cut off when the runtime shut down; {unchanged}"
    elif isinstance(error, EventRejectedError):
        status, detail = base.status, None  # as it was before the event
    elif not isinstance(error, UNCHANGED):
        status, detail = "failed", f"{type(error).__name__}: {error}"
    else:
        return None
    return mark_op(
        iid,
        status,
        expected_revision=expected,
        detail=detail,
        workflow=cmd.definition.name,
        lease=lease,
    )


def refused(iid: str, base: DurableBase, row: StoredRecord | None) -> Exception:
    """Why a claim was refused, from the row read after it."""
    if row is None:
        return NotFoundError(
            f"workflow instance {iid!r} was deleted while it was being admitted"
        )
    if row.status == "recovery_required":
        return RecoveryRequiredError(
            f"workflow instance {iid!r} requires recovery: {row.detail or 'unknown'}"
        )
    if row.revision != (base.expected or 0):
        return ConflictError(
            f"workflow instance {iid!r} moved on to revision {row.revision} (another "
            f"runtime saved it) while this runtime admitted it at revision "
            f"{base.expected or 0}; send the event again"
        )
    return busy_elsewhere(iid, row)


def busy_elsewhere(iid: str, row: StoredRecord | None) -> BusyError:
    """The refusal of an instance another runtime runs (*row*: as read, if any)."""
    held = (
        ""
        if row is None or row.lease_owner is None
        else (f" (lease epoch {row.lease_epoch}, owner {row.lease_owner})")
    )
    return BusyError(
        f"Workflow instance {iid!r} already has a live execution segment in another "
        f"runtime{held}"
    )
