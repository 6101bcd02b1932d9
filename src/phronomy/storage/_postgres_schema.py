"""The PostgreSQL store's schema, its migrations and its SQL statements.

The same tables and the same rules as the SQLite store: every write is one
conditional statement, and triggers keep the save log in the same transaction. Each
migration brings the schema from version i to i + 1; later releases append steps.
"""

from __future__ import annotations

from ._sql_ops import Statements

__all__ = [
    "COLUMNS",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "SQL_BEGIN",
    "SQL_CLEAR_VERSION",
    "SQL_CREATE",
    "SQL_CREATE_VERSION_TABLE",
    "SQL_DELETE",
    "SQL_FIND_WRITE",
    "SQL_HISTORY",
    "SQL_LIST",
    "SQL_LOAD",
    "SQL_LOCK_SCHEMA",
    "SQL_MARK",
    "SQL_MARK_OR_CREATE",
    "SQL_RESUME",
    "SQL_REVISION",
    "SQL_SCHEMA_VERSION",
    "SQL_SET_LOG_DEPTH",
    "SQL_SET_VERSION",
    "SQL_TERMINATE",
    "SQL_UPDATE",
    "SQL_XACT",
    "SQL_XACT_STATUS",
    "STATEMENTS",
]

SCHEMA_VERSION = 2
"""The newest schema this release writes (the SQLite store's numbering)."""

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
        """CREATE FUNCTION phronomy_log_save() RETURNS trigger LANGUAGE plpgsql AS $$
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
        """CREATE FUNCTION phronomy_log_forget() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            DELETE FROM phronomy_save_log WHERE instance_id = OLD.instance_id;
            RETURN NULL;
        END $$""",
        """CREATE TRIGGER phronomy_log_delete AFTER DELETE ON phronomy_workflow_instances
            FOR EACH ROW EXECUTE FUNCTION phronomy_log_forget()""",
    ),
)

COLUMNS = (
    "instance_id, workflow, revision, status, phase, snapshot, last_write_id, detail, "
    "updated_at_ms, definition_version"
)
SQL_REVISION = "SELECT revision FROM phronomy_workflow_instances WHERE instance_id = %s"
SQL_LOAD = f"SELECT {COLUMNS} FROM phronomy_workflow_instances WHERE instance_id = %s"  # noqa: S608 - constant
SQL_LIST = """
    SELECT instance_id, workflow, revision, status, phase, NULL, last_write_id, detail,
        updated_at_ms, definition_version
    FROM phronomy_workflow_instances
    WHERE (%(status)s::text IS NULL OR status = %(status)s)
      AND (%(workflow)s::text IS NULL OR workflow = %(workflow)s)
      AND (%(after)s::text IS NULL OR instance_id > %(after)s)
    ORDER BY instance_id LIMIT %(limit)s
"""
SQL_HISTORY = """
    SELECT revision, status, phase, write_id, committed_at_ms, definition_version, detail
    FROM phronomy_save_log WHERE instance_id = %s ORDER BY revision DESC LIMIT %s
"""
SQL_FIND_WRITE = (
    "SELECT revision FROM phronomy_save_log WHERE instance_id = %s AND write_id = %s"
)
SQL_BEGIN = f"""
    INSERT INTO phronomy_workflow_instances AS t
        (instance_id, workflow, revision, status, created_at_ms, updated_at_ms)
    VALUES (%(id)s, %(workflow)s, 0, 'running', {_NOW_MS}, {_NOW_MS})
    ON CONFLICT (instance_id) DO UPDATE SET
        status = 'running',
        updated_at_ms = excluded.updated_at_ms,
        workflow = CASE WHEN t.workflow = '' THEN excluded.workflow ELSE t.workflow END
    WHERE t.revision = coalesce(%(expected)s::bigint, 0)
      AND t.status != 'recovery_required'
"""  # noqa: S608 - constant
SQL_RESUME = f"""
    UPDATE phronomy_workflow_instances SET
        status = 'running', updated_at_ms = {_NOW_MS},
        workflow = CASE WHEN workflow = '' THEN %(workflow)s ELSE workflow END
    WHERE instance_id = %(id)s AND revision = %(expected)s
      AND status != 'recovery_required'
"""  # noqa: S608 - constant
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
        workflow = CASE WHEN t.workflow = '' THEN excluded.workflow ELSE t.workflow END
    WHERE t.revision = 0
"""  # noqa: S608 - constant
SQL_UPDATE = f"""
    UPDATE phronomy_workflow_instances SET
        revision = revision + 1, status = %(status)s, phase = %(phase)s,
        snapshot = %(snapshot)s, last_write_id = %(write_id)s, detail = %(detail)s,
        updated_at_ms = {_NOW_MS}, definition_version = %(version)s,
        workflow = CASE WHEN workflow = '' THEN %(workflow)s ELSE workflow END
    WHERE instance_id = %(id)s AND revision = %(expected)s
"""  # noqa: S608 - constant
SQL_MARK = f"""
    UPDATE phronomy_workflow_instances SET status = %(status)s, detail = %(detail)s,
        updated_at_ms = {_NOW_MS}
    WHERE instance_id = %(id)s AND (%(expected)s::bigint IS NULL OR revision = %(expected)s)
"""  # noqa: S608 - constant
SQL_MARK_OR_CREATE = f"""
    INSERT INTO phronomy_workflow_instances AS t
        (instance_id, workflow, revision, status, detail, created_at_ms, updated_at_ms)
    VALUES (%(id)s, %(workflow)s, 0, %(status)s, %(detail)s, {_NOW_MS}, {_NOW_MS})
    ON CONFLICT (instance_id) DO UPDATE SET
        status = excluded.status, detail = excluded.detail,
        updated_at_ms = excluded.updated_at_ms
    WHERE %(expected)s::bigint IS NULL OR t.revision = %(expected)s
"""  # noqa: S608 - constant
SQL_DELETE = (
    "DELETE FROM phronomy_workflow_instances WHERE instance_id = %s AND revision = %s"
)
SQL_SET_LOG_DEPTH = (
    "UPDATE phronomy_settings SET value = %s WHERE name = 'save_log_depth' "
    "AND value != %s"
)
SQL_TERMINATE = """
    SELECT pg_terminate_backend(pid) FROM pg_stat_activity
    WHERE pid = %(pid)s AND backend_xid::text::bigint = %(xid)s::bigint %% 4294967296
"""
"""End the backend still running the failed write (its transaction then aborts)."""
SQL_XACT = "SELECT pg_current_xact_id()::text, pg_backend_pid()"
"""The transaction id of a write (learnt before it writes) and its backend."""
SQL_XACT_STATUS = "SELECT pg_xact_status(%s::xid8)"
"""``committed``, ``aborted``, ``in progress`` or NULL (too old to tell)."""

STATEMENTS = Statements(
    load=SQL_LOAD,
    revision=SQL_REVISION,
    list=SQL_LIST,
    history=SQL_HISTORY,
    find_write=SQL_FIND_WRITE,
    begin=SQL_BEGIN,
    resume=SQL_RESUME,
    create=SQL_CREATE,
    update=SQL_UPDATE,
    mark=SQL_MARK,
    mark_or_create=SQL_MARK_OR_CREATE,
    delete=SQL_DELETE,
)
