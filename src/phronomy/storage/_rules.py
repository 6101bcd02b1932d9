"""The store's status and lease rules, as one table.

Every store operation whose effect depends on the row it finds is one line per state
of that row in :data:`RULES`: its stored status (``absent``: no row) and who holds its
lease, as the operation sees it (:data:`Holder`). The SQL statements of SQLite and
PostgreSQL implement these rules, :class:`~phronomy.storage.MemoryStore` interprets
the table, and the differential store model checks all three against it
(``tests/storage/model_rules.py``).

Only ``running`` and ``recovery_required`` rows hold leases (every other status
releases it), so the other statuses have one line each (``free``), and ``mine``
appears only for operations made on behalf of a runtime (a claim, a renewal, a fenced
write, a firing, a poll).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, final

import msgspec

if TYPE_CHECKING:
    from ._records import StoredRecord

__all__ = [
    "RULES",
    "Holder",
    "Operation",
    "RowStatus",
    "Rule",
    "goes_ahead",
    "holder",
    "lookup",
]

Operation = Literal[
    "begin",  # BeginOp (and a ClaimOp of a row whose status it asks for)
    "begin_new",  # BeginOp(only_new=True) (and a ClaimOp(create=True) of no row)
    "save",  # SaveOp without a lease
    "save_fenced",  # SaveOp with the writer's lease
    "mark",  # MarkOp without a lease
    "mark_fenced",  # MarkOp with the writer's lease
    "delete",  # DeleteOp
    "renew",  # RenewOp, for each instance it names
    "request_cancel",  # RequestCancelOp
    "terminate",  # TerminateOp
    "recover",  # RecoverOp, for each row
    "post",  # PostOp (and a ClaimOp's posting, a FireOp's events)
    "fire",  # FireOp: whether the row's due timers may be fired
    "poll",  # PollOp: whether the row's pending entries are returned
]
"""The operations the table has rules for."""

RowStatus = Literal[
    "absent",
    "running",
    "halted",
    "finished",
    "failed",
    "cancelled",
    "recovery_required",
]
"""A row's stored status, or ``absent`` (no row)."""

Holder = Literal["free", "mine", "live", "expired"]
"""Who holds the row's lease, as an operation sees it.

``free``: no runtime. ``mine``: the operation's runtime (its owner; for a fenced write,
its owner and epoch). ``live``: another runtime (or another epoch), not expired yet.
``expired``: another runtime (or epoch), expired on the store's lease clock.
"""

Expectation = Literal["revision", "revision if given", "create", "served", "closed"]
"""What an allowed operation still checks of itself.

``revision``: the row is at the expected revision (``None`` counts as 0, no row as
revision 0). ``revision if given``: the same, unless none is expected. ``create``: it
asks to create the row. ``served``: the row's workflow is one the operation names.
``closed``: the row is finished or cancelled, if the operation asks for that.
"""

Refusal = Literal[
    "-", "None", "False", "ConflictError", "LeaseLostError", "missing", "closed", "left"
]
"""What an operation gives when it does not go ahead (the rule refuses it, or an
expectation fails): a result (``None``, ``False``; a posting's outcome ``missing`` or
``closed``; ``left``: the row is left out of a many-row result), or the error it raises
(``ConflictError``, ``LeaseLostError``). ``-``: it always goes ahead."""

LeaseEffect = Literal[
    "kept",
    "claimed",
    "taken over",
    "renewed",
    "cancel requested",
    "kept if running",
    "kept if running or recovery_required",
    "gone",
]
"""What an operation that goes ahead does to the row's lease.

``claimed``: to the claimer (none without an owner), expiring ``ttl`` from now, epoch
+ 1, no cancel request. ``taken over``: released (no holder, no expiry, no cancel
request), epoch + 1 (a late write of the old holder is refused). ``renewed``: its expiry moves to ``ttl`` from now. ``cancel requested``: kept, its
holder asked to cancel. ``kept if ...``: kept when the status written is one of those,
else released (epoch kept). ``gone``: the row is deleted.
"""

RevisionEffect = Literal["kept", "+1", "gone"]
"""What an operation that goes ahead does to the row's revision (no row counts as
revision 0: a row made by a claim or a mark is a revision-0 placeholder)."""

StatusEffect = Literal["kept", "running", "written", "swept", "gone"]
"""The row's status after an operation that goes ahead: ``written``: the one the
operation writes; ``swept``: see :func:`swept`."""


@final
class Rule(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One cell of the table: what an operation does to a row in one state."""

    allowed: bool
    """Whether the operation goes ahead (once its :attr:`expects` hold)."""
    error: Refusal
    """What it gives when it does not go ahead."""
    expects: tuple[Expectation, ...] = ()
    lease: LeaseEffect = "kept"
    revision: RevisionEffect = "kept"
    status: StatusEffect = "kept"


# rules-table-start
# --- the named rules (each line of the table is one of these) -------------------------

CLAIM = Rule(
    allowed=True, error="None", expects=("revision",), lease="claimed", status="running"
)
CLAIM_NEW = Rule(allowed=True, error="None", lease="claimed", status="running")
NO_CLAIM = Rule(allowed=False, error="None")
SAVE = Rule(
    allowed=True,
    error="ConflictError",
    expects=("revision",),
    lease="kept if running",
    revision="+1",
    status="written",
)
NO_SAVE = Rule(allowed=False, error="ConflictError")
NO_ROW = Rule(allowed=False, error="ConflictError")
LEASE_LOST = Rule(allowed=False, error="LeaseLostError")
MARK = Rule(
    allowed=True,
    error="False",
    expects=("revision if given",),
    lease="kept if running or recovery_required",
    status="written",
)
MARK_NEW = Rule(
    allowed=True,
    error="False",
    expects=("create", "revision if given"),
    lease="kept if running or recovery_required",
    status="written",
)
NO_MARK = Rule(allowed=False, error="False")
DELETE = Rule(
    allowed=True,
    error="ConflictError",
    expects=("revision", "closed"),
    lease="gone",
    revision="gone",
    status="gone",
)
RENEW = Rule(allowed=True, error="left", lease="renewed")
NO_RENEW = Rule(allowed=False, error="left")
CANCEL = Rule(allowed=True, error="None", lease="cancel requested")
NO_CANCEL = Rule(allowed=False, error="None")
TERMINATE = Rule(
    allowed=True,
    error="False",
    expects=("revision",),
    lease="taken over",
    status="written",
)
NO_TERMINATE = Rule(allowed=False, error="False")
SWEEP = Rule(allowed=True, error="left", lease="taken over", status="swept")
NO_SWEEP = Rule(allowed=False, error="left")
POST = Rule(allowed=True, error="-")
MISSING = Rule(allowed=False, error="missing")
CLOSED = Rule(allowed=False, error="closed")
FIRE = Rule(allowed=True, error="left")
NO_FIRE = Rule(allowed=False, error="left")
POLL = Rule(allowed=True, error="left")
POLL_SERVED = Rule(allowed=True, error="left", expects=("served",))
NO_POLL = Rule(allowed=False, error="left")

# --- the table --------------------------------------------------------------------------

RULES: dict[tuple[Operation, RowStatus, Holder], Rule] = {
    # claim a row: never one another runtime holds, nor one requiring recovery
    ("begin", "absent", "free"): CLAIM,
    ("begin", "running", "free"): CLAIM,
    ("begin", "running", "mine"): CLAIM,
    ("begin", "running", "live"): NO_CLAIM,
    ("begin", "running", "expired"): CLAIM,
    ("begin", "halted", "free"): CLAIM,
    ("begin", "finished", "free"): CLAIM,
    ("begin", "failed", "free"): CLAIM,
    ("begin", "cancelled", "free"): CLAIM,
    ("begin", "recovery_required", "free"): NO_CLAIM,
    ("begin", "recovery_required", "mine"): NO_CLAIM,
    ("begin", "recovery_required", "live"): NO_CLAIM,
    ("begin", "recovery_required", "expired"): NO_CLAIM,
    # claim only a new row
    ("begin_new", "absent", "free"): CLAIM_NEW,
    ("begin_new", "running", "free"): NO_CLAIM,
    ("begin_new", "running", "mine"): NO_CLAIM,
    ("begin_new", "running", "live"): NO_CLAIM,
    ("begin_new", "running", "expired"): NO_CLAIM,
    ("begin_new", "halted", "free"): NO_CLAIM,
    ("begin_new", "finished", "free"): NO_CLAIM,
    ("begin_new", "failed", "free"): NO_CLAIM,
    ("begin_new", "cancelled", "free"): NO_CLAIM,
    ("begin_new", "recovery_required", "free"): NO_CLAIM,
    ("begin_new", "recovery_required", "mine"): NO_CLAIM,
    ("begin_new", "recovery_required", "live"): NO_CLAIM,
    ("begin_new", "recovery_required", "expired"): NO_CLAIM,
    # a save without a lease: only of a row no runtime holds (expired or not)
    ("save", "absent", "free"): SAVE,
    ("save", "running", "free"): SAVE,
    ("save", "running", "live"): NO_SAVE,
    ("save", "running", "expired"): NO_SAVE,
    ("save", "halted", "free"): SAVE,
    ("save", "finished", "free"): SAVE,
    ("save", "failed", "free"): SAVE,
    ("save", "cancelled", "free"): SAVE,
    ("save", "recovery_required", "free"): SAVE,
    ("save", "recovery_required", "live"): NO_SAVE,
    ("save", "recovery_required", "expired"): NO_SAVE,
    # a save under a lease: only while the row holds that lease (expired or not)
    ("save_fenced", "absent", "free"): NO_ROW,
    ("save_fenced", "running", "free"): LEASE_LOST,
    ("save_fenced", "running", "mine"): SAVE,
    ("save_fenced", "running", "live"): LEASE_LOST,
    ("save_fenced", "running", "expired"): LEASE_LOST,
    ("save_fenced", "halted", "free"): LEASE_LOST,
    ("save_fenced", "finished", "free"): LEASE_LOST,
    ("save_fenced", "failed", "free"): LEASE_LOST,
    ("save_fenced", "cancelled", "free"): LEASE_LOST,
    ("save_fenced", "recovery_required", "free"): LEASE_LOST,
    ("save_fenced", "recovery_required", "mine"): SAVE,
    ("save_fenced", "recovery_required", "live"): LEASE_LOST,
    ("save_fenced", "recovery_required", "expired"): LEASE_LOST,
    # a mark without a lease: never of a running row a runtime holds
    ("mark", "absent", "free"): MARK_NEW,
    ("mark", "running", "free"): MARK,
    ("mark", "running", "live"): NO_MARK,
    ("mark", "running", "expired"): NO_MARK,
    ("mark", "halted", "free"): MARK,
    ("mark", "finished", "free"): MARK,
    ("mark", "failed", "free"): MARK,
    ("mark", "cancelled", "free"): MARK,
    ("mark", "recovery_required", "free"): MARK,
    ("mark", "recovery_required", "live"): MARK,
    ("mark", "recovery_required", "expired"): MARK,
    # a mark under a lease: only while the row holds that lease
    ("mark_fenced", "absent", "free"): NO_MARK,
    ("mark_fenced", "running", "free"): NO_MARK,
    ("mark_fenced", "running", "mine"): MARK,
    ("mark_fenced", "running", "live"): NO_MARK,
    ("mark_fenced", "running", "expired"): NO_MARK,
    ("mark_fenced", "halted", "free"): NO_MARK,
    ("mark_fenced", "finished", "free"): NO_MARK,
    ("mark_fenced", "failed", "free"): NO_MARK,
    ("mark_fenced", "cancelled", "free"): NO_MARK,
    ("mark_fenced", "recovery_required", "free"): NO_MARK,
    ("mark_fenced", "recovery_required", "mine"): MARK,
    ("mark_fenced", "recovery_required", "live"): NO_MARK,
    ("mark_fenced", "recovery_required", "expired"): NO_MARK,
    # a delete: any row at the expected revision, whoever holds it
    ("delete", "absent", "free"): NO_ROW,
    ("delete", "running", "free"): DELETE,
    ("delete", "running", "live"): DELETE,
    ("delete", "running", "expired"): DELETE,
    ("delete", "halted", "free"): DELETE,
    ("delete", "finished", "free"): DELETE,
    ("delete", "failed", "free"): DELETE,
    ("delete", "cancelled", "free"): DELETE,
    ("delete", "recovery_required", "free"): DELETE,
    ("delete", "recovery_required", "live"): DELETE,
    ("delete", "recovery_required", "expired"): DELETE,
    # a heartbeat renews the leases its runtime still holds, expired or not
    ("renew", "absent", "free"): NO_RENEW,
    ("renew", "running", "free"): NO_RENEW,
    ("renew", "running", "mine"): RENEW,
    ("renew", "running", "live"): NO_RENEW,
    ("renew", "running", "expired"): NO_RENEW,
    ("renew", "halted", "free"): NO_RENEW,
    ("renew", "finished", "free"): NO_RENEW,
    ("renew", "failed", "free"): NO_RENEW,
    ("renew", "cancelled", "free"): NO_RENEW,
    ("renew", "recovery_required", "free"): NO_RENEW,
    ("renew", "recovery_required", "mine"): RENEW,
    ("renew", "recovery_required", "live"): NO_RENEW,
    ("renew", "recovery_required", "expired"): NO_RENEW,
    # a cancel request reaches a running row's holder
    ("request_cancel", "absent", "free"): NO_CANCEL,
    ("request_cancel", "running", "free"): NO_CANCEL,
    ("request_cancel", "running", "live"): CANCEL,
    ("request_cancel", "running", "expired"): CANCEL,
    ("request_cancel", "halted", "free"): NO_CANCEL,
    ("request_cancel", "finished", "free"): NO_CANCEL,
    ("request_cancel", "failed", "free"): NO_CANCEL,
    ("request_cancel", "cancelled", "free"): NO_CANCEL,
    ("request_cancel", "recovery_required", "free"): NO_CANCEL,
    ("request_cancel", "recovery_required", "live"): NO_CANCEL,
    ("request_cancel", "recovery_required", "expired"): NO_CANCEL,
    # an operator's forced stop closes any open row, whoever holds it (epoch + 1)
    ("terminate", "absent", "free"): NO_TERMINATE,
    ("terminate", "running", "free"): TERMINATE,
    ("terminate", "running", "live"): TERMINATE,
    ("terminate", "running", "expired"): TERMINATE,
    ("terminate", "halted", "free"): TERMINATE,
    ("terminate", "finished", "free"): NO_TERMINATE,
    ("terminate", "failed", "free"): TERMINATE,
    ("terminate", "cancelled", "free"): NO_TERMINATE,
    ("terminate", "recovery_required", "free"): TERMINATE,
    ("terminate", "recovery_required", "live"): TERMINATE,
    ("terminate", "recovery_required", "expired"): TERMINATE,
    # the sweep takes over running rows whose lease expired
    ("recover", "absent", "free"): NO_SWEEP,
    ("recover", "running", "free"): NO_SWEEP,
    ("recover", "running", "live"): NO_SWEEP,
    ("recover", "running", "expired"): SWEEP,
    ("recover", "halted", "free"): NO_SWEEP,
    ("recover", "finished", "free"): NO_SWEEP,
    ("recover", "failed", "free"): NO_SWEEP,
    ("recover", "cancelled", "free"): NO_SWEEP,
    ("recover", "recovery_required", "free"): NO_SWEEP,
    ("recover", "recovery_required", "live"): NO_SWEEP,
    ("recover", "recovery_required", "expired"): NO_SWEEP,
    # an event is stored for an open or failed instance (a repeated event id is
    # answered with the first entry, whatever the status)
    ("post", "absent", "free"): MISSING,
    ("post", "running", "free"): POST,
    ("post", "running", "live"): POST,
    ("post", "running", "expired"): POST,
    ("post", "halted", "free"): POST,
    ("post", "finished", "free"): CLOSED,
    ("post", "failed", "free"): POST,
    ("post", "cancelled", "free"): CLOSED,
    ("post", "recovery_required", "free"): POST,
    ("post", "recovery_required", "live"): POST,
    ("post", "recovery_required", "expired"): POST,
    # a runtime fires the timers of rows it holds, that no runtime holds (halted,
    # failed), or that require recovery (of the workflows it serves)
    ("fire", "absent", "free"): NO_FIRE,
    ("fire", "running", "free"): NO_FIRE,
    ("fire", "running", "mine"): FIRE,
    ("fire", "running", "live"): NO_FIRE,
    ("fire", "running", "expired"): NO_FIRE,
    ("fire", "halted", "free"): FIRE,
    ("fire", "finished", "free"): NO_FIRE,
    ("fire", "failed", "free"): FIRE,
    ("fire", "cancelled", "free"): NO_FIRE,
    ("fire", "recovery_required", "free"): FIRE,
    ("fire", "recovery_required", "mine"): FIRE,
    ("fire", "recovery_required", "live"): FIRE,
    ("fire", "recovery_required", "expired"): FIRE,
    # a poll reads the entries of rows its runtime holds, and of halted rows no
    # runtime holds (of the workflows it serves)
    ("poll", "absent", "free"): NO_POLL,
    ("poll", "running", "free"): NO_POLL,
    ("poll", "running", "mine"): POLL,
    ("poll", "running", "live"): NO_POLL,
    ("poll", "running", "expired"): NO_POLL,
    ("poll", "halted", "free"): POLL_SERVED,
    ("poll", "finished", "free"): NO_POLL,
    ("poll", "failed", "free"): NO_POLL,
    ("poll", "cancelled", "free"): NO_POLL,
    ("poll", "recovery_required", "free"): NO_POLL,
    ("poll", "recovery_required", "mine"): POLL,
    ("poll", "recovery_required", "live"): NO_POLL,
    ("poll", "recovery_required", "expired"): NO_POLL,
}
# rules-table-end
"""The store's rules: what each operation does to a row in each state (see the
module's docstring)."""


# --- reading the table ------------------------------------------------------------------


def holder(
    row: StoredRecord | None,
    now: int,
    *,
    owner: str | None = None,
    epoch: int | None = None,
) -> Holder:
    """Who holds *row*'s lease, as an operation of *owner* sees it.

    Args:
        row: the row (``None``: no row).
        now: the store's lease clock, in milliseconds.
        owner: the operation's runtime (``None``: it has none).
        epoch: the epoch a fenced write presents (``None``: any epoch is *owner*'s).

    Returns:
        ``free``, ``mine``, ``live`` or ``expired`` (see :data:`Holder`).
    """
    if row is None or row.lease_owner is None:
        return "free"
    if row.lease_owner == owner and (epoch is None or row.lease_epoch == epoch):
        return "mine"
    return "expired" if (row.lease_expires_at_ms or 0) <= now else "live"


def lookup(
    operation: Operation,
    row: StoredRecord | None,
    now: int,
    *,
    owner: str | None = None,
    epoch: int | None = None,
) -> Rule:
    """The rule of *operation* for *row* (one lookup in :data:`RULES`).

    Args:
        operation: the operation.
        row: the row it finds (``None``: no row).
        now: the store's lease clock, in milliseconds.
        owner: the runtime the operation is made for, if any.
        epoch: the epoch a fenced write presents.

    Returns:
        The rule.

    Raises:
        KeyError: the row is in a state no rule covers (a lease on a row whose status
            releases it: the store broke its own invariant).
    """
    status: RowStatus = "absent" if row is None else row.status
    return RULES[(operation, status, holder(row, now, owner=owner, epoch=epoch))]


def goes_ahead(
    rule: Rule,
    row: StoredRecord | None,
    *,
    expected: int | None = None,
    create: bool = False,
    served: bool = True,
    closed_only: bool = False,
) -> bool:
    """Whether an operation under *rule* goes ahead on *row*.

    Args:
        rule: its rule.
        row: the row it finds (``None``: no row, at revision 0).
        expected: the revision it expects.
        create: whether it asks to create a missing row.
        served: whether the row's workflow is one it names.
        closed_only: whether it asks for a closed row.

    Returns:
        ``True`` when the rule allows it and its expectations hold.
    """
    revision = 0 if row is None else row.revision
    checks = {
        "revision": revision == (expected or 0),
        "revision if given": expected is None or revision == expected,
        "create": create,
        "served": served,
        "closed": not closed_only
        or (row is not None and row.status in ("finished", "cancelled")),
    }
    return rule.allowed and all(checks[e] for e in rule.expects)
