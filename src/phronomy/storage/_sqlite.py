"""The embedded default store: one SQLite file, safe for several processes on one host."""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
from typing import TYPE_CHECKING, Any, final

import outcome

from phronomy.errors import ConflictError, UnsupportedBackendError

from ._records import (
    READ_OPS,
    BeginOp,
    DeleteOp,
    InstancePage,
    InstanceStatus,
    ListOp,
    LoadOp,
    MarkOp,
    SaveOp,
    SaveOutcome,
    SaveRequest,
    StoredRecord,
)
from ._store import BaseStore

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from ._records import StoreOp

__all__ = ["SCHEMA_VERSION", "SQLiteStore"]

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
"""``PRAGMA user_version`` of the newest schema this release writes."""

_NETWORK_FILESYSTEMS = frozenset({
    "nfs", "nfs4", "cifs", "smb", "smbfs", "smb3", "lustre", "9p", "afs", "ceph",
    "glusterfs", "fuse.sshfs", "fuse.glusterfs", "fuse.s3fs", "gpfs", "ocfs2", "beegfs",
})  # fmt: skip

# Each migration brings the schema from version i to i + 1. Later releases append
# (for example the lease and fencing columns of cross-process admission); they never
# rewrite an earlier step.
_MIGRATIONS: tuple[tuple[str, ...], ...] = (
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
)

_COLUMNS = "instance_id, workflow, revision, status, phase, snapshot, last_write_id, detail, updated_at_ms"
_LIST_COLUMNS = "instance_id, workflow, revision, status, phase, NULL, last_write_id, detail, updated_at_ms"

_SQL_LOAD = f"SELECT {_COLUMNS} FROM phronomy_workflow_instances WHERE instance_id = ?"  # noqa: S608 - constant
_SQL_BEGIN = """
    INSERT INTO phronomy_workflow_instances
        (instance_id, workflow, revision, status, created_at_ms, updated_at_ms)
    VALUES (:id, :workflow, 0, 'running', :now, :now)
    ON CONFLICT (instance_id) DO UPDATE SET
        status = 'running',
        updated_at_ms = excluded.updated_at_ms,
        workflow = CASE WHEN workflow = '' THEN excluded.workflow ELSE workflow END
    WHERE revision = coalesce(:expected, 0) AND status != 'recovery_required'
"""
# An upsert cannot express "the row must exist at revision N": resuming updates only.
_SQL_RESUME = """
    UPDATE phronomy_workflow_instances SET
        status = 'running', updated_at_ms = :now,
        workflow = CASE WHEN workflow = '' THEN :workflow ELSE workflow END
    WHERE instance_id = :id AND revision = :expected AND status != 'recovery_required'
"""
_SQL_CREATE = """
    INSERT INTO phronomy_workflow_instances
        (instance_id, workflow, revision, status, phase, snapshot, last_write_id,
         created_at_ms, updated_at_ms)
    VALUES (:id, :workflow, 1, :status, :phase, :snapshot, :write_id, :now, :now)
    ON CONFLICT (instance_id) DO UPDATE SET
        revision = 1, status = excluded.status, phase = excluded.phase,
        snapshot = excluded.snapshot, last_write_id = excluded.last_write_id,
        detail = NULL, updated_at_ms = excluded.updated_at_ms,
        workflow = CASE WHEN workflow = '' THEN excluded.workflow ELSE workflow END
    WHERE revision = 0
"""
_SQL_UPDATE = """
    UPDATE phronomy_workflow_instances SET
        revision = revision + 1, status = :status, phase = :phase, snapshot = :snapshot,
        last_write_id = :write_id, detail = NULL, updated_at_ms = :now,
        workflow = CASE WHEN workflow = '' THEN :workflow ELSE workflow END
    WHERE instance_id = :id AND revision = :expected
"""
_SQL_MARK = """
    UPDATE phronomy_workflow_instances SET status = :status, detail = :detail, updated_at_ms = :now
    WHERE instance_id = :id AND (:expected IS NULL OR revision = :expected)
"""
_SQL_MARK_OR_CREATE = """
    INSERT INTO phronomy_workflow_instances
        (instance_id, workflow, revision, status, detail, created_at_ms, updated_at_ms)
    VALUES (:id, :workflow, 0, :status, :detail, :now, :now)
    ON CONFLICT (instance_id) DO UPDATE SET
        status = excluded.status, detail = excluded.detail,
        updated_at_ms = excluded.updated_at_ms
    WHERE :expected IS NULL OR revision = :expected
"""
_SQL_DELETE = (
    "DELETE FROM phronomy_workflow_instances WHERE instance_id = ? AND revision = ?"
)
_SQL_FIND_WRITE = (
    "SELECT revision FROM phronomy_save_log WHERE instance_id = ? AND write_id = ?"
)
_SQL_LIST = f"""
    SELECT {_LIST_COLUMNS} FROM phronomy_workflow_instances
    WHERE (:status IS NULL OR status = :status) AND (:after IS NULL OR instance_id > :after)
    ORDER BY instance_id LIMIT :limit
"""  # noqa: S608 - constant


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _record(row: tuple[Any, ...]) -> StoredRecord:
    return StoredRecord(
        workflow_instance_id=row[0],
        workflow=row[1],
        revision=row[2],
        status=row[3],
        phase=row[4],
        snapshot=row[5],
        write_id=row[6],
        detail=row[7],
        updated_at_ms=row[8],
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


@final
class SQLiteStore(BaseStore):
    """A :class:`WorkflowStore` in one SQLite file (the embedded default).

    * WAL journal, ``synchronous=FULL`` (a saved terminal state survives power loss),
      ``BEGIN IMMEDIATE`` for every write, a busy timeout for other processes.
    * One connection for writes and one for reads (WAL lets a read run while a write
      transaction commits), each never used by two threads at once (a lock each; the
      runtime runs writes in a single-worker pool and reads in another).
    * The schema is created and migrated on first use (``PRAGMA user_version``).
    * Every save is one conditional statement; a trigger appends it to
      ``phronomy_save_log`` with its ``write_id`` in the same transaction (the last
      :data:`~phronomy.storage.SAVE_LOG_DEPTH` saves of each instance are kept).
    * :meth:`execute` commits a batch of saves in one transaction (group commit); each
      save is still revision-checked on its own.
    * After an error whose commit outcome is unknown, the open transaction is rolled
      back first; only then is the row reloaded and the save classified by
      ``write_id``.

    Several processes on one host may share the file. A path on a network filesystem
    is refused (SQLite's locking does not work there) unless
    ``allow_network_filesystem=True``, which logs a warning instead.
    """

    max_concurrency = 1

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout: float = 30.0,
        allow_network_filesystem: bool = False,
        fault_hook: Callable[[str], None] | None = None,
    ) -> None:
        """Configure a store; the file is opened on first use (in a worker thread).

        Args:
            path: the database file.
            busy_timeout: seconds to wait for another process's write lock.
            allow_network_filesystem: open a file on NFS/SMB/... with a warning.
            fault_hook: test hook called with a fault point name (``"save.statement"``,
                ``"commit.before"``, ``"commit.after"``); it may raise or delay.
        """
        self._path = os.fspath(path)
        self._busy_timeout = busy_timeout
        self._allow_network_fs = allow_network_filesystem
        self._fault = fault_hook
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._read_lock = threading.Lock()
        self._read_conn: sqlite3.Connection | None = None

    @property
    def path(self) -> str:
        """The database file."""
        return self._path

    @property
    def identity(self) -> str:
        """``sqlite:`` and the file's real path (one database per file)."""
        if self._path == ":memory:":
            return super().identity
        return f"sqlite:{os.path.realpath(self._path)}"

    def __repr__(self) -> str:
        return f"SQLiteStore({self._path!r})"

    # --- connection ----------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = self._open()
        return self._conn

    @contextlib.contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        """The read connection (autocommit: each statement sees the latest commit)."""
        if self._path == ":memory:":  # another connection would be another database
            with self._lock:
                yield self._connection()
            return
        with self._read_lock:
            if self._read_conn is None:
                self._read_conn = self._open()
            yield self._read_conn

    def _open(self) -> sqlite3.Connection:
        if sqlite3.sqlite_version_info < (3, 37, 0):
            raise UnsupportedBackendError(
                f"SQLiteStore needs SQLite >= 3.37 (STRICT tables, RETURNING); this Python "
                f"links SQLite {sqlite3.sqlite_version}"
            )
        if self._path != ":memory:":
            fstype = filesystem_type(
                os.path.dirname(os.path.abspath(self._path)) or "."
            )
            if fstype in _NETWORK_FILESYSTEMS:
                message = (
                    f"{self._path!r} is on a {fstype} network filesystem, where SQLite's "
                    "locking and WAL do not work; use a local disk (or PostgreSQL)"
                )
                if not self._allow_network_fs:
                    raise UnsupportedBackendError(message)
                logger.warning("%s (allowed by allow_network_filesystem=True)", message)
        conn = sqlite3.connect(
            self._path,
            timeout=self._busy_timeout,
            isolation_level=None,  # autocommit: this store issues BEGIN IMMEDIATE itself
            check_same_thread=False,  # serialized by self._lock and the single-worker pool
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
            self._check_wal(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute("PRAGMA foreign_keys = ON")
            self._migrate(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _check_wal(self, mode: str) -> None:
        if mode != "wal" and self._path != ":memory:":
            raise UnsupportedBackendError(f"{self._path!r} refused WAL mode ({mode})")

    def _check_schema(self, version: int) -> int:
        if version > SCHEMA_VERSION:
            raise UnsupportedBackendError(
                f"{self._path!r} has schema version {version}; this release "
                f"understands up to {SCHEMA_VERSION}"
            )
        return version

    def _migrate(self, conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = self._check_schema(
                conn.execute("PRAGMA user_version").fetchone()[0]
            )
            for step in range(version, SCHEMA_VERSION):
                for statement in _MIGRATIONS[step]:
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {step + 1}")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.rollback()
            raise

    def close(self) -> None:
        """Close the connection (the next call reopens it)."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
        with self._read_lock:
            if self._read_conn is not None:
                self._read_conn.close()
                self._read_conn = None

    def fence(self) -> None:
        """Roll back a transaction left open by a failed write, so it can never commit."""
        with self._lock:
            conn = self._conn
            if conn is not None and conn.in_transaction:
                logger.info("rolling back the open transaction before reconciliation")
                conn.rollback()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        conn = self._connection()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
            self._hook("commit.before")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.rollback()
            raise
        self._hook("commit.after")

    def _hook(self, point: str) -> None:
        if self._fault is not None:
            self._fault(point)

    # --- single operations ---------------------------------------------------------

    def load(self, workflow_instance_id: str) -> StoredRecord | None:
        """See :meth:`~phronomy.storage.WorkflowStore.load`."""
        with self._reading() as conn:
            row = conn.execute(_SQL_LOAD, (workflow_instance_id,)).fetchone()
        return None if row is None else _record(row)

    def begin(
        self,
        workflow_instance_id: str,
        workflow: str,
        *,
        expected_revision: int | None = None,
    ) -> bool:
        """See :meth:`~phronomy.storage.WorkflowStore.begin`."""
        with self._lock, self._transaction() as conn:
            return self._begin(conn, workflow_instance_id, workflow, expected_revision)

    def save(self, request: SaveRequest) -> int:
        """See :meth:`~phronomy.storage.WorkflowStore.save`."""
        with self._lock, self._transaction() as conn:
            return self._save(conn, request)

    def mark(
        self,
        workflow_instance_id: str,
        status: InstanceStatus,
        *,
        expected_revision: int | None = None,
        detail: str | None = None,
        create: bool = False,
        workflow: str = "",
    ) -> bool:
        """See :meth:`~phronomy.storage.WorkflowStore.mark`."""
        with self._lock, self._transaction() as conn:
            return self._mark(
                conn,
                MarkOp(
                    workflow_instance_id=workflow_instance_id,
                    status=status,
                    expected_revision=expected_revision,
                    detail=detail,
                    create=create,
                    workflow=workflow,
                ),
            )

    def delete(self, workflow_instance_id: str, expected_revision: int) -> None:
        """See :meth:`~phronomy.storage.WorkflowStore.delete`."""
        with self._lock, self._transaction() as conn:
            self._delete(conn, workflow_instance_id, expected_revision)

    def find_write(self, workflow_instance_id: str, write_id: str) -> int | None:
        """See :meth:`~phronomy.storage.WorkflowStore.find_write`."""
        with self._reading() as conn:
            row = conn.execute(
                _SQL_FIND_WRITE, (workflow_instance_id, write_id)
            ).fetchone()
        return None if row is None else int(row[0])

    def list_instances(
        self,
        *,
        status: InstanceStatus | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> InstancePage:
        """See :meth:`~phronomy.storage.WorkflowStore.list_instances`."""
        if limit < 1:
            raise ValueError("limit must be >= 1")
        with self._reading() as conn:
            rows = conn.execute(
                _SQL_LIST, {"status": status, "after": after, "limit": limit + 1}
            ).fetchall()
        records = tuple(_record(row) for row in rows[:limit])
        more = len(rows) > limit
        return InstancePage(
            records=records,
            next_after=records[-1].workflow_instance_id if more else None,
        )

    # --- group commit --------------------------------------------------------------

    def execute(self, ops: Sequence[StoreOp]) -> list[outcome.Outcome[Any]]:
        """Run a batch in order; all of it in one ``BEGIN IMMEDIATE`` transaction.

        A conflict fails only its own operation. If the transaction as a whole fails
        with an unknown outcome, each save in it is reconciled on its own.
        """
        if all(isinstance(op, READ_OPS) for op in ops):
            # reads only: the read connection, no transaction
            return [outcome.capture(self._run_op, op) for op in ops]
        with self._lock:
            results: list[outcome.Outcome[Any]] = []
            try:
                with self._transaction() as conn:
                    self._apply_batch(conn, ops, results)
            except Exception as exc:  # noqa: BLE001 - the whole transaction's outcome is unknown
                return [
                    self._uncertain(op, exc, results, i) for i, op in enumerate(ops)
                ]
            return results

    def _uncertain(
        self,
        op: StoreOp,
        error: Exception,
        results: list[outcome.Outcome[Any]],
        index: int,
    ) -> outcome.Outcome[Any]:
        if isinstance(op, SaveOp):
            return outcome.Value(self.reconcile(op.request, error))
        if isinstance(op, READ_OPS) and index < len(results):
            return results[index]  # a read that already completed stays valid
        return outcome.Error(error)

    def _apply_batch(
        self,
        conn: sqlite3.Connection,
        ops: Sequence[StoreOp],
        results: list[outcome.Outcome[Any]],
    ) -> None:
        """Append each op's outcome to *results*, in order."""
        for op in ops:
            if isinstance(op, SaveOp):
                try:
                    revision = self._save(conn, op.request)
                except ConflictError as exc:
                    done = SaveOutcome(outcome="known_failure", error=exc)
                else:
                    done = SaveOutcome(outcome="success", revision=revision)
                results.append(outcome.Value(done))
            else:
                results.append(self._apply_one(conn, op))

    def _apply_one(
        self,
        conn: sqlite3.Connection,
        op: LoadOp | ListOp | BeginOp | MarkOp | DeleteOp,
    ) -> outcome.Outcome[Any]:
        if isinstance(op, LoadOp):
            row = conn.execute(_SQL_LOAD, (op.workflow_instance_id,)).fetchone()
            return outcome.Value(None if row is None else _record(row))
        if isinstance(op, ListOp):
            return outcome.capture(
                self.list_instances, status=op.status, limit=op.limit, after=op.after
            )
        if isinstance(op, BeginOp):
            return outcome.capture(
                self._begin,
                conn,
                op.workflow_instance_id,
                op.workflow,
                op.expected_revision,
            )
        if isinstance(op, MarkOp):
            return outcome.capture(self._mark, conn, op)
        result: outcome.Outcome[Any] = outcome.capture(
            self._delete, conn, op.workflow_instance_id, op.expected_revision
        )
        return result

    # --- statements (called with the lock held, inside a transaction) ------------------

    @staticmethod
    def _mark(conn: sqlite3.Connection, op: MarkOp) -> bool:
        cursor = conn.execute(
            _SQL_MARK_OR_CREATE if op.create else _SQL_MARK,
            {
                "id": op.workflow_instance_id,
                "workflow": op.workflow,
                "status": op.status,
                "detail": op.detail,
                "now": _now_ms(),
                "expected": op.expected_revision,
            },
        )
        return cursor.rowcount == 1

    def _delete(
        self, conn: sqlite3.Connection, workflow_instance_id: str, expected: int
    ) -> None:
        if conn.execute(_SQL_DELETE, (workflow_instance_id, expected)).rowcount != 1:
            raise self._conflict(conn, workflow_instance_id, expected, "delete")

    @staticmethod
    def _begin(
        conn: sqlite3.Connection,
        workflow_instance_id: str,
        workflow: str,
        expected: int | None,
    ) -> bool:
        params = {
            "id": workflow_instance_id,
            "workflow": workflow,
            "now": _now_ms(),
            "expected": expected,
        }
        cursor = conn.execute(_SQL_RESUME if expected else _SQL_BEGIN, params)
        return cursor.rowcount == 1

    def _save(self, conn: sqlite3.Connection, request: SaveRequest) -> int:
        expected = request.expected_revision
        params = {
            "id": request.workflow_instance_id,
            "workflow": request.workflow,
            "status": request.status,
            "phase": request.phase,
            "snapshot": request.snapshot,
            "write_id": request.write_id,
            "now": _now_ms(),
            "expected": expected,
        }
        cursor = conn.execute(_SQL_UPDATE if expected else _SQL_CREATE, params)
        self._hook("save.statement")
        if cursor.rowcount != 1:
            raise self._conflict(conn, request.workflow_instance_id, expected, "save")
        return (expected or 0) + 1

    @staticmethod
    def _conflict(
        conn: sqlite3.Connection,
        workflow_instance_id: str,
        expected: int | None,
        action: str,
    ) -> ConflictError:
        row = conn.execute(
            "SELECT revision FROM phronomy_workflow_instances WHERE instance_id = ?",
            (workflow_instance_id,),
        ).fetchone()
        found = None if row is None else row[0]
        return ConflictError(
            f"cannot {action} workflow instance {workflow_instance_id!r}: expected revision "
            f"{expected}, the store has {found or 'no saved revision'}"
        )
