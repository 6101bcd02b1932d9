"""An instance's history beyond its saves' metadata, written once for both SQL
backends: the state each logged revision saved (a fork from any of them) and the
takeovers of the recovery sweep (SQLite's schema version 7, PostgreSQL's 6)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, NamedTuple

from ._records import Takeover
from ._sql_inbox import pyformat

if TYPE_CHECKING:
    from ._dbapi import Connection

__all__ = [
    "HISTORY_STATEMENTS",
    "POSTGRES_HISTORY",
    "SQLITE_HISTORY",
    "HistoryStatements",
    "log_takeovers",
    "postgres_log",
    "takeovers_of",
]

_TAKEOVERS = """CREATE TABLE phronomy_takeovers (
    instance_id  {text} NOT NULL,
    epoch        {int}  NOT NULL,
    revision     {int}  NOT NULL,
    status       {text} NOT NULL,
    detail       {text},
    taken_at_ms  {int}  NOT NULL,
    PRIMARY KEY (instance_id, epoch)
){options}"""
"""One row per takeover (the epoch it made), the last ``save_log_depth`` of each
instance kept, and none once its row is deleted."""

_LOG_COLUMNS = (
    "instance_id, revision, write_id, status, committed_at_ms, phase, "
    "definition_version, detail, snapshot"
)
_LOG_VALUES = (
    "NEW.instance_id, NEW.revision, NEW.last_write_id, NEW.status, NEW.updated_at_ms, "
    "NEW.phase, NEW.definition_version, NEW.detail, NEW.snapshot"
)

SQLITE_HISTORY = (
    "ALTER TABLE phronomy_save_log ADD COLUMN snapshot BLOB",
    "DROP TRIGGER phronomy_log_insert",
    "DROP TRIGGER phronomy_log_update",
    f"""CREATE TRIGGER phronomy_log_insert AFTER INSERT ON phronomy_workflow_instances
    WHEN NEW.revision > 0 BEGIN
        INSERT INTO phronomy_save_log ({_LOG_COLUMNS}) VALUES ({_LOG_VALUES});
    END""",  # noqa: S608 - constant
    f"""CREATE TRIGGER phronomy_log_update AFTER UPDATE OF revision
    ON phronomy_workflow_instances WHEN NEW.revision > OLD.revision BEGIN
        INSERT INTO phronomy_save_log ({_LOG_COLUMNS}) VALUES ({_LOG_VALUES});
        DELETE FROM phronomy_save_log WHERE instance_id = NEW.instance_id
            AND revision <= NEW.revision - (SELECT value FROM phronomy_settings
                                            WHERE name = 'save_log_depth');
    END""",  # noqa: S608 - constant
    _TAKEOVERS.format(text="TEXT", int="INTEGER", options=" STRICT, WITHOUT ROWID"),
    """CREATE TRIGGER phronomy_takeovers_delete AFTER DELETE
    ON phronomy_workflow_instances BEGIN
        DELETE FROM phronomy_takeovers WHERE instance_id = OLD.instance_id;
    END""",
)
"""The SQLite store's version 7: each logged save keeps its state, and the takeovers
are logged."""

POSTGRES_HISTORY = (
    "ALTER TABLE phronomy_save_log ADD COLUMN snapshot bytea",
    f"""CREATE OR REPLACE FUNCTION phronomy_log_save() RETURNS trigger
    LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
    BEGIN
        IF NEW.revision > 0 AND (TG_OP = 'INSERT' OR NEW.revision > OLD.revision)
        THEN
            INSERT INTO phronomy_save_log ({_LOG_COLUMNS}) VALUES ({_LOG_VALUES});
            DELETE FROM phronomy_save_log WHERE instance_id = NEW.instance_id
                AND revision <= NEW.revision - (SELECT value FROM phronomy_settings
                                                WHERE name = 'save_log_depth');
        END IF;
        RETURN NULL;
    END $$""",  # noqa: S608 - constant
    _TAKEOVERS.format(text="text", int="bigint", options=""),
    """CREATE FUNCTION phronomy_takeovers_forget() RETURNS trigger LANGUAGE plpgsql
    SET search_path FROM CURRENT AS $$
    BEGIN
        DELETE FROM phronomy_takeovers WHERE instance_id = OLD.instance_id;
        RETURN NULL;
    END $$""",
    """CREATE TRIGGER phronomy_takeovers_delete AFTER DELETE
        ON phronomy_workflow_instances
        FOR EACH ROW EXECUTE FUNCTION phronomy_takeovers_forget()""",
)
"""The PostgreSQL store's version 6 (as :data:`SQLITE_HISTORY`)."""


class HistoryStatements(NamedTuple):
    """The history's statements (named parameters; SQLite's style, see
    :func:`~phronomy.storage._sql_inbox.pyformat`)."""

    revision: str
    log_takeover: str
    prune_takeovers: str
    takeovers: str


HISTORY_STATEMENTS = HistoryStatements(
    # a logged revision as its row was then (RevisionOp), the instance's workflow its
    # row's: the load's columns, without a lease
    revision="""
        SELECT l.instance_id, r.workflow, l.revision, l.status, l.phase, l.snapshot,
            l.write_id, l.detail, l.committed_at_ms, l.definition_version, NULL, 0,
            NULL, 0, NULL
        FROM phronomy_save_log AS l
        JOIN phronomy_workflow_instances AS r ON r.instance_id = l.instance_id
        WHERE l.instance_id = :id AND l.revision = :revision
    """,
    log_takeover="""
        INSERT INTO phronomy_takeovers (instance_id, epoch, revision, status, detail,
            taken_at_ms)
        VALUES (:id, :epoch, :revision, :status, :detail, :now)
        ON CONFLICT (instance_id, epoch) DO NOTHING
    """,
    prune_takeovers="""
        DELETE FROM phronomy_takeovers WHERE instance_id = :id AND epoch <= (
            SELECT epoch FROM phronomy_takeovers WHERE instance_id = :id
            ORDER BY epoch DESC LIMIT 1
            OFFSET (SELECT value FROM phronomy_settings WHERE name = 'save_log_depth'))
    """,
    takeovers="""
        SELECT epoch, revision, status, detail, taken_at_ms FROM phronomy_takeovers
        WHERE instance_id = :id ORDER BY epoch DESC LIMIT :limit
    """,
)
"""The history's statements (SQLite's parameter style)."""


def postgres_log(now: str) -> HistoryStatements:
    """The history's statements for PostgreSQL, its clock the SQL expression *now*."""
    return HistoryStatements(*(pyformat(q, now=now) for q in HISTORY_STATEMENTS))


def log_takeovers(
    conn: Connection, sql: HistoryStatements, rows: list[tuple[Any, ...]], now: int
) -> None:
    """Log the takeovers the recovery statement returned *rows* for (each its instance
    id, status, new epoch, revision and detail), each instance's oldest ones beyond the
    save log's depth dropped: two statements for the whole batch, each run over all
    its rows at once (``executemany``: one round trip on PostgreSQL, where a statement
    per row made a pass over 100 takeovers take about 30 ms of round trips)."""
    if not rows:
        return
    with contextlib.closing(conn.cursor()) as cursor:
        cursor.executemany(
            sql.log_takeover,
            [
                {
                    "id": iid,
                    "epoch": epoch,
                    "revision": revision,
                    "status": status,
                    "detail": detail,
                    "now": now,
                }
                for iid, status, epoch, revision, detail in rows
            ],
        )
        cursor.executemany(sql.prune_takeovers, [{"id": row[0]} for row in rows])


def takeovers_of(
    conn: Connection, sql: HistoryStatements, workflow_instance_id: str, limit: int
) -> tuple[Takeover, ...]:
    """The instance's logged takeovers, newest first (:class:`TakeoversOp`)."""
    params = {"id": workflow_instance_id, "limit": limit}
    return tuple(
        Takeover(
            epoch=int(row[0]),
            revision=int(row[1]),
            status=row[2],
            detail=row[3],
            taken_at_ms=int(row[4]),
        )
        for row in conn.execute(sql.takeovers, params)
    )
