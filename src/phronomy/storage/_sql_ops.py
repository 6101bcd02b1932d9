"""The store operations as SQL, written once for every SQL backend.

A backend supplies its statements (:class:`Statements`: the same statements in its
dialect) and a DB-API connection; :func:`apply_op` runs one operation on it.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, NamedTuple

from msgspec.structs import replace

from ._dbapi import Connection
from ._ops import (
    BeginOp,
    DeleteOp,
    EntryOp,
    FindWriteOp,
    FireOp,
    HistoryOp,
    InboxOp,
    ListOp,
    LoadOp,
    MarkOp,
    NextDueOp,
    PendingOp,
    PollOp,
    PostOp,
    RecoverOp,
    RenewOp,
    RequestCancelOp,
    RevisionOp,
    SaveOp,
    TakeoversOp,
    TerminateOp,
    TimersOp,
)
from ._records import InstancePage, SaveLogEntry, StoredRecord
from ._sql_history import (
    HISTORY_STATEMENTS,
    HistoryStatements,
    log_takeovers,
    takeovers_of,
)
from ._sql_inbox import InboxStatements, check_pending, consume, entry_from_row, post
from ._sql_schedules import (
    SCHEDULE_OPS,
    SCHEDULE_STATEMENTS,
    ScheduleStatements,
    schedule_op,
)
from ._sql_steps import run_steps
from ._sql_terminate import SQL_TERMINATE_ROW
from ._sql_timers import (
    TIMER_STATEMENTS,
    TimerStatements,
    arm_and_disarm,
    fire_steps,
    next_due,
    timers_of,
)
from ._sql_writes import (
    record_from_row,
    save_refused,
    save_statement,
    tidy_statement,
)
from ._store import conflict_error

if TYPE_CHECKING:
    from phronomy.errors import ConflictError

    from ._clock import StoreClock
    from ._inbox import Posting, PostOutcome
    from ._ops import StoreOp
    from ._records import Lease, SaveRequest

__all__ = ["Connection", "Statements", "apply_op", "record_from_row"]


class Statements(NamedTuple):
    """One backend's statements (named parameters for writes and listings).

    ``load``, ``revision``, ``find_write``, ``history`` and ``delete`` take positional
    parameters, the others named ones. Backends whose clock is the client's use
    ``now`` (wall-clock ms: the timestamps people read) and ``lease_now`` (lease-clock
    ms: lease expiries); a backend with a clock of its own ignores both. ``begin``,
    ``resume``, ``renew``, ``recover`` and ``claim`` return rows. ``renew`` returns each
    held instance's id, epoch, cancellation request, whether it was renewed (a
    statement that may skip a row another transaction is writing says so) and its
    expiry. ``recover`` takes over up to ``limit`` expired leases in one statement.
    ``claim`` (optional) is a :class:`ClaimOp` in one statement that never waits for a
    row (see :func:`claim_op`); without it, a claim is a load and then a ``begin``.
    ``update_closing`` is ``update`` for a closing save that consumes nothing: it
    changes the row only when the instance never had an inbox entry and has no timer
    (:data:`~phronomy.storage._sql_writes.BARE`); ``update_consuming_closing`` is
    ``update_consuming`` for a closing save, changing the row only when the instance
    has no more entries than the inbox keeps and no timer (``TIDY``).
    """

    load: str
    revision: str
    list: tuple[str, ...]
    history: str
    find_write: str
    begin: str
    begin_new: str
    resume: str
    create: str
    update: str
    update_consuming: str
    update_closing: str
    update_consuming_closing: str
    mark: str
    mark_or_create: str
    delete: str
    renew: str
    request_cancel: str
    recover: str
    inbox: InboxStatements
    claim: str | None = None
    timers: TimerStatements = TIMER_STATEMENTS
    schedules: ScheduleStatements = SCHEDULE_STATEMENTS
    terminate: str = SQL_TERMINATE_ROW
    log: HistoryStatements = HISTORY_STATEMENTS


def apply_op(conn: Connection, op: StoreOp, sql: Statements, clock: StoreClock) -> Any:
    """Run one operation on *conn* with the backend's statements *sql* and *clock*.

    Raises:
        ConflictError: a revision precondition of a save or a delete failed.
    """
    if isinstance(op, SCHEDULE_OPS):

        def save(request: SaveRequest) -> object:
            return apply_op(conn, SaveOp(request=request), sql, clock)

        return schedule_op(conn, op, sql.schedules, clock.wall_ms(), save)
    match op:  # the frequent operations first: a match tries its cases in order
        case SaveOp(request=request):
            closing = request.status if request.status in _CLOSED else None
            revision, tidy = _save(conn, request, sql, clock, closing=closing)
            if tidy and not request.consumed:  # no entry to refuse, no timer to drop
                return revision
            if request.consumed or closing:
                consume(
                    conn,
                    request.workflow_instance_id,
                    revision=revision,
                    consumed=request.consumed,
                    closing=closing,
                    sql=sql.inbox,
                    now=clock.wall_ms(),
                    prune=not tidy,  # (tidy: fewer entries than the inbox keeps)
                )
            if request.arm or request.disarm or (closing and not tidy):
                arm_and_disarm(
                    conn,
                    request.workflow_instance_id,
                    revision=revision,
                    arm=request.arm,
                    disarm=request.disarm,
                    closing=closing is not None,
                    sql=sql.timers,
                    now=clock.wall_ms(),
                )
            return revision
        case PostOp(posting=posting, wait=wait):
            return _post(conn, posting, sql, clock, wait=wait)
        case LoadOp(workflow_instance_id=iid):
            row = conn.execute(sql.load, (iid,)).fetchone()
            return None if row is None else record_from_row(row)
        case ListOp(status=status, limit=limit, after=after, workflow=workflow):
            params = {
                "status": status,
                "workflow": workflow,
                "after": after or "",  # every id is longer
                "limit": limit + 1,
            }
            statement = sql.list[2 * (status is not None) + (workflow is not None)]
            rows = conn.execute(statement, params).fetchall()
            records = tuple(record_from_row(row) for row in rows[:limit])
            more = len(rows) > limit
            return InstancePage(
                records=records,
                next_after=records[-1].workflow_instance_id if more else None,
            )
        case HistoryOp(workflow_instance_id=iid, limit=limit):
            return [
                SaveLogEntry(
                    revision=row[0],
                    status=row[1],
                    phase=row[2],
                    write_id=row[3],
                    committed_at_ms=row[4],
                    definition_version=row[5],
                    detail=row[6],
                )
                for row in conn.execute(sql.history, (iid, limit))
            ]
        case FindWriteOp(workflow_instance_id=iid, write_id=write_id):
            row = conn.execute(sql.find_write, (iid, write_id)).fetchone()
            return None if row is None else int(row[0])
        case BeginOp():
            owner = op.lease_owner
            params = {
                "id": op.workflow_instance_id,
                "workflow": op.workflow,
                "now": clock.wall_ms(),
                "lease_now": clock.lease_ms(),
                "expected": op.expected_revision,
                "owner": owner,
                "ttl": op.ttl_ms,
            }
            if op.only_new:
                statement = sql.begin_new
            else:
                statement = sql.resume if op.expected_revision else sql.begin
            row = conn.execute(statement, params).fetchone()
            return None if row is None else int(row[0])
        case RenewOp():
            return _renew(conn, op, sql, clock)
        case RequestCancelOp(workflow_instance_id=iid, reason=reason):
            params = {"id": iid, "reason": reason or ""}
            row = conn.execute(sql.request_cancel, params).fetchone()
            return None if row is None else (int(row[0]), bool(row[1]))
        case RecoverOp(limit=limit, max_takeovers=max_takeovers):
            params = {
                "now": clock.wall_ms(),
                "lease_now": clock.lease_ms(),
                "limit": limit,
                "max": max_takeovers,
            }
            rows = conn.execute(sql.recover, params).fetchall()
            log_takeovers(conn, sql.log, rows, clock.wall_ms())
            recovered = [(row[0], row[1]) for row in rows]
            for iid, status in recovered:
                if status in _CLOSED:  # back to a closed revision: nothing applies
                    consume(
                        conn,
                        iid,
                        revision=_revision_of(conn, sql, iid),
                        consumed=(),
                        closing=status,
                        sql=sql.inbox,
                        now=clock.wall_ms(),
                    )
                    conn.execute(sql.timers.clear, {"id": iid})
            return recovered
        case InboxOp(workflow_instance_id=iid, pending_only=pending_only):
            if pending_only:
                params = {"id": iid, "after": op.after, "limit": op.limit}
                found = conn.execute(sql.inbox.pending, params).fetchall()
            else:
                recent = {"id": iid, "limit": op.limit}
                found = conn.execute(sql.inbox.recent, recent).fetchall()
            return tuple(entry_from_row(row) for row in found)
        case EntryOp(workflow_instance_id=iid, event_id=event_id):
            params = {"id": iid, "event_id": event_id}
            row = conn.execute(sql.inbox.entry, params).fetchone()
            return None if row is None else entry_from_row(row)
        case NextDueOp(owner=owner, workflows=workflows):
            return next_due(conn, owner, workflows, sql.timers, clock.wall_ms())
        case FireOp():
            steps = fire_steps(op, sql.timers, sql.inbox, clock.wall_ms())
            return run_steps(conn, steps)
        case TimersOp(workflow_instance_id=iid):
            return timers_of(conn, iid, sql.timers)
        case RevisionOp(workflow_instance_id=iid, revision=revision):
            params = {"id": iid, "revision": revision}
            row = conn.execute(sql.log.revision, params).fetchone()
            return None if row is None else record_from_row(row)
        case TakeoversOp(workflow_instance_id=iid, limit=limit):
            return takeovers_of(conn, sql.log, iid, limit)
        case PendingOp(workflows=workflows):
            params = {"workflows": json.dumps(workflows)}
            events, timers = conn.execute(sql.inbox.counts, params).fetchone()
            return int(events), int(timers)
        case PollOp(owner=owner, workflows=workflows, limit=limit):
            params = {
                "owner": owner,
                "workflows": json.dumps(workflows),
                "limit": limit,
            }
            polled = conn.execute(sql.inbox.poll, params)
            return tuple(
                (entry_from_row(row[:12]), row[12], row[13], row[14])
                for row in polled.fetchall()
            )
        case MarkOp():
            check_pending(conn, op.workflow_instance_id, op.consumed, sql.inbox)
            cursor = conn.execute(
                # only an unfenced mark of revision 0 creates a placeholder: a row
                # a lease or a later revision is expected on is never made anew
                sql.mark_or_create
                if op.create and op.lease is None and not op.expected_revision
                else sql.mark,
                {
                    "id": op.workflow_instance_id,
                    "workflow": op.workflow,
                    "status": op.status,
                    "detail": op.detail,
                    "now": clock.wall_ms(),
                    "expected": op.expected_revision,
                    "owner": None if op.lease is None else op.lease.owner,
                    "epoch": None if op.lease is None else op.lease.epoch,
                },
            )
            changed = cursor.rowcount == 1
            closing = op.status if op.status in _CLOSED else None
            if changed and (op.consumed or closing):
                expected = op.expected_revision
                consume(
                    conn,
                    op.workflow_instance_id,
                    revision=_revision_of(conn, sql, op.workflow_instance_id)
                    if expected is None
                    else expected,
                    consumed=op.consumed,
                    closing=closing,
                    sql=sql.inbox,
                    now=clock.wall_ms(),
                )
                if closing:
                    conn.execute(sql.timers.clear, {"id": op.workflow_instance_id})
            return changed
        case TerminateOp(workflow_instance_id=iid, expected_revision=expected):
            params = {
                "id": iid,
                "expected": expected,
                "status": op.status,
                "detail": op.detail,
                "now": clock.wall_ms(),
            }
            changed = conn.execute(sql.terminate, params).rowcount == 1
            closing = op.status if op.status in _CLOSED else None
            if changed and closing:
                consume(
                    conn,
                    iid,
                    revision=expected,
                    consumed=(),
                    closing=closing,
                    sql=sql.inbox,
                    now=clock.wall_ms(),
                )
                conn.execute(sql.timers.clear, {"id": iid})
            return changed
        case DeleteOp(workflow_instance_id=iid, expected_revision=expected):
            where = (iid, expected, op.closed_only)
            if conn.execute(sql.delete, where).rowcount != 1:
                raise _conflict(conn, sql, iid, expected, "delete")
            return None
    raise TypeError(f"unknown store operation {op!r}")  # pragma: no cover


def _renew(
    conn: Connection, op: RenewOp, sql: Statements, clock: StoreClock
) -> dict[str, tuple[int, str | None, bool]]:
    params = {
        "owner": op.owner,
        "ids": json.dumps(op.instance_ids),
        "lease_now": clock.lease_ms(),
        "ttl": op.ttl_ms,
    }
    watch = clock.watch
    sent = watch.monotonic_ns()
    rows = conn.execute(sql.renew, params).fetchall()
    renewed = [row for row in rows if row[3]]
    if renewed:  # each row's expiry is the lease clock at the renewal plus the TTL
        watch.observe(
            max(row[4] for row in renewed) - op.ttl_ms, sent, watch.monotonic_ns()
        )
    return {row[0]: (int(row[1]), row[2], bool(row[3])) for row in rows}


_CLOSED = frozenset({"finished", "cancelled"})
"""Statuses whose write refuses the instance's pending inbox entries."""


def _post(
    conn: Connection,
    posting: Posting,
    sql: Statements,
    clock: StoreClock,
    *,
    wait: bool,
) -> PostOutcome:
    iid = posting.workflow_instance_id

    def load() -> StoredRecord | None:
        row = conn.execute(sql.load, (iid,)).fetchone()
        return None if row is None else replace(record_from_row(row), snapshot=None)

    return post(
        conn,
        posting,
        sql.inbox,
        clock.wall_ms(),
        load,
        record_from_row,
        wait=wait,
    )


def _save(
    conn: Connection,
    request: SaveRequest,
    sql: Statements,
    clock: StoreClock,
    *,
    closing: str | None,
) -> tuple[int, bool]:
    """The save's statement: the revision it made, and whether it was a closing
    save's tidy statement (``update_closing``, ``update_consuming_closing``: it changed
    the row, so the instance has no timer to drop, no more entries than the inbox
    keeps, and, when it consumes none, no entry to refuse). When that statement
    changes nothing, the save runs as any other (the instance has entries or timers,
    or the save is refused)."""
    iid = request.workflow_instance_id
    revision = (request.expected_revision or 0) + 1
    statement, params = save_statement(request, sql, clock)
    tidy = tidy_statement(request, statement, sql, closing)
    if tidy is not None and conn.execute(tidy, params).rowcount == 1:
        return revision, True
    folded = statement is sql.update_consuming  # it checks its consumed entries
    if request.consumed and not folded:
        check_pending(conn, iid, request.consumed, sql.inbox)
    if conn.execute(statement, params).rowcount != 1:
        if folded:  # refused for an entry that is no longer pending?
            check_pending(conn, iid, request.consumed, sql.inbox)
        row = conn.execute(sql.revision, (iid,)).fetchone()
        raise save_refused(request, row)
    return revision, False


def _revision_of(conn: Connection, sql: Statements, workflow_instance_id: str) -> int:
    """The row's revision (it exists: the transaction just wrote it)."""
    row = conn.execute(sql.revision, (workflow_instance_id,)).fetchone()
    assert row is not None
    return int(row[0])


def _conflict(
    conn: Connection,
    sql: Statements,
    workflow_instance_id: str,
    expected: int | None,
    action: str,
    lease: Lease | None = None,
) -> ConflictError:
    row = conn.execute(sql.revision, (workflow_instance_id,)).fetchone()
    return conflict_error(
        workflow_instance_id,
        action,
        expected=expected,
        lease=lease,
        found=None if row is None else (row[0], row[1], row[2]),
    )
