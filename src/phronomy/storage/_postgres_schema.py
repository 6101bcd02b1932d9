"""The PostgreSQL store's schema, migrations (version i to i + 1) and SQL statements:
the same tables and rules as the SQLite store (one conditional statement per write)."""

from __future__ import annotations

from ._postgres_notify import SQL_NOTIFY
from ._sql_history import POSTGRES_HISTORY, postgres_log
from ._sql_inbox import (
    CONSUMED_PENDING,
    INBOX_STATEMENTS,
    POSTGRES_NEXT_SEQ_NOWAIT,
    POSTGRES_POLL,
    InboxStatements,
    pyformat,
)
from ._sql_list import LIST_STATEMENTS
from ._sql_ops import Statements
from ._sql_schedules import POSTGRES_TIME, postgres_time
from ._sql_writes import BARE, TIDY

__all__ = [
    "COLUMNS",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "SQL_BEGIN",
    "SQL_BEGIN_NEW",
    "SQL_CLAIM",
    "SQL_CLEAR_VERSION",
    "SQL_CREATE",
    "SQL_CREATE_VERSION_TABLE",
    "SQL_DELETE",
    "SQL_EXPIRED",
    "SQL_FIND_WRITE",
    "SQL_HISTORY",
    "SQL_LIST",
    "SQL_LOAD",
    "SQL_LOCK_SCHEMA",
    "SQL_MARK",
    "SQL_MARK_OR_CREATE",
    "SQL_RECOVER",
    "SQL_RENEW",
    "SQL_REQUEST_CANCEL",
    "SQL_RESUME",
    "SQL_REVISION",
    "SQL_SCHEMA_VERSION",
    "SQL_SET_LOG_DEPTH",
    "SQL_SET_VERSION",
    "SQL_UPDATE",
    "STATEMENTS",
]

SCHEMA_VERSION = 6
"""The newest schema this release writes (numbered on its own since version 4)."""

SQL_CREATE_VERSION_TABLE = (
    "CREATE TABLE IF NOT EXISTS phronomy_schema (version integer NOT NULL)"
)
SQL_LOCK_SCHEMA = "SELECT pg_advisory_xact_lock(7212837002)"  # one migrator at a time
SQL_SCHEMA_VERSION = "SELECT max(version) FROM phronomy_schema"
SQL_CLEAR_VERSION = "DELETE FROM phronomy_schema"
SQL_SET_VERSION = "INSERT INTO phronomy_schema VALUES (%s)"

_NOW_MS = "(extract(epoch from clock_timestamp()) * 1000)::bigint"
"""The database's clock, in milliseconds (stored timestamps)."""

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (  # version 1: the tables of the SQLite store's version 1
        """CREATE TABLE phronomy_workflow_instances (
            instance_id     text    PRIMARY KEY,
            workflow        text    NOT NULL DEFAULT '',
            revision        bigint  NOT NULL CHECK (revision >= 0),
            status          text    NOT NULL CHECK (status IN
                              ('running', 'halted', 'finished', 'failed', 'recovery_required')),
            phase           text,
            snapshot        bytea,
            snapshot_format integer NOT NULL DEFAULT 1,
            last_write_id   text,
            detail          text,
            created_at_ms   bigint  NOT NULL,
            updated_at_ms   bigint  NOT NULL
        )""",
        """CREATE INDEX phronomy_workflow_instances_status
            ON phronomy_workflow_instances (status, instance_id)""",
        """CREATE TABLE phronomy_save_log (
            instance_id     text    NOT NULL,
            revision        bigint  NOT NULL,
            write_id        text    NOT NULL,
            status          text    NOT NULL,
            committed_at_ms bigint  NOT NULL,
            PRIMARY KEY (instance_id, revision)
        )""",
    ),
    (  # version 2: cancelled, definition versions, a richer save log, its depth
        """ALTER TABLE phronomy_workflow_instances
            DROP CONSTRAINT phronomy_workflow_instances_status_check""",
        """ALTER TABLE phronomy_workflow_instances ADD CONSTRAINT
            phronomy_workflow_instances_status_check CHECK (status IN ('running',
            'halted', 'finished', 'failed', 'cancelled', 'recovery_required'))""",
        """ALTER TABLE phronomy_workflow_instances
            ADD COLUMN definition_version text NOT NULL DEFAULT ''""",
        """CREATE INDEX phronomy_workflow_instances_workflow
            ON phronomy_workflow_instances (workflow, instance_id)""",
        "ALTER TABLE phronomy_save_log ADD COLUMN phase text",
        "ALTER TABLE phronomy_save_log ADD COLUMN definition_version text NOT NULL DEFAULT ''",
        "ALTER TABLE phronomy_save_log ADD COLUMN detail text",
        """CREATE TABLE phronomy_settings (
            name  text PRIMARY KEY,
            value bigint NOT NULL
        )""",
        "INSERT INTO phronomy_settings VALUES ('save_log_depth', 32)",
        # SET search_path FROM CURRENT: the triggers find their tables whatever the
        # search_path of the session that writes the row
        """CREATE FUNCTION phronomy_log_save() RETURNS trigger LANGUAGE plpgsql
        SET search_path FROM CURRENT AS $$
        BEGIN
            IF NEW.revision > 0 AND (TG_OP = 'INSERT' OR NEW.revision > OLD.revision)
            THEN
                INSERT INTO phronomy_save_log (instance_id, revision, write_id, status,
                    committed_at_ms, phase, definition_version, detail)
                VALUES (NEW.instance_id, NEW.revision, NEW.last_write_id, NEW.status,
                    NEW.updated_at_ms, NEW.phase, NEW.definition_version, NEW.detail);
                DELETE FROM phronomy_save_log WHERE instance_id = NEW.instance_id
                    AND revision <= NEW.revision - (SELECT value FROM phronomy_settings
                                                    WHERE name = 'save_log_depth');
            END IF;
            RETURN NULL;
        END $$""",
        """CREATE TRIGGER phronomy_log_insert AFTER INSERT OR UPDATE OF revision
            ON phronomy_workflow_instances
            FOR EACH ROW EXECUTE FUNCTION phronomy_log_save()""",
        """CREATE FUNCTION phronomy_log_forget() RETURNS trigger LANGUAGE plpgsql
        SET search_path FROM CURRENT AS $$
        BEGIN
            DELETE FROM phronomy_save_log WHERE instance_id = OLD.instance_id;
            RETURN NULL;
        END $$""",
        """CREATE TRIGGER phronomy_log_delete AFTER DELETE ON phronomy_workflow_instances
            FOR EACH ROW EXECUTE FUNCTION phronomy_log_forget()""",
    ),
    (  # version 3: leases with fencing (one live segment across machines)
        """ALTER TABLE phronomy_workflow_instances
            ADD COLUMN lease_owner text,
            ADD COLUMN lease_epoch bigint NOT NULL DEFAULT 0,
            ADD COLUMN lease_expires_at_ms bigint,
            ADD COLUMN takeovers integer NOT NULL DEFAULT 0,
            ADD COLUMN cancel_requested text""",
        """CREATE INDEX phronomy_workflow_instances_leases
            ON phronomy_workflow_instances (lease_expires_at_ms)
            WHERE lease_owner IS NOT NULL""",
    ),
    (  # version 4: the inbox (events stored before they are acknowledged)
        """ALTER TABLE phronomy_workflow_instances
            ADD COLUMN inbox_seq bigint NOT NULL DEFAULT 0""",
        """CREATE TABLE phronomy_inbox (
            instance_id       text    NOT NULL,
            seq               bigint  NOT NULL,
            event_id          text    NOT NULL,
            event             text    NOT NULL,
            payload           bytea   NOT NULL,
            input             bytea,
            expected_revision bigint,
            stored_at_ms      bigint  NOT NULL,
            status            text    NOT NULL CHECK (status IN ('pending',
                                'transitioned', 'rejected', 'dropped', 'refused',
                                'failed')),
            revision          bigint,
            consumed_at_ms    bigint,
            detail            text,
            PRIMARY KEY (instance_id, seq)
        )""",
        """CREATE UNIQUE INDEX phronomy_inbox_event_ids
            ON phronomy_inbox (instance_id, event_id)""",
        """CREATE INDEX phronomy_inbox_pending ON phronomy_inbox (instance_id, seq)
            WHERE status = 'pending'""",
        """CREATE FUNCTION phronomy_inbox_forget() RETURNS trigger LANGUAGE plpgsql
        SET search_path FROM CURRENT AS $$
        BEGIN
            DELETE FROM phronomy_inbox WHERE instance_id = OLD.instance_id;
            RETURN NULL;
        END $$""",
        """CREATE TRIGGER phronomy_inbox_delete AFTER DELETE
            ON phronomy_workflow_instances
            FOR EACH ROW EXECUTE FUNCTION phronomy_inbox_forget()""",
    ),
    POSTGRES_TIME,  # version 5: durable timers and schedules
    POSTGRES_HISTORY,  # version 6: saved states in the save log, takeovers logged
)

COLUMNS = (
    "instance_id, workflow, revision, status, phase, snapshot, last_write_id, detail, "
    "updated_at_ms, definition_version, lease_owner, lease_epoch, lease_expires_at_ms, "
    "takeovers, cancel_requested"
)
SQL_REVISION = (
    "SELECT revision, lease_owner, lease_epoch FROM phronomy_workflow_instances "
    "WHERE instance_id = %s"
)
SQL_LOAD = f"SELECT {COLUMNS} FROM phronomy_workflow_instances WHERE instance_id = %s"  # noqa: S608 - constant
SQL_LIST = tuple(pyformat(s, now="") for s in LIST_STATEMENTS)
SQL_HISTORY = """
    SELECT revision, status, phase, write_id, committed_at_ms, definition_version, detail
    FROM phronomy_save_log WHERE instance_id = %s ORDER BY revision DESC LIMIT %s
"""
SQL_FIND_WRITE = (
    "SELECT revision FROM phronomy_save_log WHERE instance_id = %s AND write_id = %s"
)
_EXPIRES = f"CASE WHEN %(owner)s::text IS NULL THEN NULL ELSE {_NOW_MS} + %(ttl)s END"
_CLAIM = f"""
        lease_owner = %(owner)s,
        cancel_requested = NULL,
        lease_epoch = t.lease_epoch + 1,
        lease_expires_at_ms = {_EXPIRES}"""
_CLAIMABLE = f"""t.status != 'recovery_required' AND (t.lease_owner IS NULL
        OR t.lease_owner = %(owner)s OR t.lease_expires_at_ms <= {_NOW_MS})"""
SQL_BEGIN = f"""
    INSERT INTO phronomy_workflow_instances AS t
        (instance_id, workflow, revision, status, created_at_ms, updated_at_ms,
         lease_owner, lease_epoch, lease_expires_at_ms)
    VALUES (%(id)s, %(workflow)s, 0, 'running', {_NOW_MS}, {_NOW_MS}, %(owner)s, 1,
        {_EXPIRES})
    ON CONFLICT (instance_id) DO UPDATE SET
        status = 'running',
        updated_at_ms = excluded.updated_at_ms,
        workflow = CASE WHEN t.workflow = '' THEN excluded.workflow ELSE t.workflow END,
        {_CLAIM}
    WHERE t.revision = coalesce(%(expected)s::bigint, 0) AND {_CLAIMABLE}
    RETURNING lease_epoch
"""  # noqa: S608 - constant
SQL_BEGIN_NEW = f"""
    INSERT INTO phronomy_workflow_instances
        (instance_id, workflow, revision, status, created_at_ms, updated_at_ms,
         lease_owner, lease_epoch, lease_expires_at_ms)
    VALUES (%(id)s, %(workflow)s, 0, 'running', {_NOW_MS}, {_NOW_MS}, %(owner)s, 1,
        {_EXPIRES})
    ON CONFLICT (instance_id) DO NOTHING
    RETURNING lease_epoch
"""  # noqa: S608 - constant
SQL_RESUME = f"""
    UPDATE phronomy_workflow_instances AS t SET
        status = 'running', updated_at_ms = {_NOW_MS},
        workflow = CASE WHEN t.workflow = '' THEN %(workflow)s ELSE t.workflow END,
        {_CLAIM}
    WHERE t.instance_id = %(id)s AND t.revision = %(expected)s AND {_CLAIMABLE}
    RETURNING lease_epoch
"""  # noqa: S608 - constant
_FENCED = """t.lease_owner IS NOT DISTINCT FROM %(owner)s::text
        AND (%(owner)s::text IS NULL OR t.lease_epoch = %(epoch)s)"""
"""A save is accepted only from the lease holder (or, without a lease, when none)."""
_RELEASE = """
        lease_owner = CASE WHEN %(status)s = 'running' THEN t.lease_owner END,
        lease_expires_at_ms = CASE WHEN %(status)s = 'running'
                                   THEN t.lease_expires_at_ms END,
        cancel_requested = CASE WHEN %(status)s = 'running' THEN t.cancel_requested END,
        takeovers = 0"""
"""A save of any status but ``running`` ends the segment: its lease goes with it."""
SQL_CREATE = f"""
    INSERT INTO phronomy_workflow_instances AS t
        (instance_id, workflow, revision, status, phase, snapshot, last_write_id,
         detail, created_at_ms, updated_at_ms, definition_version)
    VALUES (%(id)s, %(workflow)s, 1, %(status)s, %(phase)s, %(snapshot)s, %(write_id)s,
        %(detail)s, {_NOW_MS}, {_NOW_MS}, %(version)s)
    ON CONFLICT (instance_id) DO UPDATE SET
        revision = 1, status = excluded.status, phase = excluded.phase,
        snapshot = excluded.snapshot, last_write_id = excluded.last_write_id,
        detail = excluded.detail, updated_at_ms = excluded.updated_at_ms,
        definition_version = excluded.definition_version,
        workflow = CASE WHEN t.workflow = '' THEN excluded.workflow ELSE t.workflow END,
        {_RELEASE}
    WHERE t.revision = 0 AND {_FENCED}
"""  # noqa: S608 - constant
SQL_UPDATE = f"""
    UPDATE phronomy_workflow_instances AS t SET
        revision = t.revision + 1, status = %(status)s, phase = %(phase)s,
        snapshot = %(snapshot)s, last_write_id = %(write_id)s, detail = %(detail)s,
        updated_at_ms = {_NOW_MS}, definition_version = %(version)s, workflow = CASE
            WHEN t.workflow = '' OR (t.workflow LIKE 'phronomy.execution:%%' AND
            %(workflow)s LIKE 'phronomy.execution:%%') THEN %(workflow)s ELSE t.workflow END,
        {_RELEASE}
    WHERE t.instance_id = %(id)s AND t.revision = %(expected)s AND {_FENCED}
"""  # noqa: S608 - constant
_HOLDS = """(CASE WHEN %(owner)s::text IS NULL
        THEN NOT (t.status = 'running' AND t.lease_owner IS NOT NULL)
        ELSE t.lease_owner = %(owner)s AND t.lease_epoch = %(epoch)s END)"""
"""A mark with a lease changes only a row that still holds it; one without a lease
never changes a row that a runtime runs under a lease (only its holder may)."""
_KEEP_LEASE = "%(status)s IN ('running', 'recovery_required')"
"""A mark to these statuses keeps the lease (an unknown outcome keeps it held)."""
SQL_MARK = f"""
    UPDATE phronomy_workflow_instances AS t SET status = %(status)s,
        detail = %(detail)s, updated_at_ms = {_NOW_MS},
        lease_owner = CASE WHEN {_KEEP_LEASE} THEN t.lease_owner END,
        lease_expires_at_ms = CASE WHEN {_KEEP_LEASE} THEN t.lease_expires_at_ms END,
        cancel_requested = CASE WHEN {_KEEP_LEASE} THEN t.cancel_requested END
    WHERE t.instance_id = %(id)s
      AND (%(expected)s::bigint IS NULL OR t.revision = %(expected)s) AND {_HOLDS}
"""  # noqa: S608 - constant
SQL_MARK_OR_CREATE = f"""
    INSERT INTO phronomy_workflow_instances AS t
        (instance_id, workflow, revision, status, detail, created_at_ms, updated_at_ms)
    VALUES (%(id)s, %(workflow)s, 0, %(status)s, %(detail)s, {_NOW_MS}, {_NOW_MS})
    ON CONFLICT (instance_id) DO UPDATE SET
        status = excluded.status, detail = excluded.detail,
        updated_at_ms = excluded.updated_at_ms,
        lease_owner = CASE WHEN {_KEEP_LEASE} THEN t.lease_owner END,
        lease_expires_at_ms = CASE WHEN {_KEEP_LEASE} THEN t.lease_expires_at_ms END,
        cancel_requested = CASE WHEN {_KEEP_LEASE} THEN t.cancel_requested END
    WHERE (%(expected)s::bigint IS NULL OR t.revision = %(expected)s) AND {_HOLDS}
"""  # noqa: S608 - constant
SQL_RENEW = f"""
    WITH held AS (
        SELECT instance_id FROM phronomy_workflow_instances
        WHERE lease_owner = %(owner)s
          AND instance_id IN (SELECT jsonb_array_elements_text(%(ids)s::jsonb))
        FOR UPDATE SKIP LOCKED
    ), renewed AS (
        UPDATE phronomy_workflow_instances AS t
        SET lease_expires_at_ms = {_NOW_MS} + %(ttl)s
        FROM held WHERE t.instance_id = held.instance_id
        RETURNING t.instance_id, t.lease_epoch, t.cancel_requested,
            t.lease_expires_at_ms
    )
    SELECT instance_id, lease_epoch, cancel_requested, true, lease_expires_at_ms
    FROM renewed
    UNION ALL
    SELECT instance_id, lease_epoch, cancel_requested, false, lease_expires_at_ms
    FROM phronomy_workflow_instances
    WHERE lease_owner = %(owner)s
      AND instance_id IN (SELECT jsonb_array_elements_text(%(ids)s::jsonb))
      AND instance_id NOT IN (SELECT instance_id FROM renewed)
"""  # noqa: S608 - constant
"""A heartbeat: the rows another transaction is writing are skipped, never waited for
(reported with ``false``: still held, not renewed this time)."""
SQL_REQUEST_CANCEL = """
    WITH asked AS (
        SELECT instance_id FROM phronomy_workflow_instances
        WHERE instance_id = %(id)s AND status = 'running' AND lease_owner IS NOT NULL
        FOR UPDATE SKIP LOCKED
    ), requested AS (
        UPDATE phronomy_workflow_instances AS t SET cancel_requested = %(reason)s
        FROM asked WHERE t.instance_id = asked.instance_id
        RETURNING t.lease_epoch
    )
    SELECT lease_epoch, true FROM requested
    UNION ALL
    SELECT lease_epoch, false FROM phronomy_workflow_instances
    WHERE instance_id = %(id)s AND status = 'running' AND lease_owner IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM requested)
"""
"""Never waits for the row: while another transaction writes it, the request is not
written and says so (``false``, with the lease's epoch): the caller asks again."""
_SWEEP_NOW = "(extract(epoch from statement_timestamp()) * 1000)::bigint"
"""The database's clock when the statement started: stable within it, so that the
planner can bound the lease index scan with it."""
SQL_EXPIRED = f"""
    SELECT instance_id FROM phronomy_workflow_instances
    WHERE lease_owner IS NOT NULL AND lease_expires_at_ms <= {_SWEEP_NOW}
      AND status != 'recovery_required'
    ORDER BY lease_expires_at_ms LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
"""  # noqa: S608 - constant
"""The leases that expired first, locked (another sweeper's, or a row another
transaction writes, are skipped). It reads the partial lease index in expiry order and
stops at the limit, even without statistics: a leased row is ``running`` or
``recovery_required`` (every other status releases the lease), and the test written as
``!=`` is one no index serves and the planner expects most rows to pass (``= 'running'``
makes it read every running instance through the status index and sort them)."""
SQL_RECOVER = f"""
    WITH expired AS ({SQL_EXPIRED})
    UPDATE phronomy_workflow_instances AS t SET
        status = CASE
            WHEN t.cancel_requested IS NOT NULL THEN 'cancelled'
            WHEN t.revision = 0 THEN 'failed'
            WHEN t.takeovers + 1 >= %(max)s THEN 'recovery_required'
            ELSE coalesce((SELECT CASE l.status WHEN 'running' THEN 'halted'
                                  ELSE l.status END FROM phronomy_save_log AS l
                           WHERE l.instance_id = t.instance_id
                             AND l.revision = t.revision), 'halted')
        END,
        detail = CASE
            WHEN t.cancel_requested IS NOT NULL THEN 'cancelled ('
                || CASE t.cancel_requested WHEN '' THEN 'no reason given'
                   ELSE t.cancel_requested END
                || ') by the recovery sweep at revision ' || t.revision
                || ': its runtime stopped before it cancelled (lease expired)'
            WHEN t.revision = 0 THEN 'the runtime that started it stopped before its '
                                  || 'first save (its lease expired)'
            WHEN t.takeovers + 1 >= %(max)s THEN 'its runtime stopped '
                || (t.takeovers + 1) || ' times in a row while running it (lease expired)'
            ELSE 'its runtime stopped while running it (lease expired); back at '
                 || 'revision ' || t.revision
        END,
        updated_at_ms = {_NOW_MS}, lease_owner = NULL, lease_expires_at_ms = NULL,
        cancel_requested = NULL, lease_epoch = t.lease_epoch + 1,
        takeovers = t.takeovers + 1
    FROM expired WHERE t.instance_id = expired.instance_id
    RETURNING t.instance_id, t.status, t.lease_epoch, t.revision, t.detail
"""  # noqa: S608 - constant
"""The recovery sweep: up to ``limit`` expired leases taken over in one statement (a
row locked by :data:`SQL_EXPIRED` is re-checked against the latest version)."""
_WANTED = """(t.status = ANY(string_to_array(%(statuses)s, ','))
            OR (%(placeholders)s AND t.revision = 0 AND t.status = 'failed'))"""
"""The statuses a claim runs on (see :func:`~phronomy.storage.claimable`), joined by
commas (a list parameter costs the driver about as much as the rest of the claim)."""
SQL_CLAIM = f"""
    WITH free AS (
        SELECT %(create)s AND pg_try_advisory_xact_lock(
            hashtext(current_schema()), hashtext(%(id)s)) AS ok
    ), created AS (
        INSERT INTO phronomy_workflow_instances
            (instance_id, workflow, revision, status, created_at_ms, updated_at_ms,
             lease_owner, lease_epoch, lease_expires_at_ms)
        SELECT %(id)s, %(workflow)s, 0, 'running', {_NOW_MS}, {_NOW_MS}, %(owner)s, 1,
            {_NOW_MS} + %(ttl)s
        FROM free WHERE free.ok AND NOT EXISTS (
            SELECT 1 FROM phronomy_workflow_instances WHERE instance_id = %(id)s)
        ON CONFLICT (instance_id) DO NOTHING
        RETURNING lease_epoch
    ), old AS (
        SELECT {COLUMNS} FROM phronomy_workflow_instances AS t
        WHERE t.instance_id = %(id)s AND {_WANTED} AND {_CLAIMABLE}
        FOR UPDATE SKIP LOCKED
    ), claimed AS (
        UPDATE phronomy_workflow_instances AS t SET
            status = 'running', updated_at_ms = {_NOW_MS},
            workflow = CASE WHEN t.workflow = '' THEN %(workflow)s ELSE t.workflow END,
            {_CLAIM}
        FROM old WHERE t.instance_id = old.instance_id
        RETURNING t.lease_epoch
    )
    SELECT 'claimed', old.*, claimed.lease_epoch FROM old, claimed
    UNION ALL
    SELECT 'created', {", ".join(["NULL"] * 15)}, lease_epoch FROM created
    UNION ALL
    SELECT 'current', {COLUMNS}, NULL FROM phronomy_workflow_instances
    WHERE instance_id = %(id)s AND NOT EXISTS (SELECT 1 FROM claimed)
"""  # noqa: S608 - constant
"""A :class:`~phronomy.storage.ClaimOp` in one statement that never waits for a row.

A new row is created only by the transaction that holds the id's advisory lock (taken
without waiting): an ``INSERT ... ON CONFLICT`` would wait for another transaction's
uncommitted insert of the same id (two runtimes creating the same ids in different
orders deadlock), and it is skipped when the row exists (it would wait for a write of
it). An existing row is locked only if it is claimable, with ``SKIP LOCKED``: a row
another transaction writes is not claimed (the runtime refuses the command as busy).
The row is returned as it was before the claim (``claimed``), or as it is
(``current``); ``created`` for a new row."""
SQL_DELETE = (
    "DELETE FROM phronomy_workflow_instances WHERE instance_id = %s AND revision = %s"
    " AND (NOT %s OR (status IN ('finished', 'cancelled') AND lease_owner IS NULL))"
)
SQL_SET_LOG_DEPTH = (
    "UPDATE phronomy_settings SET value = %s WHERE name = 'save_log_depth' "
    "AND value != %s"
)

STATEMENTS = Statements(
    load=SQL_LOAD,
    revision=SQL_REVISION,
    list=SQL_LIST,
    history=SQL_HISTORY,
    find_write=SQL_FIND_WRITE,
    begin=SQL_BEGIN,
    begin_new=SQL_BEGIN_NEW,
    resume=SQL_RESUME,
    create=SQL_CREATE,
    update=SQL_UPDATE,
    update_consuming=SQL_UPDATE + pyformat(CONSUMED_PENDING, now=_NOW_MS),
    update_closing=SQL_UPDATE + pyformat(BARE, now=_NOW_MS),
    update_consuming_closing=SQL_UPDATE
    + pyformat(CONSUMED_PENDING + TIDY, now=_NOW_MS),
    mark=SQL_MARK,
    mark_or_create=SQL_MARK_OR_CREATE,
    delete=SQL_DELETE,
    renew=SQL_RENEW,
    request_cancel=SQL_REQUEST_CANCEL,
    recover=SQL_RECOVER,
    claim=SQL_CLAIM,
    inbox=InboxStatements(
        *(
            pyformat(q, now=_NOW_MS)
            for q in INBOX_STATEMENTS._replace(
                poll=POSTGRES_POLL, next_seq_nowait=POSTGRES_NEXT_SEQ_NOWAIT
            )
        )
    )._replace(notify=SQL_NOTIFY),
    log=postgres_log(_NOW_MS),
    **postgres_time(_NOW_MS),
)
