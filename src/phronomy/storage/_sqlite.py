"""The embedded default store: one SQLite file, safe for several processes on one host."""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import urllib.parse
from typing import TYPE_CHECKING, Any, final

from phronomy.errors import InvalidInputError, StoreUnavailableError

from ._base import BaseStore, Lane
from ._sql_ops import apply_op
from ._sqlite_errors import translate
from ._sqlite_schema import (
    MIGRATIONS,
    NETWORK_FILESYSTEMS,
    SCHEMA_VERSION,
    SQL_FOREIGN_TABLES,
    SQL_SET_LOG_DEPTH,
    STATEMENTS,
    filesystem_type,
    now_ms,
)
from ._store import SAVE_LOG_DEPTH

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from ._ops import StoreOp

__all__ = ["SCHEMA_VERSION", "SQLiteStore"]

logger = logging.getLogger(__name__)


@final
class SQLiteStore(BaseStore[sqlite3.Connection]):
    """A :class:`~phronomy.storage.WorkflowStore` in one SQLite file (the embedded default).

    * WAL journal, ``synchronous=FULL`` (a saved terminal state survives power loss),
      ``BEGIN IMMEDIATE`` for every write, a busy timeout for other processes.
    * One connection for writes and one for reads (WAL lets a read run while a write
      transaction commits), each never used by two threads at once (a lock each; the
      runtime runs writes in a single-worker pool and reads in another). Lease
      renewals have a connection of their own: a renewal waits at most for the commit
      under way, never behind the queue of other writes.
    * The schema is created and migrated on first use (``PRAGMA user_version``).
    * Every save is one conditional statement; a trigger appends it to
      ``phronomy_save_log`` with its ``write_id`` in the same transaction (the last
      ``save_log_depth`` saves of each instance are kept: its history).
    * :meth:`~phronomy.storage.BaseStore.execute` commits a batch of saves in one transaction (group commit); each
      save is still revision-checked on its own.
    * After an error whose commit outcome is unknown, the open transaction is rolled
      back first; only then is the row reloaded and the save classified by
      ``write_id``.

    Several processes on one host may share the file. A path on a network filesystem
    is refused (SQLite's locking does not work there) unless
    ``allow_network_filesystem=True``, which logs a warning instead.

    SQLite errors become :class:`~phronomy.StoreUnavailableError` naming the file and
    what to do; :meth:`open` (called by :func:`~phronomy.open_runtime` before anything
    runs) refuses a file that is not a phronomy database, cannot be opened or written,
    or has a newer schema.
    """

    max_concurrency = 1

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout: float = 30.0,
        allow_network_filesystem: bool = False,
        read_only: bool = False,
        save_log_depth: int = SAVE_LOG_DEPTH,
        fault_hook: Callable[[str], None] | None = None,
    ) -> None:
        """Configure a store; the file is opened by :meth:`open` or on first use.

        Args:
            path: the database file (created on first use unless *read_only*).
            busy_timeout: seconds to wait for another process's write lock.
            save_log_depth: saves kept per instance in its history (and for
                reconciling uncertain saves by ``write_id``); at least 2. The setting
                belongs to the database: the last store that opened it for writing
                sets it.
            allow_network_filesystem: open a file on NFS/SMB/... with a warning.
            read_only: open an existing database for reading only (operators'
                tools): a missing file is an error, nothing is created or migrated,
                and writes fail with :class:`~phronomy.StoreUnavailableError`.
            fault_hook: test hook called at each fault point (see
                :class:`~phronomy.storage.BaseStore`); it may raise or delay.
        """
        super().__init__(fault_hook=fault_hook)
        self._path = os.fspath(path)
        self._read_only = read_only
        self._identity: str | None = None
        depth: object = save_log_depth  # checked at run time: callers are not typed
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 2:
            raise InvalidInputError(
                f"save_log_depth must be an integer >= 2, got {save_log_depth!r}"
            )
        self._save_log_depth = save_log_depth
        self._busy_timeout = busy_timeout
        self._allow_network_fs = allow_network_filesystem
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._read_lock = threading.Lock()
        self._read_conn: sqlite3.Connection | None = None
        self._renew_lock = threading.Lock()
        self._renew_conn: sqlite3.Connection | None = None

    @property
    def path(self) -> str:
        """The database file."""
        return self._path

    @property
    def read_only(self) -> bool:
        """Whether the store was opened for reading only."""
        return self._read_only

    @property
    def identity(self) -> str:
        """``sqlite:`` and the file's real path (one database per file)."""
        if self._identity is None:
            self._identity = (
                super().identity
                if self._path == ":memory:"
                else f"sqlite:{os.path.realpath(self._path)}"
            )
        return self._identity

    def __repr__(self) -> str:
        return f"SQLiteStore({self._path!r})"

    # --- connection ----------------------------------------------------------------

    def open(self) -> None:
        """Open the database now and check that this store can use it (blocking).

        Raises:
            StoreUnavailableError: the file is not a phronomy database, cannot be
                opened, or cannot be written (unless *read_only*); for *read_only*,
                also when it does not exist.
            StoreUnavailableError: a newer schema, an old SQLite, or a network
                filesystem.
        """
        super().open()
        with self._lock, self._translated():
            self._connection()

    @contextlib.contextmanager
    def _translated(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise translate(exc, self._path) from exc

    def _read_errors(self) -> contextlib.AbstractContextManager[None]:
        return self._translated()

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = self._open()
        return self._conn

    @contextlib.contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        """The read connection (autocommit: each statement sees the latest commit)."""
        if self._path == ":memory:":  # another connection would be another database
            with self._lock, self._translated():
                yield self._connection()
            return
        with self._read_lock, self._translated():
            if self._read_conn is None:
                self._read_conn = self._open()
            yield self._read_conn

    def _open(self) -> sqlite3.Connection:
        if sqlite3.sqlite_version_info < (3, 37, 0):
            raise StoreUnavailableError(
                f"SQLiteStore needs SQLite >= 3.37 (STRICT tables, RETURNING); this Python "
                f"links SQLite {sqlite3.sqlite_version}",
                path=self._path,
            )
        if self._path != ":memory:":
            fstype = filesystem_type(
                os.path.dirname(os.path.abspath(self._path)) or "."
            )
            if fstype in NETWORK_FILESYSTEMS:
                message = (
                    f"{self._path!r} is on a {fstype} network filesystem, where SQLite's "
                    "locking and WAL do not work; use a local disk (or PostgreSQL)"
                )
                if not self._allow_network_fs:
                    raise StoreUnavailableError(message, path=self._path)
                logger.warning("%s (allowed by allow_network_filesystem=True)", message)
        if self._read_only and not os.path.exists(self._path):
            raise StoreUnavailableError(
                f"SQLite database {self._path!r} does not exist (a read-only store never "
                "creates one; check the path)",
                path=self._path,
            )
        conn = sqlite3.connect(
            f"file:{urllib.parse.quote(self._path)}?mode=ro"
            if self._read_only
            else self._path,
            uri=self._read_only,
            timeout=self._busy_timeout,
            isolation_level=None,  # autocommit: this store issues BEGIN IMMEDIATE itself
            check_same_thread=False,  # serialized by self._lock and the single-worker pool
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
            # Checked before anything changes the file (WAL mode rewrites its header).
            self._check_schema(conn.execute("PRAGMA user_version").fetchone()[0], conn)
            if self._read_only:
                return conn
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
            raise StoreUnavailableError(
                f"{self._path!r} refused WAL mode ({mode})", path=self._path
            )

    def _check_schema(self, version: int, conn: sqlite3.Connection) -> int:
        if version > SCHEMA_VERSION:
            raise StoreUnavailableError(
                f"{self._path!r} has schema version {version}; this release "
                f"understands up to {SCHEMA_VERSION} (upgrade phronomy to use it)",
                path=self._path,
            )
        if version == 0 and self._read_only:
            raise StoreUnavailableError(
                f"SQLite database {self._path!r} has no phronomy schema (no runtime "
                "ever wrote to it); check the path",
                path=self._path,
            )
        if 0 < version < SCHEMA_VERSION and self._read_only:
            raise StoreUnavailableError(
                f"SQLite database {self._path!r} has schema version {version} of an "
                f"earlier release; this release reads version {SCHEMA_VERSION}. Open it "
                "once for writing (any runtime on it, or `python -m phronomy migrate "
                "--db FILE`) to migrate it; a read-only store never changes the file",
                path=self._path,
            )
        if version == 0 and conn.execute(SQL_FOREIGN_TABLES).fetchone()[0]:
            raise StoreUnavailableError(
                f"SQLite database {self._path!r} belongs to another application (it "
                "has tables but no phronomy schema); phronomy does not add its tables "
                "to it: use a file of its own",
                path=self._path,
            )
        return version

    def _migrate(self, conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            # again under the write lock: another process may have migrated meanwhile
            version = self._check_schema(
                conn.execute("PRAGMA user_version").fetchone()[0], conn
            )
            for step in range(version, SCHEMA_VERSION):
                for statement in MIGRATIONS[step]:
                    conn.execute(statement)
            depth = self._save_log_depth
            conn.execute(SQL_SET_LOG_DEPTH, (depth, depth))
            # Always a real write: an empty transaction commits even on a file this
            # process cannot write, which would only fail at the first save.
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.rollback()
            raise

    def pragmas(self) -> dict[str, int | str]:
        """The settings the store's write connection runs with (blocking).

        Returns:
            ``journal_mode``, ``synchronous`` (2 is FULL), ``busy_timeout`` (ms) and
            ``user_version`` (the schema version).

        Raises:
            StoreUnavailableError: the database cannot be opened.
        """
        names = ("journal_mode", "synchronous", "busy_timeout", "user_version")
        with self._lock, self._translated():
            conn = self._connection()
            return {n: conn.execute(f"PRAGMA {n}").fetchone()[0] for n in names}

    def close(self) -> None:
        """Close the connections (the next call reopens them)."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
        with self._read_lock:
            if self._read_conn is not None:
                self._read_conn.close()
                self._read_conn = None
        with self._renew_lock:
            if self._renew_conn is not None:
                self._renew_conn.close()
                self._renew_conn = None

    def fence(self) -> None:
        """Roll back a transaction left open by a failed write, so it can never commit."""
        with self._lock, self._translated():
            conn = self._conn
            if conn is not None and conn.in_transaction:
                logger.info("rolling back the open transaction before reconciliation")
                conn.rollback()

    @contextlib.contextmanager
    def _writing(self, lane: Lane = "write") -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction on the lane's connection."""
        if lane == "renew" and self._path != ":memory:":
            with self._renew_lock, self._translated():
                if self._renew_conn is None:
                    self._renew_conn = self._open()
                with _immediate(self._renew_conn):
                    yield self._renew_conn
            return
        with self._lock, self._translated():
            conn = self._connection()
            with _immediate(conn):
                yield conn

    # --- operations ----------------------------------------------------------------

    def apply(self, conn: sqlite3.Connection, op: StoreOp) -> Any:
        """Run one operation (see :class:`~phronomy.storage.BaseStore`)."""
        return apply_op(conn, op, STATEMENTS, now_ms)


@contextlib.contextmanager
def _immediate(conn: sqlite3.Connection) -> Iterator[None]:
    """One ``BEGIN IMMEDIATE`` transaction: committed at the end, rolled back if the
    block raises."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.rollback()
        raise
