"""Claims and their outcomes: which stored instances a command runs on, why a claim
was refused, and what a segment that ended without its save writes instead."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, final

import msgspec

from phronomy.durability import mark_op
from phronomy.errors import (
    BusyError,
    EventRejectedError,
    InstanceExistsError,
    InstanceStateError,
    LeaseLostError,
    NotFoundError,
    RecoveryRequiredError,
    RuntimeShutdownError,
)
from phronomy.storage import (
    OPEN_STATUSES,
    Consumption,
    DeleteOp,
    InboxEntry,
    PostOutcome,
    StoredRecord,
    is_execution_plan,
)

from ._definition import FINISH
from ._hydration import DurableBase, decode_stored
from ._messages import ResumeCommand, StartCommand, WorkflowResult

if TYPE_CHECKING:
    from phronomy.storage import Claimed, InstanceStatus, Lease, MarkOp

__all__ = [
    "UNCHANGED",
    "Command",
    "Loaded",
    "busy_elsewhere",
    "checked_workflow",
    "decode_claim",
    "exists_error",
    "refusal",
    "release_op",
    "runs_on",
    "segment_mark",
    "stored_result",
]

Command = StartCommand | ResumeCommand


@final
class Loaded(msgspec.Struct, frozen=True, kw_only=True):
    """A durable command's load (and claim), decoded in the store's worker thread.

    Attributes:
        record: the row as it was before the claim, if any.
        decoded: its decoded snapshot, if any.
        problem: why it could not be decoded.
        epoch: the claim's epoch, or ``None`` when nothing was claimed.
        pending: the instance's pending inbox entries, oldest first.
        posted: what the command's posting did, if it had one.
    """

    record: StoredRecord | None
    decoded: Any
    problem: Exception | None
    epoch: int | None
    pending: tuple[InboxEntry, ...] = ()
    posted: PostOutcome | None = None


def decode_claim(cmd: Command, resuming: bool, claimed: Claimed) -> Loaded:
    """What the claim of *cmd* loaded, decoded (in the store's worker thread: decoding
    stays off the dispatcher). Never raises: a claim that was made must be released."""
    record, decoded, problem = claimed.row, None, None
    try:
        if record is None or checked_workflow(cmd, record):
            decoded = decode_stored(cmd.definition, record, resuming=resuming)[1]
        # else a new execution of a key: its input is its whole state
    except Exception as exc:  # noqa: BLE001 - reported on the dispatcher
        problem = exc
    return Loaded(
        record=record,
        decoded=decoded,
        problem=problem,
        epoch=claimed.epoch,
        pending=claimed.pending,
        posted=claimed.posted,
    )


_ANY_STATUS: tuple[InstanceStatus, ...] = (
    "running",
    "halted",
    "finished",
    "failed",
    "cancelled",
)


_CLOSED: tuple[InstanceStatus, ...] = ("finished", "failed", "cancelled")


def runs_on(cmd: Command) -> tuple[tuple[InstanceStatus, ...], bool, bool]:
    """What the command's load claims: the stored statuses it runs on, whether it
    runs on a new instance, and whether on a placeholder that failed before its first
    save. A row it does not claim refuses the command (see :func:`refusal`)."""
    if isinstance(cmd, ResumeCommand):
        # a halted result given by the caller may be an ephemeral one: its first save
        # creates the instance
        return ("halted", "running", "failed"), cmd.halted is not None, False
    if cmd.if_exists == "restart":
        return _ANY_STATUS, True, True
    if cmd.if_exists == "restart_closed":
        return _CLOSED, True, True
    # "refuse" and "return": only an instance that has nothing durable yet runs
    return (), True, True


def checked_workflow(cmd: Command, row: StoredRecord) -> str:
    """The workflow *row* must belong to for *cmd* to run on it (``""``: any).

    A supervised execution's key runs one plan after another: a new execution
    (``restart_closed``) replaces a closed one of any plan (an open one refuses it).
    """
    name = cmd.definition.name
    if (
        isinstance(cmd, StartCommand)
        and cmd.if_exists == "restart_closed"
        and is_execution_plan(name)
        and is_execution_plan(row.workflow)
    ):
        return ""
    return name


def refusal(cmd: Command, row: StoredRecord | None) -> Exception:
    """Why the command's load did not claim *row* (the instance's row, if any)."""
    iid = cmd.workflow_instance_id
    live = row is not None and row.status == "running" and row.lease_owner is not None
    if isinstance(cmd, StartCommand):
        if row is None or (live and cmd.if_exists == "restart"):
            return busy_elsewhere(iid, row)
        return exists_error(row)
    if row is None and cmd.halted is not None:
        return busy_elsewhere(iid, row)  # created meanwhile by another runtime
    if row is None:
        return NotFoundError(
            f"workflow instance {iid!r} has no durable state to resume (the store "
            "has no instance with that id)"
        )
    if live:
        return busy_elsewhere(iid, row)
    if row.status in ("finished", "cancelled"):
        return InstanceStateError(
            f"workflow instance {iid!r} is {row.status} (revision {row.revision}): a "
            f"{row.status} instance accepts no events and nothing was written. Start a "
            "new instance (another workflow_instance_id), or start this id again "
            "from its stored fields with start(..., if_exists='restart')"
        )
    if row.revision == 0:
        return NotFoundError(
            f"workflow instance {iid!r} has no durable state to resume (its first "
            f"segment is {row.status} before it saved anything)"
        )
    return busy_elsewhere(iid, row)


def exists_error(row: StoredRecord) -> InstanceExistsError:
    """The refusal of a start whose id the store holds (if_exists='refuse')."""
    iid = row.workflow_instance_id
    where = (
        f"at {row.phase!r}, revision {row.revision}"
        if row.revision
        else "with nothing saved yet (live in another runtime, or its process stopped)"
    )
    send = f"send_event(workflow, event, workflow_instance_id={iid!r})"
    if row.status in OPEN_STATUSES:
        how = f"continue it with {send}"
    elif row.status == "failed":
        how = f"retry it from its last saved revision with {send}"
    else:
        how = f"a {row.status} instance accepts no events"
    return InstanceExistsError(
        f"workflow instance {iid!r} exists and is {row.status} {where}; {how}, or "
        "start with if_exists='return' (its stored result) or if_exists='restart' "
        "(run it again from its stored fields)",
        instance_id=iid,
        status=row.status,
        phase=row.phase,
        revision=row.revision,
    )


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
    cmd: Command,
    record: StoredRecord | None,
    lease: Lease,
    consumed: tuple[Consumption, ...] = (),
) -> MarkOp | DeleteOp:
    """The write that gives back a claim the load made for a command that then did
    not run: the row goes back as it was (a row the claim created goes away), and
    the inbox entries judged on the way are *consumed*."""
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
        consumed=consumed,
    )


def segment_mark(
    cmd: Command,
    base: DurableBase,
    error: BaseException,
    lease: Lease | None,
    consumed: tuple[Consumption, ...] = (),
) -> MarkOp | None:
    """The status write a durable segment that failed with *error* needs, if any; it
    consumes the inbox entries in *consumed* (the one that raised, or the resume event
    every guard rejected)."""
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
        consumed=consumed,
    )


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


def stored_result(
    cmd: StartCommand, record: StoredRecord, decoded: Any
) -> WorkflowResult[Any]:
    """``if_exists="return"``: the stored result, without running anything."""
    phase = record.phase or FINISH
    return WorkflowResult(
        state=decoded.fields,
        phase=phase,
        workflow_instance_id=cmd.workflow_instance_id,
        revision=record.revision,
        halted=record.status in ("halted", "running") and phase != FINISH,
        workflow=cmd.definition.name,
        status=record.status,
    )
