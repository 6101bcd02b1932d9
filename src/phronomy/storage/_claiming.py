"""Claims written once over a backend's ``apply``: the load-and-claim, its posting and
the pending inbox entries it returns."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from msgspec.structs import replace

from ._inbox import Claimed, InboxEntry, PostOutcome
from ._ops import BeginOp, EntryOp, InboxOp, LoadOp, PostOp
from ._store import claimable

if TYPE_CHECKING:
    from ._ops import ClaimOp, StoreOp
    from ._records import StoredRecord

__all__ = ["Claim", "claim_and_post", "inbox_of", "load_and_claim"]

C = TypeVar("C")

Apply = Callable[[C, "StoreOp"], Any]
Claim = Callable[
    [C, "ClaimOp", "StoredRecord | None"], "tuple[StoredRecord | None, int | None]"
]
"""A backend's claim without the inbox part (``BaseStore._claim``): its connection,
the operation and the row its posting's numbering returned, if any."""


def load_and_claim(
    apply: Apply[C], conn: C, op: ClaimOp, known: StoredRecord | None = None
) -> tuple[StoredRecord | None, int | None]:
    """A :class:`~phronomy.storage.ClaimOp` as a load, then a claim at the revision it
    read (a new instance: one statement that creates and claims it). *known*: the row
    as this transaction already read it under its write lock (a posting's numbering
    returns it): no load then, if it holds its snapshot (a row at revision 0 has
    none)."""
    iid = op.workflow_instance_id
    if known is not None and (known.snapshot is not None or not known.revision):
        return _claim_row(apply, conn, op, known)
    if op.create:  # the common case, a new instance: one statement
        new = BeginOp(
            workflow_instance_id=iid,
            workflow=op.workflow,
            lease_owner=op.lease_owner,
            ttl_ms=op.ttl_ms,
            only_new=True,
        )
        created: int | None = apply(conn, new)
        if created is not None:
            return None, created
    return _claim_row(apply, conn, op, apply(conn, LoadOp(workflow_instance_id=iid)))


def _claim_row(
    apply: Apply[C], conn: C, op: ClaimOp, row: StoredRecord | None
) -> tuple[StoredRecord | None, int | None]:
    """Claim the instance of *op*, whose *row* this transaction read."""
    iid = op.workflow_instance_id
    if not claimable(op, row):
        return row, None
    begin = BeginOp(
        workflow_instance_id=iid,
        workflow=op.workflow,
        expected_revision=row.revision if row is not None and row.revision else None,
        lease_owner=op.lease_owner,
        ttl_ms=op.ttl_ms,
    )
    epoch: int | None = apply(conn, begin)
    return row, epoch


def claim_and_post(
    apply: Apply[C],
    conn: C,
    op: ClaimOp,
    claim: Claim[C],
) -> Claimed:
    """Run *op* with its posting (first, under the instance's row; a new instance's
    once *claim* made its row) and its pending entries, in one transaction."""
    posting = op.post
    posted: PostOutcome | None = None
    if posting is not None:
        posted = apply(conn, PostOp(posting=posting, wait=False))
    known = posted.row if posted is not None and posted.outcome == "stored" else None
    row, epoch = claim(conn, op, known)
    if posted is not None and known is not None and known.snapshot is not None:
        posted = replace(posted, row=replace(known, snapshot=None))  # as a post's row
    made = epoch is not None and posted is not None and posted.outcome == "missing"
    if posting is not None and made:  # the claim made the row: store it now
        posted = apply(conn, PostOp(posting=posting))
    stored = posted.entry if posted is not None and posted.outcome == "stored" else None
    pending: tuple[InboxEntry, ...] = ()
    if op.pending and (row is not None or posting is not None):  # a new row has none
        if stored is not None and stored.seq == 1:  # numbers start at 1, no gaps:
            pending = (stored,)  # the inbox's first entry is its only one
        else:
            inbox = InboxOp(
                workflow_instance_id=op.workflow_instance_id, limit=op.pending
            )
            pending = apply(conn, inbox)
    return Claimed(row=row, epoch=epoch, pending=pending, posted=posted)


def inbox_of(
    apply: Apply[C], conn: C, op: ClaimOp
) -> tuple[PostOutcome | None, tuple[InboxEntry, ...]]:
    """What a committed claim's posting stored, and the instance's pending entries
    (read back after an unknown outcome)."""
    posted = None
    posting = op.post
    if posting is not None:
        key = EntryOp(
            workflow_instance_id=posting.workflow_instance_id,
            event_id=posting.event_id,
        )
        entry: InboxEntry | None = apply(conn, key)
        posted = PostOutcome(
            outcome="stored" if entry is not None else "missing", entry=entry
        )
    pending: tuple[InboxEntry, ...] = ()
    if op.pending:
        inbox = InboxOp(workflow_instance_id=op.workflow_instance_id, limit=op.pending)
        pending = apply(conn, inbox)
    return posted, pending
