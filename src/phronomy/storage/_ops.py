"""The operations of the store contract: everything a runtime asks of a store.

A store runs a batch of operations with :meth:`~phronomy.storage.WorkflowStore.execute`:
reads on a connection that sees committed data, writes in one transaction (group
commit), each write still revision-checked on its own. Each backend implements one
``apply(connection, op)``; the batch logic around it is written once
(:class:`~phronomy.storage.BaseStore`).
"""

from __future__ import annotations

from typing import Literal, final

import msgspec

from phronomy.errors import InvalidInputError

from ._inbox import Posting
from ._records import Consumption, InstanceStatus, Lease, SaveRequest, check_op_limit
from ._schedules import (
    DeleteScheduleOp,
    PutScheduleOp,
    ScheduleOp,
    SchedulesOp,
    TickOp,
)

__all__ = [
    "READ_OPS",
    "BeginOp",
    "ClaimOp",
    "DeleteOp",
    "EntryOp",
    "FindWriteOp",
    "HistoryOp",
    "InboxOp",
    "ListOp",
    "LoadOp",
    "MarkOp",
    "PollOp",
    "PostOp",
    "RecoverOp",
    "RenewOp",
    "RequestCancelOp",
    "RevisionOp",
    "SaveOp",
    "StoreOp",
    "TakeoversOp",
    "TerminateOp",
    "op_name",
]


@final
class LoadOp(msgspec.Struct, frozen=True, kw_only=True, gc=False, tag="load"):
    """Read one row; the result is a :class:`StoredRecord` or ``None``."""

    workflow_instance_id: str


@final
class ListOp(msgspec.Struct, frozen=True, kw_only=True, gc=False, tag="list"):
    """List rows without snapshots, ordered by id; the result is an :class:`InstancePage`."""

    status: InstanceStatus | None = None
    limit: int = 100
    after: str | None = None
    workflow: str | None = None


@final
class HistoryOp(msgspec.Struct, frozen=True, kw_only=True, gc=False, tag="history"):
    """The committed saves of an instance, newest first (at most *limit*); the result is
    a list of :class:`SaveLogEntry`."""

    workflow_instance_id: str
    limit: int = 100


@final
class FindWriteOp(
    msgspec.Struct, frozen=True, kw_only=True, gc=False, tag="find_write"
):
    """The revision a save with *write_id* committed, or ``None`` if it never did.

    Stores remember at least the last :data:`SAVE_LOG_DEPTH` saves of an instance; an
    older one may be reported as ``None`` (reconciliation then fails closed).
    """

    workflow_instance_id: str
    write_id: str


@final
class BeginOp(msgspec.Struct, frozen=True, kw_only=True, gc=False, tag="begin"):
    """Claim an instance: mark it ``running`` if it is still at *expected_revision*.

    Creates a revision-0 placeholder row when the instance has none yet. With
    *lease_owner*, the row's lease goes to that owner for *ttl_ms* (on the store's
    clock) — only if no other owner holds an unexpired one. The result is the new
    fencing epoch, or ``None`` when nothing was claimed (the row moved on, requires
    recovery, or another runtime holds its lease).
    """

    workflow_instance_id: str
    workflow: str
    expected_revision: int | None = None
    lease_owner: str | None = None
    ttl_ms: int = 0
    only_new: bool = False
    """Claim only an instance that has no row yet (create it); never an existing one."""


@final
class ClaimOp(msgspec.Struct, frozen=True, kw_only=True, gc=False, tag="claim"):
    """Load an instance and, if it may be claimed, claim it in the same transaction.

    The row is claimed (see :class:`BeginOp`, at its current revision) when its status
    is one of *statuses*, when it is a placeholder whose segment failed before its
    first save (revision 0, ``failed``) and *placeholders* is set, or when there is none
    and *create* is set. A ``recovery_required`` row, and one under another runtime's
    unexpired lease, is never claimed. The result is a
    :class:`~phronomy.storage.Claimed`: the row as it was before the claim (``None`` if
    absent) and the new fencing epoch (``None`` when nothing was claimed: the row says
    why), the pending inbox entries asked for, and what the posting did.
    """

    workflow_instance_id: str
    workflow: str
    lease_owner: str
    ttl_ms: int
    statuses: tuple[InstanceStatus, ...] = ()
    create: bool = False
    placeholders: bool = False
    post: Posting | None = None
    """An event to store in the instance's inbox in the same transaction (see
    :class:`PostOp`; stored once the claim made a new instance's row, when *create*
    is set)."""
    pending: int = 0
    """Return up to this many of the instance's pending inbox entries (claimed or
    not), oldest first."""

    def __post_init__(self) -> None:
        if self.post is not None and (
            self.post.workflow_instance_id != self.workflow_instance_id
        ):
            raise InvalidInputError(
                f"a claim of workflow instance {self.workflow_instance_id!r} posts "
                f"for another instance ({self.post.workflow_instance_id!r})"
            )
        if isinstance(self.pending, bool) or self.pending < 0:
            raise InvalidInputError(f"pending must be >= 0, got {self.pending!r}")


@final
class RenewOp(msgspec.Struct, frozen=True, kw_only=True, gc=False, tag="renew"):
    """Renew the leases *owner* still holds on *instance_ids* for *ttl_ms* (a heartbeat).

    ``ttl_ms=0`` releases them: they expire at once, for the recovery sweep. The result
    maps each instance whose lease *owner* still holds to ``(epoch, cancel_requested,
    renewed)``; an instance missing from it was taken over (or has ended). ``renewed``
    is false when another transaction was writing the row at that moment (a renewal
    never waits for a row: its lease keeps its expiry, and the next heartbeat renews
    it).
    """

    owner: str
    instance_ids: tuple[str, ...]
    ttl_ms: int


@final
class RequestCancelOp(
    msgspec.Struct, frozen=True, kw_only=True, gc=False, tag="request_cancel"
):
    """Ask the runtime that holds a ``running`` instance's lease to cancel it.

    The result is ``(epoch, written)``: that lease's epoch, and whether the request is
    now in the row. It is not (``False``) while another transaction writes the row
    (PostgreSQL never waits for it): ask again. ``None`` if the instance is not
    running under a lease (any more).
    """

    workflow_instance_id: str
    reason: str | None = None


@final
class RecoverOp(msgspec.Struct, frozen=True, kw_only=True, gc=False, tag="recover"):
    """Take over up to *limit* ``running`` instances whose lease expired (their runtime
    stopped) and put each back at its last saved revision, released.

    Each goes back to the status it had when that revision was saved (``halted``,
    ``finished``, ...): the event or start that was running was never acknowledged. An
    instance that never saved becomes ``failed``; one taken over *max_takeovers* times
    without a save in between becomes ``recovery_required``. Each takeover increments
    the epoch, so a late write of the stopped runtime is refused. The instances whose
    lease expired first go first; one another transaction is writing is left for a
    later sweep (never waited for). The result lists ``(instance_id, status)`` of the
    instances recovered (fewer than *limit*: no more could be taken over now).
    """

    limit: int = 100
    max_takeovers: int = 5


@final
class SaveOp(msgspec.Struct, frozen=True, kw_only=True, gc=False, tag="save"):
    """A revision-checked save; the result is a classified :class:`SaveOutcome`.

    ``expected_revision=None`` creates revision 1 (also over a revision-0 placeholder);
    ``expected_revision=N`` on revision N creates N+1; anything else is a conflict.
    """

    request: SaveRequest


@final
class MarkOp(msgspec.Struct, frozen=True, kw_only=True, gc=False, tag="mark"):
    """Set the status of a row still at *expected_revision* (any revision if ``None``).

    Metadata only; the result says whether a row changed. With ``create=True`` (and no
    *lease*, and no revision above 0 expected) a missing row becomes a revision-0
    placeholder of *workflow* with that status, so a failure or an unknown outcome stays
    visible (and fail-closed) even for an instance that never saved. With *lease*, only a row that holds that lease changes (the writer's
    segment still owns it); without one, never a ``running`` row under a lease (only
    its holder may change it). A mark to ``running`` or ``recovery_required`` keeps
    the row's lease; any other status releases it.
    """

    workflow_instance_id: str
    status: InstanceStatus
    expected_revision: int | None = None
    detail: str | None = None
    create: bool = False
    workflow: str = ""
    lease: Lease | None = None
    consumed: tuple[Consumption, ...] = ()
    """Inbox entries this write consumes (see :class:`SaveRequest`)."""


@final
class PostOp(msgspec.Struct, frozen=True, kw_only=True, gc=False, tag="post"):
    """Store an event in an instance's inbox; the result is a
    :class:`~phronomy.storage.PostOutcome`.

    The entry gets the instance's next sequence number, under the instance's row (so
    entries are applied in the order they were stored). A posting whose ``event_id``
    the inbox holds already stores nothing: it is answered with the first entry. An
    instance that is finished or cancelled, or does not exist, stores nothing.

    Attributes:
        posting: the event.
        wait: wait for a lock another transaction holds on the instance's row
            (PostgreSQL; bounded by the store's ``lock_timeout``). A claim's posting
            does not wait: a row another transaction has locked refuses it as busy
            (:class:`~phronomy.BusyError`, nothing stored).
    """

    posting: Posting
    wait: bool = True


@final
class InboxOp(msgspec.Struct, frozen=True, kw_only=True, gc=False, tag="inbox"):
    """An instance's inbox entries (a read): the pending ones after sequence number
    *after*, oldest first, or (``pending_only=False``) the last *limit* of all,
    newest first. The result is a tuple of :class:`~phronomy.storage.InboxEntry`."""

    workflow_instance_id: str
    pending_only: bool = True
    after: int = 0
    limit: int = 100

    def __post_init__(self) -> None:
        check_op_limit(self.limit)


@final
class EntryOp(msgspec.Struct, frozen=True, kw_only=True, gc=False, tag="entry"):
    """The inbox entry with *event_id* (a read), or ``None``."""

    workflow_instance_id: str
    event_id: str


@final
class PollOp(msgspec.Struct, frozen=True, kw_only=True, gc=False, tag="poll"):
    """Pending inbox entries a runtime may act on (a read, one indexed query): those of
    instances under *owner*'s lease, and of halted instances of *workflows* that no
    runtime holds. The result is a tuple of ``(entry, status, workflow, lease_owner)``,
    by instance and sequence."""

    owner: str
    workflows: tuple[str, ...] = ()
    limit: int = 500

    def __post_init__(self) -> None:
        check_op_limit(self.limit)


@final
class NextDueOp(msgspec.Struct, frozen=True, kw_only=True, gc=False, tag="next_due"):
    """Milliseconds until the first timer of *workflows* is due (a read: one indexed
    lookup per workflow; ``<= 0``: one is due now; ``None``: none is armed), whoever
    may fire it (a :class:`FireOp` says; *owner* is the runtime's)."""

    owner: str
    workflows: tuple[str, ...] = ()


@final
class FireOp(msgspec.Struct, frozen=True, kw_only=True, gc=False, tag="fire"):
    """Fire up to *limit* due timers of *workflows* into instances *owner* holds, or
    that no runtime holds (halted or failed), or that require recovery: each is
    deleted and its event stored in its instance's inbox, in one transaction (the
    result is how many events were stored)."""

    owner: str
    workflows: tuple[str, ...] = ()
    limit: int = 500

    def __post_init__(self) -> None:
        check_op_limit(self.limit)


@final
class TimersOp(msgspec.Struct, frozen=True, kw_only=True, gc=False, tag="timers"):
    """An instance's pending timers, soonest first (a read): a tuple of
    :class:`~phronomy.storage.StoredTimer`."""

    workflow_instance_id: str


@final
class RevisionOp(msgspec.Struct, frozen=True, kw_only=True, gc=False, tag="revision"):
    """A logged revision of an instance as its row was then (a read): a
    :class:`~phronomy.storage.StoredRecord` without a lease (its workflow the row's
    today, ``updated_at_ms`` the save's commit), or ``None`` when the revision is not
    among the saves the store keeps (``save_log_depth``). Its ``snapshot`` is ``None``
    for a save logged before the store kept states (SQLite schema 7, PostgreSQL 6)."""

    workflow_instance_id: str
    revision: int


@final
class TakeoversOp(msgspec.Struct, frozen=True, kw_only=True, gc=False, tag="takeovers"):
    """An instance's logged takeovers by the recovery sweep, newest first (a read): a
    tuple of :class:`~phronomy.storage.Takeover`, at most *limit*."""

    workflow_instance_id: str
    limit: int = 32

    def __post_init__(self) -> None:
        check_op_limit(self.limit)


@final
class PendingOp(msgspec.Struct, frozen=True, kw_only=True, gc=False, tag="pending"):
    """What waits in the store for instances of *workflows* (a read, for metrics):
    ``(events, timers)``, the number of their pending inbox entries and of their
    armed timers. Counted on indexes (each pending entry, each timer of those
    workflows once): a caller runs it every few seconds, not per poll."""

    workflows: tuple[str, ...]


@final
class TerminateOp(msgspec.Struct, frozen=True, kw_only=True, gc=False, tag="terminate"):
    """Close a row at *expected_revision* whoever holds its lease (an operator's
    forced stop): it gets *status* and *detail*, its lease is released and its epoch
    incremented, so that a live holder's later writes are refused
    (:class:`~phronomy.LeaseLostError`). A finished or cancelled row is left alone.
    Metadata only (the revision is kept). The result says whether the row changed.
    """

    workflow_instance_id: str
    expected_revision: int
    status: Literal["cancelled", "failed"] = "cancelled"
    detail: str | None = None


@final
class DeleteOp(msgspec.Struct, frozen=True, kw_only=True, gc=False, tag="delete"):
    """Delete a row at *expected_revision* (a conflict otherwise); with *closed_only*,
    only a finished or cancelled row (a purge: a closed row claimed again meanwhile,
    at the same revision, is kept)."""

    workflow_instance_id: str
    expected_revision: int
    closed_only: bool = False


StoreOp = (
    LoadOp
    | ListOp
    | HistoryOp
    | FindWriteOp
    | BeginOp
    | SaveOp
    | MarkOp
    | DeleteOp
    | TerminateOp
    | RenewOp
    | RecoverOp
    | ClaimOp
    | RequestCancelOp
    | PostOp
    | InboxOp
    | EntryOp
    | PollOp
    | NextDueOp
    | FireOp
    | TimersOp
    | PendingOp
    | RevisionOp
    | TakeoversOp
    | PutScheduleOp
    | DeleteScheduleOp
    | ScheduleOp
    | SchedulesOp
    | TickOp
)
"""Every operation a store runs."""

READ_OPS = (
    LoadOp,
    ListOp,
    HistoryOp,
    FindWriteOp,
    InboxOp,
    EntryOp,
    PollOp,
    NextDueOp,
    TimersOp,
    PendingOp,
    RevisionOp,
    TakeoversOp,
    ScheduleOp,
    SchedulesOp,
)
"""Operations that only read (they run on the read lane, outside write transactions)."""


def op_name(op: StoreOp) -> str:
    """The operation's name (``"load"``, ``"save"``, ...), used by fault points."""
    return type(op).__struct_config__.tag  # type: ignore[return-value]
