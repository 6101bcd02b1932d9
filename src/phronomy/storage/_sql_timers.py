"""Durable timers as SQL, written once for every SQL backend (SQLite's ``:name``
style; :func:`~phronomy.storage._sql_inbox.pyformat` makes PostgreSQL's), with each
backend's migration that adds them."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, NamedTuple

from ._sql_inbox import entry_params, pyformat
from ._timers import ALL_TIMERS, StoredTimer, disarm_prefix

if TYPE_CHECKING:
    from ._dbapi import Connection
    from ._inbox import Posting
    from ._ops import FireOp
    from ._sql_inbox import InboxStatements
    from ._sql_steps import Statement, Steps
    from ._timers import TimerSpec

__all__ = [
    "POSTGRES_MIGRATION",
    "SQLITE_MIGRATION",
    "TIMER_STATEMENTS",
    "TimerStatements",
    "arm_and_disarm",
    "fire_steps",
    "next_due",
    "postgres_timers",
    "timer_changes",
    "timers_of",
]

_COLUMNS = (
    "t.instance_id, t.name, t.due_at_ms, t.event, t.payload, t.kind, t.state, "
    "t.armed_revision, t.armed_at_ms, t.workflow"
)

# A runtime fires the timers of the workflows it serves, into instances it holds or
# that no runtime holds (halted, or failed: the event waits in the inbox until the
# instance is resumed), or that require recovery (it waits for the operator).
_FIREABLE = """(r.lease_owner = :owner
    OR (r.lease_owner IS NULL AND r.status IN ('halted', 'failed'))
    OR r.status = 'recovery_required')"""


class TimerStatements(NamedTuple):
    """The timers' statements in one backend's parameter style."""

    arm: str
    disarm: str
    refuse_fired: str
    clear: str
    list: str
    next_due: str
    due: str
    lock: str
    take: str


TIMER_STATEMENTS = TimerStatements(
    # (the instance's workflow: a runtime reads the timers of those it serves)
    arm="""
        INSERT INTO phronomy_timers (instance_id, name, due_at_ms, event, payload,
            kind, state, armed_revision, armed_at_ms, workflow)
        VALUES (:id, :name, :now + :delay, :event, :payload, :kind, :state, :revision,
            :now, (SELECT workflow FROM phronomy_workflow_instances
                   WHERE instance_id = :id))
        ON CONFLICT (instance_id, name) DO UPDATE SET due_at_ms = excluded.due_at_ms,
            event = excluded.event, payload = excluded.payload, kind = excluded.kind,
            state = excluded.state, armed_revision = excluded.armed_revision,
            armed_at_ms = excluded.armed_at_ms
    """,
    disarm="DELETE FROM phronomy_timers WHERE instance_id = :id AND name = :name",
    # a fired entry of a timer disarmed (or armed anew) never reaches the state
    refuse_fired="""
        UPDATE phronomy_inbox SET status = 'refused', revision = :revision,
            consumed_at_ms = :now, detail = :detail
        WHERE instance_id = :id AND status = 'pending'
          AND substr(event_id, 1, :length) = :prefix
    """,
    clear="DELETE FROM phronomy_timers WHERE instance_id = :id",
    list=f"""
        SELECT {_COLUMNS} FROM phronomy_timers AS t WHERE t.instance_id = :id
        ORDER BY t.due_at_ms, t.name
    """,  # noqa: S608 - constant
    # the first timer of each workflow served, on the (workflow, due_at_ms) index
    next_due="""
        SELECT min(first) - :now FROM (
            SELECT (SELECT t.due_at_ms FROM phronomy_timers AS t
                    WHERE t.workflow = w.value ORDER BY t.due_at_ms LIMIT 1) AS first
            FROM (SELECT value FROM json_each(:workflows)) AS w) AS firsts
    """,
    due=f"""
        SELECT {_COLUMNS} FROM phronomy_timers AS t
        JOIN phronomy_workflow_instances AS r ON r.instance_id = t.instance_id
        WHERE t.workflow IN (SELECT value FROM json_each(:workflows))
          AND t.due_at_ms <= :now AND {_FIREABLE}
        ORDER BY t.due_at_ms, t.instance_id, t.name LIMIT :limit
    """,  # noqa: S608 - constant
    # the instances' rows first (in id order), then their timers (a save's order)
    lock="SELECT 1 FROM phronomy_workflow_instances WHERE instance_id = :id",
    take="""
        DELETE FROM phronomy_timers
        WHERE instance_id = :id AND name = :name AND armed_revision = :revision
    """,
)
"""The timers' statements (SQLite's parameter style)."""


def postgres_timers(now: str) -> TimerStatements:
    """The statements in PostgreSQL's style, *now* its clock; a save arms its timers
    at one time (its transaction's, as SQLite's and a MemoryStore's saves do); due
    times are compared with the statement's time (stable: the index bounds the
    scan); a firing locks its instances' rows (in id order) before their timers, as
    a save does (two runtimes firing at once wait for each other in the same
    order)."""
    timers = TimerStatements(*(pyformat(q, now=now) for q in TIMER_STATEMENTS))
    stable = now.replace("clock_timestamp()", "statement_timestamp()")
    at_once = now.replace("clock_timestamp()", "transaction_timestamp()")
    # each workflow's due timers on the (workflow, due_at_ms) index, whatever the
    # statistics say (the store runs no ANALYZE)
    due = f"""
        SELECT {_COLUMNS}
        FROM jsonb_array_elements_text(%(workflows)s::jsonb) AS w(value)
        CROSS JOIN LATERAL (
            SELECT * FROM phronomy_timers AS d
            WHERE d.workflow = w.value AND d.due_at_ms <= {stable}
            ORDER BY d.due_at_ms LIMIT %(limit)s) AS t
        JOIN phronomy_workflow_instances AS r ON r.instance_id = t.instance_id
        WHERE {pyformat(_FIREABLE, now=stable)}
        ORDER BY t.due_at_ms, t.instance_id, t.name LIMIT %(limit)s
    """  # noqa: S608 - constant
    timers = timers._replace(arm=pyformat(TIMER_STATEMENTS.arm, now=at_once))
    next_due = timers.next_due.replace(") AS w)", ") AS w(value))")
    return timers._replace(due=due, next_due=next_due, lock=f"{timers.lock} FOR UPDATE")


_TABLE = """CREATE TABLE phronomy_timers (
    instance_id    {text}   NOT NULL,
    name           {text}   NOT NULL,
    due_at_ms      {int}    NOT NULL,
    event          {text}   NOT NULL,
    payload        {blob}   NOT NULL,
    kind           {text}   NOT NULL CHECK (kind IN ('timeout', 'timer', 'start',
                               'retry')),
    state          {text},
    armed_revision {int}    NOT NULL,
    armed_at_ms    {int}    NOT NULL,
    workflow       {text}   NOT NULL,
    PRIMARY KEY (instance_id, name)
){options}"""
_INDEX = "CREATE INDEX phronomy_timers_due ON phronomy_timers (workflow, due_at_ms)"

SQLITE_MIGRATION = (
    _TABLE.format(text="TEXT", int="INTEGER", blob="BLOB", options=" STRICT"),
    _INDEX,
    """CREATE TRIGGER phronomy_timers_delete AFTER DELETE
    ON phronomy_workflow_instances BEGIN
        DELETE FROM phronomy_timers WHERE instance_id = OLD.instance_id;
    END""",
)
"""The SQLite store's version 6: durable timers."""

POSTGRES_MIGRATION = (
    _TABLE.format(text="text", int="bigint", blob="bytea", options=""),
    _INDEX,
    """CREATE FUNCTION phronomy_timers_forget() RETURNS trigger LANGUAGE plpgsql
    SET search_path FROM CURRENT AS $$
    BEGIN
        DELETE FROM phronomy_timers WHERE instance_id = OLD.instance_id;
        RETURN NULL;
    END $$""",
    """CREATE TRIGGER phronomy_timers_delete AFTER DELETE
        ON phronomy_workflow_instances
        FOR EACH ROW EXECUTE FUNCTION phronomy_timers_forget()""",
)
"""The PostgreSQL store's version 5: durable timers."""


def timer_from_row(row: tuple[Any, ...]) -> StoredTimer:
    """A row of the timers table (its columns, in order) as a timer."""
    return StoredTimer(
        workflow_instance_id=row[0],
        name=row[1],
        due_at_ms=int(row[2]),
        event=row[3],
        payload=bytes(row[4]),
        kind=row[5],
        state=row[6],
        armed_revision=int(row[7]),
        armed_at_ms=int(row[8]),
        workflow=row[9],
    )


def arm_and_disarm(
    conn: Connection,
    workflow_instance_id: str,
    *,
    revision: int,
    arm: tuple[TimerSpec, ...],
    disarm: tuple[str, ...],
    closing: bool,
    sql: TimerStatements,
    now: int,
) -> None:
    """The timer changes of the save that produced *revision* (in its transaction): a
    *closing* save drops every timer; otherwise the *disarm* names go, and *arm* is
    armed (an armed name replaces its timer); the fired, unapplied entries of both
    are refused (an instance's first save has none)."""
    changes = timer_changes(
        workflow_instance_id, revision, arm, disarm, closing, sql, now
    )
    for statement, params in changes:
        conn.execute(statement, params)


def timer_changes(
    workflow_instance_id: str,
    revision: int,
    arm: tuple[TimerSpec, ...],
    disarm: tuple[str, ...],
    closing: bool,
    sql: TimerStatements,
    now: int,
) -> list[tuple[str, dict[str, Any]]]:
    """The statements of :func:`arm_and_disarm`, in order (none reads a result)."""
    iid = workflow_instance_id
    if closing:
        return [(sql.clear, {"id": iid})]
    statements: list[tuple[str, dict[str, Any]]] = [
        (sql.clear if name == ALL_TIMERS else sql.disarm, {"id": iid, "name": name})
        for name in disarm
    ]
    for name in (*disarm, *(spec.name for spec in arm)) if revision > 1 else ():
        prefix = disarm_prefix(name)
        statements.append(
            (
                sql.refuse_fired,
                {
                    "id": iid,
                    "revision": revision,
                    "now": now,
                    "detail": f"timer {name!r} was disarmed before it was applied",
                    "length": len(prefix),
                    "prefix": prefix,
                },
            )
        )
    statements.extend(
        (
            sql.arm,
            {
                "id": iid,
                "name": spec.name,
                "now": now,
                "delay": spec.delay_ms,
                "event": spec.event,
                "payload": spec.payload,
                "kind": spec.kind,
                "state": spec.state,
                "revision": revision,
            },
        )
        for spec in arm
    )
    return statements


def _served(owner: str, workflows: tuple[str, ...], now: int) -> dict[str, Any]:
    return {"owner": owner, "workflows": json.dumps(workflows), "now": now}


def next_due(
    conn: Connection,
    owner: str,
    workflows: tuple[str, ...],
    sql: TimerStatements,
    now: int,
) -> int | None:
    """Milliseconds until the first timer the runtime may fire is due (``<= 0``: one
    is due), or ``None`` when there is none."""
    row = conn.execute(sql.next_due, _served(owner, workflows, now)).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def fire_steps(
    op: FireOp, sql: TimerStatements, inbox: InboxStatements, now: int
) -> Steps:
    """Fire up to ``op.limit`` due timers ``op.owner`` may fire (of ``op.workflows``):
    each is deleted and its event stored in its instance's inbox, in this
    transaction. Returns how many were stored (a timer whose instance closed
    meanwhile just goes).

    Each step is one round trip for all the timers on PostgreSQL: read the due
    timers; lock their instances' rows, in instance id order, then take the timers (a
    row before its timers, as a save); number the events in their inboxes; insert
    them, with the notification. An instance with more than one due timer numbers its
    next event in a round of its own, after its earlier one was inserted or given
    back.
    """
    served = {**_served(op.owner, op.workflows, now), "limit": op.limit}
    (due,) = yield [(sql.due, served)], True
    timers = [timer_from_row(row) for row in due.fetchall()]
    instances = sorted({timer.workflow_instance_id for timer in timers})
    locking: list[Statement] = [(sql.lock, {"id": iid}) for iid in instances]
    for timer in timers:
        taking = {
            "id": timer.workflow_instance_id,
            "name": timer.name,
            "revision": timer.armed_revision,
        }
        locking.append((sql.take, taking))
    taken = yield locking, True
    # gone meanwhile: disarmed by a save, or fired by another runtime
    postings = [
        timer.posting()
        for timer, take in zip(timers, taken[len(instances) :], strict=True)
        if take.rowcount
    ]
    fired = 0
    while postings:
        this_round: list[Posting] = []
        later: list[Posting] = []
        seen: set[str] = set()
        for posting in postings:
            iid = posting.workflow_instance_id
            (later if iid in seen else this_round).append(posting)
            seen.add(iid)
        numbering = [
            (inbox.next_seq, {"id": p.workflow_instance_id}) for p in this_round
        ]
        seqs = yield numbering, True
        numbered = [  # none: the instance closed meanwhile
            (posting, int(row[0]))
            for posting, cursor in zip(this_round, seqs, strict=True)
            if (row := cursor.fetchone()) is not None
        ]
        inserting = [(inbox.insert, entry_params(p, seq, now)) for p, seq in numbered]
        if inbox.notify and not later and (fired or numbered):  # one for them all
            inserting.append((inbox.notify, {"kind": "posted"}))  # (or a spare one)
        inserted = yield inserting, True
        stored_before = [  # an entry of the same id: its number goes back
            (inbox.give_back_seq, {"id": posting.workflow_instance_id})
            for (posting, _), cursor in zip(
                numbered, inserted[: len(numbered)], strict=True
            )
            if cursor.fetchone() is None
        ]
        fired += len(numbered) - len(stored_before)
        if stored_before:
            yield stored_before, False
        postings = later
    return fired


def timers_of(
    conn: Connection, workflow_instance_id: str, sql: TimerStatements
) -> tuple[StoredTimer, ...]:
    """The instance's pending timers, soonest first."""
    rows = conn.execute(sql.list, {"id": workflow_instance_id}).fetchall()
    return tuple(timer_from_row(row) for row in rows)
