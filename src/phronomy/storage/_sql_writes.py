"""The statements of the common writes built without a connection (a claim, a save),
and what their rows say: shared by the SQL stores' one-statement-at-a-time path and
PostgreSQL's pipelined batches."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from ._records import StoredRecord
from ._store import conflict_error

if TYPE_CHECKING:
    from phronomy.errors import ConflictError

    from ._clock import StoreClock
    from ._dbapi import Connection
    from ._ops import ClaimOp
    from ._records import Consumption, SaveRequest


__all__ = [
    "BARE",
    "TIDY",
    "claim_op",
    "claim_params",
    "claimed",
    "gapless_span",
    "record_from_row",
    "save_refused",
    "save_statement",
    "tidy_statement",
]


class Statements(Protocol):
    """The statements these writes use (of :class:`~phronomy.storage._sql_ops.Statements`)."""

    @property
    def claim(self) -> str | None: ...

    @property
    def create(self) -> str: ...

    @property
    def update(self) -> str: ...

    @property
    def update_consuming(self) -> str: ...

    @property
    def update_closing(self) -> str: ...

    @property
    def update_consuming_closing(self) -> str: ...


BARE = """
    AND inbox_seq = 0
    AND NOT EXISTS (SELECT 1 FROM phronomy_timers WHERE instance_id = :id)
"""
"""The conditions a closing save's statement adds to change its row in one statement:
the instance never had an inbox entry (none to refuse) and has no timer (none to
drop). Else it changes nothing, and the save runs as any other, with the statements
that refuse and drop them."""
TIDY = """
    AND inbox_seq <= (SELECT value FROM phronomy_settings WHERE name = 'save_log_depth')
    AND NOT EXISTS (SELECT 1 FROM phronomy_timers WHERE instance_id = :id)
"""
"""The conditions a closing save that consumes entries adds: the instance has no
timer (none to drop) and no more entries than the inbox keeps (none to prune after
its consumption). Else it changes nothing, and the save runs as any other."""


def record_from_row(row: tuple[Any, ...]) -> StoredRecord:
    """A row of the instances table (its load columns, in order) as a record."""
    snapshot = row[5]
    return StoredRecord(
        workflow_instance_id=row[0],
        workflow=row[1],
        revision=row[2],
        status=row[3],
        phase=row[4],
        snapshot=None if snapshot is None else bytes(snapshot),
        write_id=row[6],
        detail=row[7],
        updated_at_ms=row[8],
        definition_version=row[9],
        lease_owner=row[10],
        lease_epoch=row[11],
        lease_expires_at_ms=row[12],
        takeovers=row[13],
        cancel_requested=row[14],
    )


def claim_op(
    conn: Connection, op: ClaimOp, sql: Statements, clock: StoreClock
) -> tuple[StoredRecord | None, int | None]:
    """Run a :class:`ClaimOp` with the backend's one ``claim`` statement.

    The statement returns at most one row: a kind (``created``, ``claimed`` or
    ``current``), the instance's load columns and the new epoch. ``created``: no row
    existed, the claim made one. ``claimed``: the row as it was before the claim.
    ``current``: the row was not claimed (its status or another runtime's lease, or
    another transaction was writing it: never waited for).
    """
    assert sql.claim is not None
    return claimed(conn.execute(sql.claim, claim_params(op, clock)).fetchone())


def claim_params(op: ClaimOp, clock: StoreClock) -> dict[str, Any]:
    """The parameters of the backend's ``claim`` statement for *op*."""
    return {
        "id": op.workflow_instance_id,
        "workflow": op.workflow,
        "owner": op.lease_owner,
        "ttl": op.ttl_ms,
        "now": clock.wall_ms(),
        "lease_now": clock.lease_ms(),
        "statuses": ",".join(op.statuses),  # status names have no comma
        "create": op.create,
        "placeholders": op.placeholders,
    }


def claimed(row: tuple[Any, ...] | None) -> tuple[StoredRecord | None, int | None]:
    """What the ``claim`` statement's row (or none) says (see :func:`claim_op`)."""
    if row is None:
        return None, None
    kind, epoch = row[0], row[-1]
    if kind == "created":
        return None, int(epoch)
    return record_from_row(row[1:-1]), None if epoch is None else int(epoch)


def tidy_statement(
    request: SaveRequest, statement: str, sql: Statements, closing: str | None
) -> str | None:
    """The statement a *closing* save (its status, ``None``: it does not close) runs
    in place of its *statement*, changing its row only when the instance is tidy
    (:data:`BARE` when it consumes nothing, :data:`TIDY` when it consumes a gapless
    span), or ``None``: it runs as any other save."""
    if closing is None:
        return None
    if statement is sql.update and not request.consumed:
        return sql.update_closing
    if statement is sql.update_consuming:
        return sql.update_consuming_closing
    return None


def save_statement(
    request: SaveRequest, sql: Statements, clock: StoreClock
) -> tuple[str, dict[str, Any]]:
    """The conditional statement of a save (it changes one row, or none: refused)."""
    expected = request.expected_revision
    lease = request.lease
    params = {
        "id": request.workflow_instance_id,
        "workflow": request.workflow,
        "status": request.status,
        "phase": request.phase,
        "snapshot": request.snapshot,
        "write_id": request.write_id,
        "detail": request.detail,
        "version": request.definition_version,
        "now": clock.wall_ms(),
        "expected": expected or 0,
        "owner": None if lease is None else lease.owner,
        "epoch": None if lease is None else lease.epoch,
    }
    # A leased instance has its row (its claim made it): revision 0 is updated too.
    if not (expected or lease is not None):
        return sql.create, params
    span = gapless_span(request.consumed)
    if span is None:
        return sql.update, params
    params["low"], params["high"] = span
    params["consuming"] = len(request.consumed)
    return sql.update_consuming, params


def gapless_span(consumed: tuple[Consumption, ...]) -> tuple[int, int] | None:
    """The lowest and highest numbers of the entries a save *consumed* when they have
    no gap (``None`` otherwise, or for none): its statement then checks itself that
    they are all still pending (a count of the pending ones in that range, see
    ``CONSUMED_PENDING``); otherwise the check is a statement of its own before the
    save's (:func:`~phronomy.storage._sql_inbox.check_pending`). A save with the
    check folded in that changes no row may have been refused for it: the check then
    runs to say so."""
    if not consumed:
        return None
    seqs = {c.seq for c in consumed}
    if len(seqs) != len(consumed) or max(seqs) - min(seqs) >= len(seqs):
        return None
    return min(seqs), max(seqs)


def save_refused(request: SaveRequest, row: tuple[Any, ...] | None) -> ConflictError:
    """The refusal of a save whose statement changed no row; *row* is what
    ``revision`` read then (``None``: no row)."""
    return conflict_error(
        request.workflow_instance_id,
        "save",
        expected=request.expected_revision,
        lease=request.lease,
        found=None if row is None else (row[0], row[1], row[2]),
    )
