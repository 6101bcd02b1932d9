"""The inbox as SQL, written once for every SQL backend (in SQLite's ``:name`` style;
:func:`pyformat` turns a statement into PostgreSQL's ``%(name)s``)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, NamedTuple

from phronomy.errors import BusyError

from ._inbox import InboxEntry, Posting, PostOutcome, not_pending

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from ._dbapi import Connection
    from ._records import Consumption, StoredRecord

__all__ = [
    "CONSUMED_PENDING",
    "INBOX_STATEMENTS",
    "POSTGRES_NEXT_SEQ_NOWAIT",
    "POSTGRES_POLL",
    "ROW",
    "InboxStatements",
    "check_pending",
    "consume",
    "consumption",
    "entry_from_row",
    "entry_params",
    "pending_query",
    "post",
    "pruning",
    "pyformat",
    "refuse_unless_pending",
]

_COLUMNS = (
    "instance_id, seq, event_id, event, payload, input, expected_revision, "
    "stored_at_ms, status, revision, consumed_at_ms, detail"
)


CONSUMED_PENDING = """
    AND (SELECT count(*) FROM phronomy_inbox WHERE instance_id = :id
         AND status = 'pending' AND seq BETWEEN :low AND :high) = :consuming
"""
"""The condition a save's statement adds when it consumes entries numbered without a
gap (:func:`~phronomy.storage._sql_writes.gapless_span`): all of them are still pending (one statement where a check
and then the save would be two)."""

ROW = (
    "inbox_seq, instance_id, workflow, revision, status, phase, NULL, last_write_id, "
    "detail, updated_at_ms, definition_version, lease_owner, lease_epoch, "
    "lease_expires_at_ms, takeovers, cancel_requested"
)
"""What numbering an entry returns: the number, then the instance's row as a load
reads it, without the snapshot (the post's outcome needs the row, not the state)."""


class InboxStatements(NamedTuple):
    """The inbox's statements in one backend's parameter style."""

    next_seq: str
    next_seq_nowait: str
    give_back_seq: str
    insert: str
    entry: str
    pending: str
    pending_seqs: str
    recent: str
    consume: str
    refuse_pending: str
    close_consuming: str
    prune: str
    poll: str
    counts: str
    notify: str = ""
    """Tells other runtimes the inbox changed (``kind``: ``posted`` or ``consumed``),
    at commit; empty for a backend without notifications (they poll)."""


INBOX_STATEMENTS = InboxStatements(
    # under the instance's row (a lock on PostgreSQL): entries take its order
    next_seq=f"""
        UPDATE phronomy_workflow_instances SET inbox_seq = inbox_seq + 1
        WHERE instance_id = :id AND status NOT IN ('finished', 'cancelled')
        RETURNING {ROW}
    """,  # noqa: S608 - constant
    # a claim's posting (SQLite locks the whole database: no wait to skip), with the
    # row's snapshot: the claim then reads no row of its own (see load_and_claim)
    next_seq_nowait=f"""
        UPDATE phronomy_workflow_instances SET inbox_seq = inbox_seq + 1
        WHERE instance_id = :id AND status NOT IN ('finished', 'cancelled')
        RETURNING {ROW.replace(", NULL, ", ", snapshot, ")}
    """,  # noqa: S608 - constant
    # a repeat stored nothing: its number goes back (the row is still locked), so an
    # inbox's numbers have no gaps (a segment knows it has seen every entry)
    give_back_seq="""
        UPDATE phronomy_workflow_instances SET inbox_seq = inbox_seq - 1
        WHERE instance_id = :id
    """,
    insert="""
        INSERT INTO phronomy_inbox (instance_id, seq, event_id, event, payload, input,
            expected_revision, stored_at_ms, status)
        VALUES (:id, :seq, :event_id, :event, :payload, :input, :expected, :now,
            'pending')
        ON CONFLICT (instance_id, event_id) DO NOTHING
        RETURNING stored_at_ms
    """,
    entry=f"""
        SELECT {_COLUMNS} FROM phronomy_inbox
        WHERE instance_id = :id AND event_id = :event_id
    """,  # noqa: S608 - constant
    pending=f"""
        SELECT {_COLUMNS} FROM phronomy_inbox
        WHERE instance_id = :id AND status = 'pending' AND seq > :after
        ORDER BY seq LIMIT :limit
    """,  # noqa: S608 - constant
    pending_seqs="""
        SELECT seq FROM phronomy_inbox
        WHERE instance_id = :id AND status = 'pending' AND seq BETWEEN :low AND :high
    """,
    recent=f"""
        SELECT {_COLUMNS} FROM phronomy_inbox WHERE instance_id = :id
        ORDER BY seq DESC LIMIT :limit
    """,  # noqa: S608 - constant
    consume="""
        UPDATE phronomy_inbox SET status = :status, revision = :revision,
            consumed_at_ms = :now, detail = :detail
        WHERE instance_id = :id AND seq = :seq AND status = 'pending'
    """,
    refuse_pending="""
        UPDATE phronomy_inbox SET status = 'refused', revision = :revision,
            consumed_at_ms = :now, detail = :detail
        WHERE instance_id = :id AND status = 'pending'
    """,
    # a closing write that consumes one entry: that entry's outcome, the refusal of
    # every other pending one
    close_consuming="""
        UPDATE phronomy_inbox SET
            status = CASE WHEN seq = :seq THEN :status ELSE 'refused' END,
            detail = CASE WHEN seq = :seq THEN :detail ELSE :refusal END,
            revision = :revision, consumed_at_ms = :now
        WHERE instance_id = :id AND status = 'pending'
    """,
    # the last save_log_depth consumed entries of the instance are kept (its history)
    prune="""
        DELETE FROM phronomy_inbox
        WHERE instance_id = :id AND status != 'pending' AND seq <= (
            SELECT seq FROM phronomy_inbox
            WHERE instance_id = :id AND status != 'pending'
            ORDER BY seq DESC LIMIT 1
            OFFSET (SELECT value FROM phronomy_settings WHERE name = 'save_log_depth'))
    """,
    # one indexed query (the pending entries' partial index) per poll
    poll="""
        SELECT i.instance_id, i.seq, i.event_id, i.event, i.payload, i.input,
            i.expected_revision, i.stored_at_ms, i.status, i.revision,
            i.consumed_at_ms, i.detail, r.status, r.workflow, r.lease_owner
        FROM phronomy_inbox AS i
        JOIN phronomy_workflow_instances AS r ON r.instance_id = i.instance_id
        WHERE i.status = 'pending'
          AND (r.lease_owner = :owner OR (r.lease_owner IS NULL
            AND r.status = 'halted'
            AND r.workflow IN (SELECT value FROM json_each(:workflows))))
        ORDER BY i.instance_id, i.seq LIMIT :limit
    """,
    # what waits for the workflows served (PendingOp): each pending entry once (the
    # partial index), each timer of those workflows once (the (workflow, due) index)
    counts="""
        SELECT
            (SELECT count(*) FROM phronomy_inbox AS i
             WHERE i.status = 'pending' AND (
                SELECT r.workflow FROM phronomy_workflow_instances AS r
                WHERE r.instance_id = i.instance_id)
                IN (SELECT value FROM json_each(:workflows))),
            (SELECT count(*) FROM phronomy_timers AS t
             WHERE t.workflow IN (SELECT value FROM json_each(:workflows)))
    """,
)
"""The inbox's statements (SQLite's parameter style)."""

POSTGRES_POLL = INBOX_STATEMENTS.poll.replace(
    "JOIN phronomy_workflow_instances AS r ON r.instance_id = i.instance_id",
    """CROSS JOIN LATERAL (
            SELECT r.status, r.workflow, r.lease_owner
            FROM phronomy_workflow_instances AS r
            WHERE r.instance_id = i.instance_id LIMIT 1) AS r""",
)
"""The poll for PostgreSQL (SQLite's parameter style): a plain join of each entry to its
row makes PostgreSQL's planner read every instance and sort (60 ms a poll at 200k
instances, also after ``ANALYZE``); a lateral lookup it cannot flatten (``LIMIT 1``)
walks the pending entries' partial index in order, one primary-key lookup each (0.8
ms at 200k). SQLite's planner walks that index with the plain join."""


POSTGRES_NEXT_SEQ_NOWAIT = f"""
    UPDATE phronomy_workflow_instances SET inbox_seq = inbox_seq + 1
    WHERE instance_id = (
        SELECT instance_id FROM phronomy_workflow_instances
        WHERE instance_id = :id AND status NOT IN ('finished', 'cancelled')
        FOR UPDATE SKIP LOCKED)
    RETURNING {ROW}
"""  # noqa: S608 - constant
"""The next inbox number for a claim's posting on PostgreSQL (SQLite's parameter
style), under the instance's row lock; a row another transaction has locked (a
stalled client, say) is skipped, not waited for: the claim is refused as busy at once,
as a claim of a locked row is."""


_NAMED = re.compile(r"(?<![:\w]):(\w+)")


_JSON_LIST = re.compile(r"SELECT value FROM json_each\(:(\w+)\)")


def pyformat(statement: str, *, now: str) -> str:
    """*statement* in PostgreSQL's style: ``:name`` parameters as ``%(name)s``,
    ``:now`` as the SQL expression *now* (the server's clock), and the elements of a
    JSON list parameter (``json_each``) as ``jsonb_array_elements_text``."""
    escaped = statement.replace("%", "%%").replace(":now", now)
    escaped = _JSON_LIST.sub(r"SELECT jsonb_array_elements_text(:\1::jsonb)", escaped)
    return _NAMED.sub(r"%(\1)s", escaped)


def entry_from_row(row: tuple[Any, ...]) -> InboxEntry:
    """A row of the inbox table (its columns, in order) as an entry."""
    return InboxEntry(
        workflow_instance_id=row[0],
        seq=int(row[1]),
        event_id=row[2],
        event=row[3],
        payload=bytes(row[4]),
        input=None if row[5] is None else bytes(row[5]),
        expected_revision=row[6],
        stored_at_ms=int(row[7]),
        status=row[8],
        revision=row[9],
        consumed_at_ms=row[10],
        detail=row[11],
    )


def entry_params(posting: Posting, seq: int, now: int) -> dict[str, Any]:
    """The parameters of the statement that stores *posting* numbered *seq*."""
    return {
        "id": posting.workflow_instance_id,
        "event_id": posting.event_id,
        "seq": seq,
        "event": posting.event,
        "payload": posting.payload,
        "input": posting.input,
        "expected": posting.expected_revision,
        "now": now,
    }


def post(
    conn: Connection,
    posting: Posting,
    sql: InboxStatements,
    now: int,
    load: Callable[[], StoredRecord | None],
    row_from: Callable[[tuple[Any, ...]], StoredRecord],
    *,
    wait: bool = True,
) -> PostOutcome:
    """Store *posting* (see :class:`~phronomy.storage.PostOp`); *load* reads the
    instance's row for a posting that stores nothing; *row_from* makes the row the
    numbering returned (:data:`ROW`) a record."""
    iid = posting.workflow_instance_id
    key = {"id": iid, "event_id": posting.event_id}
    numbering = sql.next_seq if wait else sql.next_seq_nowait
    seq = conn.execute(numbering, {"id": iid}).fetchone()
    if seq is not None:
        params = entry_params(posting, int(seq[0]), now)
        stored = conn.execute(sql.insert, params).fetchone()
        if stored is not None:
            entry = posting.stored(seq=int(seq[0]), stored_at_ms=int(stored[0]))
            if sql.notify:
                conn.execute(sql.notify, {"kind": "posted"})
            return PostOutcome(outcome="stored", entry=entry, row=row_from(seq[1:]))
        conn.execute(sql.give_back_seq, {"id": iid})
    # nothing stored: an earlier entry with this id, or an instance that is closed or
    # missing says why
    row = load()
    found = conn.execute(sql.entry, key).fetchone()
    if found is not None:
        earlier = entry_from_row(found)
        if earlier.same_event(posting):
            return PostOutcome(outcome="duplicate", entry=earlier, row=row)
        return PostOutcome(outcome="mismatch", entry=earlier, row=row)
    if row is not None and row.status not in ("finished", "cancelled"):
        # PostgreSQL, a claim's posting: another transaction has locked the row (the
        # numbering skips it rather than wait): nothing was stored, try again
        held = f", lease owner {row.lease_owner}" if row.lease_owner else ""
        raise BusyError(
            f"workflow instance {iid!r} is being written by another transaction "
            f"(status {row.status}{held}); the event was not stored: send it again"
        )
    return PostOutcome(outcome="missing" if row is None else "closed", row=row)


def check_pending(
    conn: Connection,
    workflow_instance_id: str,
    consumed: tuple[Consumption, ...],
    sql: InboxStatements,
) -> None:
    """Refuse a write that would consume an entry that is not pending (consumed
    already, or never stored): checked before the write changes anything.

    Raises:
        ConflictError: naming the entries.
    """
    if consumed:
        statement, params = pending_query(workflow_instance_id, consumed, sql)
        refuse_unless_pending(
            workflow_instance_id, consumed, conn.execute(statement, params)
        )


def pending_query(
    workflow_instance_id: str, consumed: tuple[Consumption, ...], sql: InboxStatements
) -> tuple[str, dict[str, Any]]:
    """The query :func:`check_pending` runs (*consumed* is not empty)."""
    seqs = [c.seq for c in consumed]
    return sql.pending_seqs, {
        "id": workflow_instance_id,
        "low": min(seqs),
        "high": max(seqs),
    }


def refuse_unless_pending(
    workflow_instance_id: str,
    consumed: tuple[Consumption, ...],
    rows: Iterable[tuple[Any, ...]],
) -> None:
    """Raise unless every entry of *consumed* is among the pending *rows*.

    Raises:
        ConflictError: naming the entries that are not pending.
    """
    seqs = {c.seq for c in consumed}
    pending = {int(row[0]) for row in rows}
    if not seqs <= pending:
        raise not_pending(workflow_instance_id, sorted(seqs - pending))


def consume(
    conn: Connection,
    workflow_instance_id: str,
    *,
    revision: int,
    consumed: tuple[Consumption, ...],
    closing: str | None,
    sql: InboxStatements,
    now: int,
    prune: bool = True,
) -> None:
    """Record the outcomes of *consumed* entries (in the write that consumes them); a
    *closing* write (its status) refuses every entry still pending; then the entries
    beyond the last few are pruned (unless *prune* is false: the instance has no more
    entries than the inbox keeps)."""
    statements = consumption(
        workflow_instance_id, revision, consumed, closing, sql, now
    )
    refused = 0
    for statement, params in statements:
        refused = conn.execute(statement, params).rowcount
    if consumed or (closing is not None and refused > 0):
        for statement, params in pruning(workflow_instance_id, sql, prune=prune):
            conn.execute(statement, params)


def consumption(
    workflow_instance_id: str,
    revision: int,
    consumed: tuple[Consumption, ...],
    closing: str | None,
    sql: InboxStatements,
    now: int,
) -> list[tuple[str, dict[str, Any]]]:
    """The statements of :func:`consume` before the pruning: each consumed entry's
    outcome, then (a *closing* write) the refusal of the pending ones, last (one
    statement for both when it consumes one entry)."""
    base = {"id": workflow_instance_id, "revision": revision, "now": now}
    outcomes = [
        {**base, "seq": c.seq, "status": c.status, "detail": c.detail} for c in consumed
    ]
    if closing is None:
        return [(sql.consume, params) for params in outcomes]
    refusal = f"the instance was {closing} at revision {revision} before it was applied"
    if len(outcomes) == 1:
        return [(sql.close_consuming, {**outcomes[0], "refusal": refusal})]
    return [
        *((sql.consume, params) for params in outcomes),
        (sql.refuse_pending, {**base, "detail": refusal}),
    ]


def pruning(
    workflow_instance_id: str, sql: InboxStatements, *, prune: bool = True
) -> list[tuple[str, dict[str, Any]]]:
    """What follows a write whose entries left the pending ones: the last few kept
    (when it may have more, *prune*), and (for waiters in other runtimes) a
    notification."""
    statements = [(sql.prune, {"id": workflow_instance_id})] if prune else []
    if sql.notify:
        statements.append((sql.notify, {"kind": "consumed"}))
    return statements
