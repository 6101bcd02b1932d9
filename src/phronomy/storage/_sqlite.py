"""The embedded default store: one SQLite file, safe for several processes on one host."""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import shlex
import sqlite3
import stat
import threading
import time
import urllib.parse
from typing import TYPE_CHECKING, Any, final

from phronomy.errors import InvalidInputError, StoreUnavailableError

from . import _clock
from ._base import BaseStore
from ._clock import StepWatch, StoreClock
from ._lanes import Lane, immediate, snapshot
from ._sql_ops import apply_op
from ._sqlite_errors import translate
from ._sqlite_schema import (
    MIGRATIONS,
    NETWORK_FILESYSTEMS,
    SCHEMA_VERSION,
    SQL_EXPIRE_ALL_LEASES,
    SQL_FOREIGN_TABLES,
    SQL_LEASE_CLOCK,
    SQL_SET_LEASE_CLOCK,
    SQL_SET_LOG_DEPTH,
    STATEMENTS,
    filesystem_type,
)
from ._store import SAVE_LOG_DEPTH

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from ._ops import StoreOp

__all__ = ["SCHEMA_VERSION", "SQLiteStore"]

logger = logging.getLogger(__name__)

_NON_REGULAR = (
    (stat.S_ISDIR, "directory"),
    (stat.S_ISFIFO, "FIFO (named pipe)"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
    (stat.S_ISSOCK, "socket"),
)


@final
class SQLiteStore(BaseStore[sqlite3.Connection]):
    """A :class:`~phronomy.storage.WorkflowStore` in one SQLite file (the embedded default).

    * WAL journal, ``synchronous=FULL`` (a saved terminal state survives power loss;
      a batch that writes only leases commits with ``NORMAL``: see the design's "One
      fsync per run"), ``BEGIN IMMEDIATE`` for every write, a busy timeout for other
      processes.
    * One connection for writes and one for reads (WAL lets a read run while a write
      transaction commits), each never used by two threads at once (a lock each; the
      runtime runs writes in a single-worker pool and reads in another). Lease
      renewals run in a pool of their own, on the write connection under its lock: a
      renewal waits at most for the transaction under way, never behind the queue of
      other writes (nor sleeps in SQLite's busy handler behind a connection of this
      process).
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
        clock: Callable[[], int] | None = None,
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
            clock: the wall clock in ms (timestamps, timers' due times) for tests.
        """
        super().__init__(fault_hook=fault_hook, clock=clock)
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
        watch = StepWatch("the SQLite store's lease clock")
        self._clock = StoreClock(self.wall_now_ms, _clock.lease_ms, watch)

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

    def open(self, *, migrate: bool = True) -> None:
        """Open the database now and check that this store can use it (blocking).

        Args:
            migrate: bring a database of an earlier release (or a new, empty file) to
                this release's schema, and set its ``save_log_depth``. ``False``
                writes nothing on opening: such a file is refused and left unchanged,
                the database's setting is kept (operators' commands that change only
                rows). It applies to this opening: after :meth:`close`, the next use
                opens and migrates.

        Raises:
            StoreUnavailableError: the file is not a phronomy database, is not a
                regular file, cannot be opened, or cannot be written (unless
                *read_only*); for *read_only*, also when it does not exist.
            StoreUnavailableError: a newer schema (an earlier one without *migrate*),
                an old SQLite, or a network filesystem.
        """
        super().open()
        with self._lock, self._translated():
            if self._conn is None:
                self._conn = self._open(migrate=migrate)

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
        """The read connection, in one read transaction: the block reads one snapshot
        (WAL mode), the latest commit when it began."""
        if self._path == ":memory:":  # another connection would be another database
            with self._lock, self._translated():  # no write runs meanwhile
                yield self._connection()
            return
        if self._read_conn is None and not self._read_only:
            # The write connection switches the file to WAL and migrates it; the read
            # connection opens after it and changes nothing.
            with self._lock, self._translated():
                self._connection()
        with self._read_lock, self._translated():
            if self._read_conn is None:
                self._read_conn = self._open(reader=True)
            with snapshot(self._read_conn):
                yield self._read_conn

    def _open(
        self, *, reader: bool = False, migrate: bool = True
    ) -> sqlite3.Connection:
        if sqlite3.sqlite_version_info < (3, 37, 0):
            raise StoreUnavailableError(
                f"SQLiteStore needs SQLite >= 3.37 (STRICT tables, RETURNING); this Python "
                f"links SQLite {sqlite3.sqlite_version}",
                path=self._path,
            )
        if self._path != ":memory:":
            self._check_filesystem()
            self._check_regular_file()
        if self._read_only and not os.path.exists(self._path):
            raise StoreUnavailableError(
                f"SQLite database {self._path!r} does not exist (a read-only store never "
                "creates one; check the path)",
                path=self._path,
            )
        conn = sqlite3.connect(  # sets the busy handler before any statement
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
            self._check_schema(
                conn.execute("PRAGMA user_version").fetchone()[0],
                conn,
                migrates=migrate and not reader and not self._read_only,
            )
            if self._read_only or reader:
                return conn
            self._use_wal(conn)
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute("PRAGMA foreign_keys = ON")
            if migrate:  # else the schema is this release's: nothing to write
                self._migrate(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _check_filesystem(self) -> None:
        fstype = filesystem_type(os.path.dirname(os.path.abspath(self._path)) or ".")
        if fstype in NETWORK_FILESYSTEMS:
            message = (
                f"{self._path!r} is on a {fstype} network filesystem, where SQLite's "
                "locking and WAL do not work; use a local disk (or PostgreSQL)"
            )
            if not self._allow_network_fs:
                raise StoreUnavailableError(message, path=self._path)
            logger.warning("%s (allowed by allow_network_filesystem=True)", message)

    def _check_regular_file(self) -> None:
        """Refuse a path that names a FIFO, directory, device or socket.

        Checked before SQLite opens it: opening a FIFO blocks until a writer appears,
        and a device would get ``-journal``/``-wal`` files beside it.
        """
        try:
            mode = os.stat(self._path).st_mode
        except OSError:  # missing (created by SQLite) or unreadable (SQLite says why)
            return
        if stat.S_ISREG(mode):
            return
        kind = next((name for test, name in _NON_REGULAR if test(mode)), "special file")
        raise StoreUnavailableError(
            f"{self._path!r} is a {kind}, not a regular file: an SQLite database is a "
            "regular file (check the path)",
            path=self._path,
        )

    def _use_wal(self, conn: sqlite3.Connection) -> None:
        """Switch the file to WAL mode unless it is in WAL mode already.

        The switch needs an exclusive lock. When another connection holds a lock the
        switch cannot wait for (for example a writer's reserved lock while this
        connection reads the header), SQLite returns ``SQLITE_BUSY`` at once instead of
        calling the busy handler; the switch is retried with a growing pause until
        ``busy_timeout`` has passed.
        """
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        if mode == "wal" or self._path == ":memory:":
            return
        deadline = time.monotonic() + self._busy_timeout
        pause = 0.001
        for attempt in itertools.count(1):
            try:
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                break
            except sqlite3.OperationalError as exc:
                left = deadline - time.monotonic()
                if (
                    not (exc.sqlite_errorname or "").startswith("SQLITE_BUSY")
                    or left <= 0
                ):
                    raise
                logger.debug(
                    "wal.retry: %r was locked while switching to WAL mode (attempt "
                    "%d); retrying",
                    self._path,
                    attempt,
                )
                time.sleep(min(pause, left))
                pause = min(pause * 2, 0.1)
        if mode != "wal":
            raise StoreUnavailableError(
                f"{self._path!r} refused WAL mode ({mode})", path=self._path
            )

    def _check_schema(
        self, version: int, conn: sqlite3.Connection, *, migrates: bool
    ) -> int:
        path = self._path
        if version > SCHEMA_VERSION:
            raise StoreUnavailableError(
                f"{path!r} has schema version {version}; this release "
                f"understands up to {SCHEMA_VERSION} (upgrade phronomy to use it)",
                path=path,
            )
        if version == 0 and not migrates:
            raise StoreUnavailableError(
                f"SQLite database {path!r} has no phronomy schema (no runtime "
                "ever wrote to it); check the path",
                path=path,
            )
        if version < SCHEMA_VERSION and not migrates:
            how = (
                "a read-only store never changes the file"
                if self._read_only
                else "this store was opened without migrating, and left the file "
                "unchanged"
            )
            raise StoreUnavailableError(
                f"SQLite database {path!r} has schema version {version} of an "
                f"earlier release; this release uses version {SCHEMA_VERSION}. Migrate "
                f"it first with `python -m phronomy migrate --db {shlex.quote(path)}` "
                f"(or open a runtime on it); {how}",
                path=path,
            )
        if version == 0 and conn.execute(SQL_FOREIGN_TABLES).fetchone()[0]:
            raise StoreUnavailableError(
                f"SQLite database {path!r} belongs to another application (it "
                "has tables but no phronomy schema); phronomy does not add its tables "
                "to it: use a file of its own",
                path=path,
            )
        return version

    def _migrate(self, conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            # again under the write lock: another process may have migrated meanwhile
            version = self._check_schema(
                conn.execute("PRAGMA user_version").fetchone()[0], conn, migrates=True
            )
            for step in range(version, SCHEMA_VERSION):
                for statement in MIGRATIONS[step]:
                    conn.execute(statement)
            depth = self._save_log_depth
            conn.execute(SQL_SET_LOG_DEPTH, (depth, depth))
            self._adopt_lease_clock(conn)
            # Always a real write: an empty transaction commits even on a file this
            # process cannot write, which would only fail at the first save.
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.rollback()
            raise

    def _adopt_lease_clock(self, conn: sqlite3.Connection) -> None:
        """Make this machine's lease clock the database's (in the open's write
        transaction): lease times of another boot, or of another clock (an earlier
        release's wall clock), mean nothing on it, and the runtimes that wrote them
        have stopped, so every lease expires now (the next sweep recovers them)."""
        stored = conn.execute(SQL_LEASE_CLOCK).fetchone()[0]
        if stored == _clock.LEASE_CLOCK_ID:
            return
        expired = conn.execute(
            SQL_EXPIRE_ALL_LEASES, {"lease_now": self._clock.lease_ms()}
        ).rowcount
        conn.execute(SQL_SET_LEASE_CLOCK, (_clock.LEASE_CLOCK_ID,))
        if expired:
            logger.info(
                "%s: %d leases were written on another boot or clock; they count as "
                "expired",
                self._path,
                expired,
            )

    def lease_now_ms(self) -> int | None:
        """Now on the clock of the stored lease expiries, in milliseconds (blocking).

        Returns:
            ``None`` when they are of another boot or clock: then every stored lease
            has expired (the next store that opens the file for writing marks them so).

        Raises:
            StoreUnavailableError: the database cannot be read.
        """
        with self._reading() as conn:
            stored = conn.execute(SQL_LEASE_CLOCK).fetchone()[0]
        return self._clock.lease_ms() if stored == _clock.LEASE_CLOCK_ID else None

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

    def fence(self) -> None:
        """Roll back a transaction left open by a failed write, so it can never commit."""
        with self._lock, self._translated():
            conn = self._conn
            if conn is not None and conn.in_transaction:
                logger.info("rolling back the open transaction before reconciliation")
                conn.rollback()

    @contextlib.contextmanager
    def _writing(self, lane: Lane = "write") -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction on the lane's connection: committed with
        ``synchronous=FULL`` (the WAL synced to disk before the commit returns), but
        for a batch that writes only leases (``lease``, ``renew``): ``NORMAL``. Its
        commit can be lost only with every process that could have seen it, and the
        next synced commit makes it durable too (design.rst, "One fsync per run").
        Every lane writes on the one write connection, under its lock: SQLite has one
        writer, and two connections of this process waiting for each other's lock in
        SQLite's busy handler (which sleeps, 1 ms, then longer) kept a start or a save
        waiting up to 190 ms behind a pass of lease renewals at 100k leases."""
        with self._lock, self._translated():
            conn = self._connection()
            with immediate(conn, lane):
                yield conn

    # --- operations ----------------------------------------------------------------

    def apply(self, conn: sqlite3.Connection, op: StoreOp) -> Any:
        """Run one operation (see :class:`~phronomy.storage.BaseStore`)."""
        return apply_op(conn, op, STATEMENTS, self._clock)
