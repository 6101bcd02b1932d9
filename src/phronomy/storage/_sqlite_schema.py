"""The SQLite store's schema, its migrations and its SQL statements.

Every statement is a constant (no SQL is built from values). Each migration brings the
schema from version i to i + 1; later releases append steps, they never rewrite one.
"""

from __future__ import annotations

import os

from ._sql_history import SQLITE_HISTORY
from ._sql_inbox import CONSUMED_PENDING, INBOX_STATEMENTS
from ._sql_list import LIST_STATEMENTS
from ._sql_ops import Statements
from ._sql_schedules import SQLITE_SCHEDULES
from ._sql_timers import SQLITE_MIGRATION
from ._sql_writes import BARE, TIDY

__all__ = [
    "COLUMNS",
    "MIGRATIONS",
    "NETWORK_FILESYSTEMS",
    "SCHEMA_VERSION",
    "SQL_BEGIN",
    "SQL_BEGIN_NEW",
    "SQL_CREATE",
    "SQL_DELETE",
    "SQL_EXPIRED",
    "SQL_EXPIRE_ALL_LEASES",
    "SQL_FIND_WRITE",
    "SQL_FOREIGN_TABLES",
    "SQL_HISTORY",
    "SQL_LEASE_CLOCK",
    "SQL_LIST",
    "SQL_LOAD",
    "SQL_MARK",
    "SQL_MARK_OR_CREATE",
    "SQL_RECOVER",
    "SQL_RENEW",
    "SQL_REQUEST_CANCEL",
    "SQL_RESUME",
    "SQL_REVISION",
    "SQL_SET_LEASE_CLOCK",
    "SQL_SET_LOG_DEPTH",
    "SQL_UPDATE",
    "STATEMENTS",
    "filesystem_type",
]

SCHEMA_VERSION = 7
"""``PRAGMA user_version`` of the newest schema this release writes."""

NETWORK_FILESYSTEMS = frozenset({
    "nfs", "nfs4", "cifs", "smb", "smbfs", "smb3", "lustre", "9p", "afs", "ceph",
    "glusterfs", "fuse.sshfs", "fuse.glusterfs", "fuse.s3fs", "gpfs", "ocfs2", "beegfs",
})  # fmt: skip

# Each migration brings the schema from version i to i + 1. Later releases append
# (for example the lease and fencing columns of cross-process admission); they never
# rewrite an earlier step.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (  # version 1
        """CREATE TABLE phronomy_workflow_instances (
            instance_id     TEXT    PRIMARY KEY,
            workflow        TEXT    NOT NULL DEFAULT '',
            revision        INTEGER NOT NULL CHECK (revision >= 0),
            status          TEXT    NOT NULL CHECK (status IN
                              ('running', 'halted', 'finished', 'failed', 'recovery_required')),
            phase           TEXT,
            snapshot        BLOB,
            snapshot_format INTEGER NOT NULL DEFAULT 1,
            last_write_id   TEXT,
            detail          TEXT,
            created_at_ms   INTEGER NOT NULL,
            updated_at_ms   INTEGER NOT NULL
        ) STRICT""",
        """CREATE INDEX phronomy_workflow_instances_status
            ON phronomy_workflow_instances (status, instance_id)""",
        """CREATE TABLE phronomy_save_log (
            instance_id     TEXT    NOT NULL,
            revision        INTEGER NOT NULL,
            write_id        TEXT    NOT NULL,
            status          TEXT    NOT NULL,
            committed_at_ms INTEGER NOT NULL,
            PRIMARY KEY (instance_id, revision)
        ) STRICT, WITHOUT ROWID""",
        """CREATE TRIGGER phronomy_log_insert AFTER INSERT ON phronomy_workflow_instances
        WHEN NEW.revision > 0 BEGIN
            INSERT INTO phronomy_save_log VALUES (NEW.instance_id, NEW.revision,
                NEW.last_write_id, NEW.status, NEW.updated_at_ms);
        END""",
        # keeps the last 32 saves per instance (SAVE_LOG_DEPTH; frozen in this step)
        """CREATE TRIGGER phronomy_log_update AFTER UPDATE OF revision
        ON phronomy_workflow_instances WHEN NEW.revision > OLD.revision BEGIN
            INSERT INTO phronomy_save_log VALUES (NEW.instance_id, NEW.revision,
                NEW.last_write_id, NEW.status, NEW.updated_at_ms);
            DELETE FROM phronomy_save_log WHERE instance_id = NEW.instance_id
                AND revision <= NEW.revision - 32;
        END""",
        """CREATE TRIGGER phronomy_log_delete AFTER DELETE ON phronomy_workflow_instances
        BEGIN
            DELETE FROM phronomy_save_log WHERE instance_id = OLD.instance_id;
        END""",
    ),
    (  # version 2: the cancelled status, definition versions, a richer save log whose
        # depth is a setting (SQLite cannot change a CHECK constraint: the table is
        # rebuilt, its rows copied)
        """CREATE TABLE phronomy_workflow_instances_v2 (
            instance_id        TEXT    PRIMARY KEY,
            workflow           TEXT    NOT NULL DEFAULT '',
            revision           INTEGER NOT NULL CHECK (revision >= 0),
            status             TEXT    NOT NULL CHECK (status IN ('running', 'halted',
                                 'finished', 'failed', 'cancelled', 'recovery_required')),
            phase              TEXT,
            snapshot           BLOB,
            snapshot_format    INTEGER NOT NULL DEFAULT 1,
            last_write_id      TEXT,
            detail             TEXT,
            created_at_ms      INTEGER NOT NULL,
            updated_at_ms      INTEGER NOT NULL,
            definition_version TEXT    NOT NULL DEFAULT ''
        ) STRICT""",
        """INSERT INTO phronomy_workflow_instances_v2 (instance_id, workflow, revision,
            status, phase, snapshot, snapshot_format, last_write_id, detail,
            created_at_ms, updated_at_ms)
        SELECT instance_id, workflow, revision, status, phase, snapshot, snapshot_format,
            last_write_id, detail, created_at_ms, updated_at_ms
        FROM phronomy_workflow_instances""",
        "DROP TABLE phronomy_workflow_instances",  # its index and triggers go with it
        "ALTER TABLE phronomy_workflow_instances_v2 RENAME TO phronomy_workflow_instances",
        """CREATE INDEX phronomy_workflow_instances_status
            ON phronomy_workflow_instances (status, instance_id)""",
        """CREATE INDEX phronomy_workflow_instances_workflow
            ON phronomy_workflow_instances (workflow, instance_id)""",
        "ALTER TABLE phronomy_save_log ADD COLUMN phase TEXT",
        "ALTER TABLE phronomy_save_log ADD COLUMN definition_version TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE phronomy_save_log ADD COLUMN detail TEXT",
        """CREATE TABLE phronomy_settings (
            name  TEXT PRIMARY KEY,
            value INTEGER NOT NULL
        ) STRICT""",
        "INSERT INTO phronomy_settings VALUES ('save_log_depth', 32)",
        """CREATE TRIGGER phronomy_log_insert AFTER INSERT ON phronomy_workflow_instances
        WHEN NEW.revision > 0 BEGIN
            INSERT INTO phronomy_save_log (instance_id, revision, write_id, status,
                committed_at_ms, phase, definition_version, detail)
            VALUES (NEW.instance_id, NEW.revision, NEW.last_write_id, NEW.status,
                NEW.updated_at_ms, NEW.phase, NEW.definition_version, NEW.detail);
        END""",
        """CREATE TRIGGER phronomy_log_update AFTER UPDATE OF revision
        ON phronomy_workflow_instances WHEN NEW.revision > OLD.revision BEGIN
            INSERT INTO phronomy_save_log (instance_id, revision, write_id, status,
                committed_at_ms, phase, definition_version, detail)
            VALUES (NEW.instance_id, NEW.revision, NEW.last_write_id, NEW.status,
                NEW.updated_at_ms, NEW.phase, NEW.definition_version, NEW.detail);
            DELETE FROM phronomy_save_log WHERE instance_id = NEW.instance_id
                AND revision <= NEW.revision - (SELECT value FROM phronomy_settings
                                                WHERE name = 'save_log_depth');
        END""",
        """CREATE TRIGGER phronomy_log_delete AFTER DELETE ON phronomy_workflow_instances
        BEGIN
            DELETE FROM phronomy_save_log WHERE instance_id = OLD.instance_id;
        END""",
    ),
    (  # version 3: leases with fencing (one live segment across processes)
        "ALTER TABLE phronomy_workflow_instances ADD COLUMN lease_owner TEXT",
        """ALTER TABLE phronomy_workflow_instances
            ADD COLUMN lease_epoch INTEGER NOT NULL DEFAULT 0""",
        "ALTER TABLE phronomy_workflow_instances ADD COLUMN lease_expires_at_ms INTEGER",
        """ALTER TABLE phronomy_workflow_instances
            ADD COLUMN takeovers INTEGER NOT NULL DEFAULT 0""",
        "ALTER TABLE phronomy_workflow_instances ADD COLUMN cancel_requested TEXT",
        """CREATE INDEX phronomy_workflow_instances_leases
            ON phronomy_workflow_instances (lease_expires_at_ms)
            WHERE lease_owner IS NOT NULL""",
    ),
    (  # version 4: lease times on the machine's monotonic clock of one boot, whose id
        # the 'lease_clock' setting records (-1: the wall clock of version 3; a store
        # that finds another id than its own counts every lease as expired). An
        # earlier release would misread these times: it refuses the new version.
        "INSERT INTO phronomy_settings VALUES ('lease_clock', -1)",
    ),
    (  # version 5: the inbox (events stored before they are acknowledged)
        """ALTER TABLE phronomy_workflow_instances
            ADD COLUMN inbox_seq INTEGER NOT NULL DEFAULT 0""",
        """CREATE TABLE phronomy_inbox (
            instance_id       TEXT    NOT NULL,
            seq               INTEGER NOT NULL,
            event_id          TEXT    NOT NULL,
            event             TEXT    NOT NULL,
            payload           BLOB    NOT NULL,
            input             BLOB,
            expected_revision INTEGER,
            stored_at_ms      INTEGER NOT NULL,
            status            TEXT    NOT NULL CHECK (status IN ('pending',
                                'transitioned', 'rejected', 'dropped', 'refused',
                                'failed')),
            revision          INTEGER,
            consumed_at_ms    INTEGER,
            detail            TEXT,
            PRIMARY KEY (instance_id, seq)
        ) STRICT, WITHOUT ROWID""",
        """CREATE UNIQUE INDEX phronomy_inbox_event_ids
            ON phronomy_inbox (instance_id, event_id)""",
        """CREATE INDEX phronomy_inbox_pending ON phronomy_inbox (instance_id, seq)
            WHERE status = 'pending'""",
        """CREATE TRIGGER phronomy_inbox_delete AFTER DELETE
        ON phronomy_workflow_instances BEGIN
            DELETE FROM phronomy_inbox WHERE instance_id = OLD.instance_id;
        END""",
    ),
    SQLITE_MIGRATION + SQLITE_SCHEDULES,  # version 6: durable timers, schedules
    SQLITE_HISTORY,  # version 7: saved states in the save log, takeovers logged
)

COLUMNS = (
    "instance_id, workflow, revision, status, phase, snapshot, last_write_id, detail, "
    "updated_at_ms, definition_version, lease_owner, lease_epoch, lease_expires_at_ms, "
    "takeovers, cancel_requested"
)

SQL_FOREIGN_TABLES = (
    "SELECT count(*) FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' "
    "AND name NOT LIKE 'phronomy_%'"
)
SQL_REVISION = (
    "SELECT revision, lease_owner, lease_epoch FROM phronomy_workflow_instances "
    "WHERE instance_id = ?"
)
SQL_LOAD = f"SELECT {COLUMNS} FROM phronomy_workflow_instances WHERE instance_id = ?"  # noqa: S608 - constant
_CLAIM = """
        lease_owner = :owner,
        cancel_requested = NULL,
        lease_epoch = lease_epoch + 1,
        lease_expires_at_ms = CASE WHEN :owner IS NULL THEN NULL ELSE :lease_now + :ttl END"""
_CLAIMABLE = """status != 'recovery_required' AND (lease_owner IS NULL
      OR lease_owner = :owner OR lease_expires_at_ms <= :lease_now)"""
SQL_BEGIN = f"""
    INSERT INTO phronomy_workflow_instances
        (instance_id, workflow, revision, status, created_at_ms, updated_at_ms,
         lease_owner, lease_epoch, lease_expires_at_ms)
    VALUES (:id, :workflow, 0, 'running', :now, :now, :owner, 1,
        CASE WHEN :owner IS NULL THEN NULL ELSE :lease_now + :ttl END)
    ON CONFLICT (instance_id) DO UPDATE SET
        status = 'running',
        updated_at_ms = excluded.updated_at_ms,
        workflow = CASE WHEN workflow = '' THEN excluded.workflow ELSE workflow END,
        {_CLAIM}
    WHERE revision = coalesce(:expected, 0) AND {_CLAIMABLE}
    RETURNING lease_epoch
"""  # noqa: S608 - constant
SQL_BEGIN_NEW = """
    INSERT INTO phronomy_workflow_instances
        (instance_id, workflow, revision, status, created_at_ms, updated_at_ms,
         lease_owner, lease_epoch, lease_expires_at_ms)
    VALUES (:id, :workflow, 0, 'running', :now, :now, :owner, 1,
        CASE WHEN :owner IS NULL THEN NULL ELSE :lease_now + :ttl END)
    ON CONFLICT (instance_id) DO NOTHING
    RETURNING lease_epoch
"""
# An upsert cannot express "the row must exist at revision N": resuming updates only.
SQL_RESUME = f"""
    UPDATE phronomy_workflow_instances SET
        status = 'running', updated_at_ms = :now,
        workflow = CASE WHEN workflow = '' THEN :workflow ELSE workflow END,
        {_CLAIM}
    WHERE instance_id = :id AND revision = :expected AND {_CLAIMABLE}
    RETURNING lease_epoch
"""  # noqa: S608 - constant
_FENCED = "lease_owner IS :owner AND (:owner IS NULL OR lease_epoch = :epoch)"
"""A save is accepted only from the lease holder (or, without a lease, when none)."""
_RELEASE = """
        lease_owner = CASE WHEN :status = 'running' THEN lease_owner END,
        lease_expires_at_ms = CASE WHEN :status = 'running'
                                   THEN lease_expires_at_ms END,
        cancel_requested = CASE WHEN :status = 'running' THEN cancel_requested END,
        takeovers = 0"""
"""A save of any status but ``running`` ends the segment: its lease goes with it."""
SQL_CREATE = f"""
    INSERT INTO phronomy_workflow_instances
        (instance_id, workflow, revision, status, phase, snapshot, last_write_id,
         detail, created_at_ms, updated_at_ms, definition_version)
    VALUES (:id, :workflow, 1, :status, :phase, :snapshot, :write_id, :detail, :now,
        :now, :version)
    ON CONFLICT (instance_id) DO UPDATE SET
        revision = 1, status = excluded.status, phase = excluded.phase,
        snapshot = excluded.snapshot, last_write_id = excluded.last_write_id,
        detail = excluded.detail, updated_at_ms = excluded.updated_at_ms,
        definition_version = excluded.definition_version,
        workflow = CASE WHEN workflow = '' THEN excluded.workflow ELSE workflow END,
        {_RELEASE}
    WHERE revision = 0 AND {_FENCED}
"""  # noqa: S608 - constant
SQL_UPDATE = f"""
    UPDATE phronomy_workflow_instances SET
        revision = revision + 1, status = :status, phase = :phase, snapshot = :snapshot,
        last_write_id = :write_id, detail = :detail, updated_at_ms = :now,
        definition_version = :version,
        workflow = CASE WHEN workflow = '' OR (workflow LIKE 'phronomy.execution:%'
            AND :workflow LIKE 'phronomy.execution:%') THEN :workflow ELSE workflow END,
        {_RELEASE}
    WHERE instance_id = :id AND revision = :expected AND {_FENCED}
"""  # noqa: S608 - constant
SQL_HISTORY = """
    SELECT revision, status, phase, write_id, committed_at_ms, definition_version, detail
    FROM phronomy_save_log WHERE instance_id = ? ORDER BY revision DESC LIMIT ?
"""
SQL_SET_LOG_DEPTH = "UPDATE phronomy_settings SET value = ? WHERE name = 'save_log_depth' AND value != ?"
_HOLDS = """(CASE WHEN :owner IS NULL
        THEN NOT (status = 'running' AND lease_owner IS NOT NULL)
        ELSE lease_owner = :owner AND lease_epoch = :epoch END)"""
"""A mark with a lease changes only a row that still holds it; one without a lease
never changes a row that a runtime runs under a lease (only its holder may)."""
_KEEP_LEASE = "('running', 'recovery_required')"
"""A mark to these statuses keeps the lease (an unknown outcome keeps it held)."""
SQL_MARK = f"""
    UPDATE phronomy_workflow_instances SET status = :status, detail = :detail,
        updated_at_ms = :now,
        lease_owner = CASE WHEN :status IN {_KEEP_LEASE} THEN lease_owner END,
        lease_expires_at_ms = CASE WHEN :status IN {_KEEP_LEASE}
                                   THEN lease_expires_at_ms END,
        cancel_requested = CASE WHEN :status IN {_KEEP_LEASE}
                                THEN cancel_requested END
    WHERE instance_id = :id AND (:expected IS NULL OR revision = :expected)
      AND {_HOLDS}
"""  # noqa: S608 - constant
SQL_MARK_OR_CREATE = f"""
    INSERT INTO phronomy_workflow_instances
        (instance_id, workflow, revision, status, detail, created_at_ms, updated_at_ms)
    VALUES (:id, :workflow, 0, :status, :detail, :now, :now)
    ON CONFLICT (instance_id) DO UPDATE SET
        status = excluded.status, detail = excluded.detail,
        updated_at_ms = excluded.updated_at_ms,
        lease_owner = CASE WHEN :status IN {_KEEP_LEASE} THEN lease_owner END,
        lease_expires_at_ms = CASE WHEN :status IN {_KEEP_LEASE}
                                   THEN lease_expires_at_ms END,
        cancel_requested = CASE WHEN :status IN {_KEEP_LEASE}
                                THEN cancel_requested END
    WHERE (:expected IS NULL OR revision = :expected) AND {_HOLDS}
"""  # noqa: S608 - constant
SQL_RENEW = """
    UPDATE phronomy_workflow_instances SET lease_expires_at_ms = :lease_now + :ttl
    WHERE lease_owner = :owner AND instance_id IN (SELECT value FROM json_each(:ids))
    RETURNING instance_id, lease_epoch, cancel_requested, 1, lease_expires_at_ms
"""
SQL_REQUEST_CANCEL = """
    UPDATE phronomy_workflow_instances SET cancel_requested = :reason
    WHERE instance_id = :id AND status = 'running' AND lease_owner IS NOT NULL
    RETURNING lease_epoch, 1
"""
SQL_EXPIRED = """
    SELECT instance_id FROM phronomy_workflow_instances
    WHERE lease_owner IS NOT NULL AND lease_expires_at_ms <= :lease_now
      AND status != 'recovery_required'
    ORDER BY lease_expires_at_ms LIMIT :limit
"""
"""The leases that expired first. It reads the partial lease index in expiry order and
stops at the limit: a leased row is ``running`` or ``recovery_required`` (every other
status releases the lease), and the test written as ``!=`` is one no index serves
(``= 'running'`` makes SQLite read every running instance through the status index and
sort them)."""
SQL_RECOVER = f"""
    UPDATE phronomy_workflow_instances AS t SET
        status = CASE
            WHEN cancel_requested IS NOT NULL THEN 'cancelled'
            WHEN revision = 0 THEN 'failed'
            WHEN takeovers + 1 >= :max THEN 'recovery_required'
            ELSE coalesce((SELECT CASE l.status WHEN 'running' THEN 'halted'
                                  ELSE l.status END FROM phronomy_save_log AS l
                           WHERE l.instance_id = t.instance_id
                             AND l.revision = t.revision), 'halted')
        END,
        detail = CASE
            WHEN cancel_requested IS NOT NULL THEN 'cancelled ('
                || CASE cancel_requested WHEN '' THEN 'no reason given'
                   ELSE cancel_requested END
                || ') by the recovery sweep at revision ' || revision
                || ': its runtime stopped before it cancelled (lease expired)'
            WHEN revision = 0 THEN 'the runtime that started it stopped before its '
                                || 'first save (its lease expired)'
            WHEN takeovers + 1 >= :max THEN 'its runtime stopped ' || (takeovers + 1)
                                || ' times in a row while running it (lease expired)'
            ELSE 'its runtime stopped while running it (lease expired); back at '
                 || 'revision ' || revision
        END,
        updated_at_ms = :now, lease_owner = NULL, lease_expires_at_ms = NULL,
        cancel_requested = NULL, lease_epoch = lease_epoch + 1,
        takeovers = takeovers + 1
    WHERE instance_id IN ({SQL_EXPIRED})
    RETURNING instance_id, status, lease_epoch, revision, detail
"""  # noqa: S608 - constant
"""The recovery sweep: up to ``limit`` expired leases taken over in one statement (the
write transaction holds the database's write lock: no other sweeper sees them)."""
SQL_LEASE_CLOCK = "SELECT value FROM phronomy_settings WHERE name = 'lease_clock'"
SQL_SET_LEASE_CLOCK = (
    "UPDATE phronomy_settings SET value = ? WHERE name = 'lease_clock'"
)
SQL_EXPIRE_ALL_LEASES = """
    UPDATE phronomy_workflow_instances SET lease_expires_at_ms = :lease_now
    WHERE lease_owner IS NOT NULL
"""
"""Every lease expires now (their times are of another boot or clock)."""
SQL_DELETE = (
    "DELETE FROM phronomy_workflow_instances WHERE instance_id = ? AND revision = ?"
    " AND (NOT ? OR (status IN ('finished', 'cancelled') AND lease_owner IS NULL))"
)
SQL_FIND_WRITE = (
    "SELECT revision FROM phronomy_save_log WHERE instance_id = ? AND write_id = ?"
)

SQL_LIST = LIST_STATEMENTS

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
    update_consuming=SQL_UPDATE + CONSUMED_PENDING,
    update_closing=SQL_UPDATE + BARE,
    update_consuming_closing=SQL_UPDATE + CONSUMED_PENDING + TIDY,
    mark=SQL_MARK,
    mark_or_create=SQL_MARK_OR_CREATE,
    delete=SQL_DELETE,
    renew=SQL_RENEW,
    request_cancel=SQL_REQUEST_CANCEL,
    recover=SQL_RECOVER,
    inbox=INBOX_STATEMENTS,
)


def filesystem_type(path: str) -> str | None:
    """The type of the filesystem holding *path* (Linux ``/proc/self/mounts``), or ``None``."""
    try:
        with open("/proc/self/mounts", encoding="utf-8") as mounts:
            entries = [line.split() for line in mounts]
    except OSError:
        return None
    target = os.path.realpath(path)
    best, best_type = "", None
    for entry in entries:
        if len(entry) < 3:
            continue
        mount_point = entry[1].replace("\\040", " ")
        inside = target == mount_point or target.startswith(
            mount_point.rstrip("/") + "/"
        )
        if inside and len(mount_point) >= len(best):
            best, best_type = mount_point, entry[2]
    return best_type
