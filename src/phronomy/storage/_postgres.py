"""The PostgreSQL store: the SQLite store's contract on a server that many machines share."""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from typing import TYPE_CHECKING, Any, final

from phronomy.errors import InvalidInputError, StoreUnavailableError

from ._base import BaseStore, Verdict, write_op
from ._clock import StepWatch, StoreClock
from ._postgres_errors import (
    Reconnect,
    Secrets,
    StillRunning,
    Timeouts,
    check_seconds,
    describe,
    driver as _driver,
)
from ._postgres_notify import PostgresListener
from ._postgres_open import (
    check_server,
    check_version,
    migrate,
    parse_dsn,
    read_snapshot,
    refused_write,
)
from ._postgres_pipeline import pipelined_writes
from ._postgres_schema import (
    STATEMENTS,
)
from ._postgres_xact import SQL_SERVER_STARTED, SQL_TERMINATE, SQL_XACT, SQL_XACT_STATUS
from ._sql_ops import apply_op
from ._sql_writes import claim_op
from ._store import SAVE_LOG_DEPTH

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    import outcome
    import psycopg

    from ._lanes import Lane
    from ._ops import ClaimOp, StoreOp
    from ._records import StoredRecord

__all__ = ["PostgresStore"]

logger = logging.getLogger(__name__)

_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def _no_clock() -> int:  # PostgreSQL statements read the database's clock
    return 0


@final
class PostgresStore(BaseStore["psycopg.Connection[Any]"]):
    """A :class:`~phronomy.storage.WorkflowStore` in a PostgreSQL database (13 or later).

    The same contract, tables and rules as :class:`~phronomy.SQLiteStore`:
    every save is one conditional statement, a trigger keeps the save log in the same
    transaction, a batch of saves commits as one transaction (group commit), stored
    timestamps come from the database's clock. Install the driver with the extra
    ``phronomy[postgres]`` (psycopg 3).

    * Three connections, each used by one thread at a time (the runtime runs the
      synchronous driver in its store worker threads): one for writes, one for reads,
      and one for lease renewals, so that a renewal never waits behind other writes
      (a runtime adds a fourth: :meth:`listen`). A broken one is replaced when next used.
    * The schema is created (``CREATE SCHEMA IF NOT EXISTS``) and migrated on open,
      under an advisory lock, so that runtimes starting together migrate it once.
    * Runtimes contending for rows never wait for each other: a claim of a row
      another transaction is writing is refused at once (the runtime reports
      :class:`~phronomy.BusyError`), renewals, cancel requests and the recovery sweep
      skip such rows, and the other writes of a batch lock rows in one order (by
      instance id), so no two transactions deadlock. Every other wait is bounded by
      the session timeouts below.
    * Unknown outcomes are resolved soundly: each write transaction learns its
      transaction id before it writes. When its commit outcome is unknown (the
      connection broke, the server restarted), the store waits until that
      transaction can no longer commit (``pg_xact_status``; a backend still running
      it is terminated): the server's verdict (committed or aborted) decides. When
      it cannot tell (it restarted since: the transaction either committed before
      the crash or died with it), the saves are classified by ``write_id`` from what
      is read back on a fresh connection; if that fails too, the save stays
      ``outcome_unknown`` (the instance requires recovery).
    * A server running with ``synchronous_commit = off`` is refused: a commit it
      acknowledges could still be lost.

    Errors become :class:`~phronomy.StoreUnavailableError` naming the server
    (``host:port/database``) and what happened: contention (a deadlock, a lock or
    statement timeout) is said to be one; only a lost connection asks to check that
    the server is up. No message, log line or ``repr`` contains the DSN's password,
    whatever its form.

    The session timeouts and the lease settings: a renewal is one statement that
    never waits for a row, on its own connection, so it answers within
    ``statement_timeout``. A runtime keeps its leases through one renewal that hangs
    as long as ``statement_timeout < lease_ttl - lease_margin - heartbeat_interval``
    (15 s with the default lease settings; the default 5 s is also their margin, so a
    hung renewal ends before the next heartbeat is due). ``lock_timeout`` (2 s) bounds
    the only waits left: a save or mark of a row of this runtime that another
    transaction is writing. ``idle_in_transaction_timeout`` (5 s) makes the server end
    a session that stalls inside a transaction (a frozen client), so that its row
    locks are released and its outcome settled soon.
    """

    max_concurrency = 1

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "public",
        connect_timeout: float = 10.0,
        fence_timeout: float = 30.0,
        lock_timeout: float = 2.0,
        statement_timeout: float = 5.0,
        idle_in_transaction_timeout: float = 5.0,
        save_log_depth: int = SAVE_LOG_DEPTH,
        read_only: bool = False,
        migrate: bool = True,
        fault_hook: Callable[[str], None] | None = None,
    ) -> None:
        """Configure a store; the server is reached by :meth:`open` or on first use.

        Args:
            dsn: a libpq connection string or URI
                (``postgresql://user@host:5432/dbname``); a password may also come
                from ``PGPASSWORD`` or ``~/.pgpass``.
            schema: the PostgreSQL schema that holds phronomy's tables (created if
                missing): lower-case letters, digits and ``_``. Runtimes share
                instances only within one schema.
            connect_timeout: seconds to wait for the server when connecting.
            fence_timeout: seconds to wait, after a write whose outcome is unknown,
                until its transaction can no longer commit (the server may be
                restarting); after that the save is reported ``outcome_unknown``.
            lock_timeout: the longest a statement waits for a row lock (see above).
            statement_timeout: the longest a statement runs (see above).
            idle_in_transaction_timeout: a session of this store that stalls inside
                a transaction this long is ended by the server (see above).
            save_log_depth: saves kept per instance in its history (and for
                reconciling uncertain saves by ``write_id``); at least 2. The setting
                belongs to the database schema: the last store that opened it sets it.
            read_only: sessions run with ``default_transaction_read_only = on`` and
                writes are refused (:class:`~phronomy.StoreUnavailableError`);
                implies ``migrate=False`` (operators' tools that only read).
            migrate: create or migrate the schema on opening; ``False`` writes
                nothing then and refuses a missing or earlier schema.
            fault_hook: test hook called at each fault point (see
                :class:`~phronomy.storage.BaseStore`); it may raise or delay.

        Raises:
            InvalidInputError: an invalid schema name, timeout or depth.
            StoreUnavailableError: psycopg is not installed, or *dsn* cannot be parsed.
        """
        super().__init__(fault_hook=fault_hook)
        given: object = schema
        if not isinstance(given, str) or not _SCHEMA_NAME.fullmatch(given):
            raise InvalidInputError(
                "schema must be a PostgreSQL name of lower-case letters, digits and "
                f"'_' (at most 63), got {schema!r}"
            )
        depth: object = save_log_depth
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 2:
            raise InvalidInputError(
                f"save_log_depth must be an integer >= 2, got {save_log_depth!r}"
            )
        check_seconds(
            connect_timeout=connect_timeout,
            fence_timeout=fence_timeout,
            lock_timeout=lock_timeout,
            statement_timeout=statement_timeout,
            idle_in_transaction_timeout=idle_in_transaction_timeout,
        )
        given_dsn: object = dsn
        if not isinstance(given_dsn, str):
            raise InvalidInputError(
                f"dsn must be a libpq connection string or URI, got a "
                f"{type(given_dsn).__name__}"
            )
        self._secrets = Secrets(dsn)
        self._dsn = dsn
        params = parse_dsn(dsn, self._secrets)
        self._secrets = Secrets(dsn, params)
        self._timeouts = Timeouts(
            lock=lock_timeout,
            statement=statement_timeout,
            idle_in_transaction=idle_in_transaction_timeout,
        )
        self._schema = schema
        self._connect_timeout = connect_timeout
        self._fence_timeout = fence_timeout
        self._save_log_depth = save_log_depth
        self._read_only = bool(read_only)
        self._migrates = bool(migrate) and not read_only
        self._address = (
            f"{params.get('host') or 'localhost'}:{params.get('port') or 5432}"
            f"/{params.get('dbname') or params.get('user') or ''}"
        )
        self._lock = threading.RLock()
        self._conn: psycopg.Connection[Any] | None = None
        self._read_lock = threading.Lock()
        self._read_conn: psycopg.Connection[Any] | None = None
        self._renew_lock = threading.Lock()
        self._renew_conn: psycopg.Connection[Any] | None = None
        self._migrated = False
        self._pending: tuple[str, int, str] | None = None
        """The transaction id, backend and server start time of a write whose outcome
        is not known yet."""
        self._clock = StoreClock(
            _no_clock,
            _no_clock,
            StepWatch(f"the clock of PostgreSQL at {self._address}"),
        )

    @property
    def timeouts(self) -> Timeouts:
        """The session timeouts every connection runs with (seconds)."""
        return self._timeouts

    @property
    def address(self) -> str:
        """``host:port/database`` (the DSN without its credentials)."""
        return self._address

    @property
    def schema(self) -> str:
        """The PostgreSQL schema that holds the tables."""
        return self._schema

    @property
    def identity(self) -> str:
        """``postgresql:``, the server, the database and the schema."""
        return f"postgresql:{self._address}/{self._schema}"

    def __repr__(self) -> str:
        return f"PostgresStore({self._address!r}, schema={self._schema!r})"

    # --- connections ---------------------------------------------------------------

    def open(self) -> None:
        """Connect now, create or migrate the schema, and check the server (blocking).

        Raises:
            StoreUnavailableError: the server cannot be reached or refuses the login,
                the schema is newer than this release, or ``synchronous_commit`` is
                off.
        """
        super().open()
        with self._lock, self._translated("_conn"):
            self._connection()

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

    @contextlib.contextmanager
    def _translated(self, connection: str | None = None) -> Iterator[None]:
        """Errors as :class:`~phronomy.StoreUnavailableError`; a broken *connection*
        (the attribute's name; its lock is held) is dropped, to be reopened."""
        try:
            yield
        except _driver().Error as exc:
            conn = None if connection is None else getattr(self, connection)
            dropped = False
            if conn is not None and (conn.broken or conn.closed):
                conn.close()
                setattr(self, connection, None)  # type: ignore[arg-type]
                dropped = True
            self._secrets.scrub(exc)
            raise (Reconnect if dropped else StoreUnavailableError)(
                self._secrets.redact(
                    f"PostgreSQL at {self._address} (schema {self._schema!r}): "
                    + describe(exc, self._timeouts)
                ),
                path=f"postgresql:{self._address}",
            ) from exc

    def _read_errors(self) -> contextlib.AbstractContextManager[None]:
        return self._translated("_read_conn")  # under the read lock

    def _connect(self) -> psycopg.Connection[Any]:
        conn: psycopg.Connection[Any] = _driver().connect(
            self._dsn,
            autocommit=True,  # transactions are explicit: BEGIN ... COMMIT
            connect_timeout=max(1, round(self._connect_timeout)),
            options=f"-c search_path={self._schema} {self._timeouts.options()}"
            + (" -c default_transaction_read_only=on" if self._read_only else ""),
            application_name="phronomy",
        )
        return conn

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None:
            conn = self._connect()
            try:
                check_server(conn, self._address)
                self._migrate(conn)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
            self._migrated = True
        return self._conn

    def _lane_connection(self, attribute: str) -> psycopg.Connection[Any]:
        """The read or renewal connection (its lock held), opened once the schema is."""
        conn: psycopg.Connection[Any] | None = getattr(self, attribute)
        if conn is None:
            if not self._migrated:
                with self._lock:
                    self._connection()
            conn = self._connect()
            setattr(self, attribute, conn)
        return conn

    def _migrate(self, conn: psycopg.Connection[Any]) -> None:
        if not self._migrates:  # check only: nothing is written
            check_version(conn, self._schema, self._address)
        else:
            migrate(conn, self._schema, self._address, self._save_log_depth)

    @contextlib.contextmanager
    def _reading(self) -> Iterator[psycopg.Connection[Any]]:
        """The read connection, in one read transaction: the block reads one snapshot
        (``REPEATABLE READ``), the latest commit when its first statement ran."""
        with self._read_lock, self._translated("_read_conn"):
            conn = self._lane_connection("_read_conn")
            with read_snapshot(conn):
                yield conn

    @contextlib.contextmanager
    def _writing(self, lane: Lane = "write") -> Iterator[psycopg.Connection[Any]]:
        """One transaction on the lane's connection; on the write connection, its id is
        known before it writes (a renewal, late, only extends this runtime's leases)."""
        if self._read_only:
            raise refused_write(self._schema, self._address)
        if lane == "renew":
            with self._renew_lock, self._translated("_renew_conn"):
                conn = self._lane_connection("_renew_conn")
                with conn.transaction():
                    yield conn
            return
        with self._lock, self._translated("_conn"):
            if self._pending is not None:
                self.fence()  # an earlier transaction must be settled first
            conn = self._connection()
            try:
                with conn.pipeline():  # one round trip, that writes nothing
                    conn.execute("BEGIN")
                    xact = conn.execute(SQL_XACT)
            except Exception:
                if not conn.broken:  # (a broken one is replaced, the batch sent again)
                    conn.execute("ROLLBACK")
                raise
            try:
                row = xact.fetchone()
                assert row is not None
                self._pending = (row[0], row[1], row[2])
                yield conn
                conn.execute("COMMIT")
                self._pending = None
            except BaseException:
                try:
                    conn.execute("ROLLBACK")
                    self._pending = None
                except Exception:  # noqa: BLE001 - fence() decides the outcome
                    conn.close()  # never reused: its state is unknown
                    self._conn = None
                raise

    def _reconnected(self, error: BaseException) -> bool:
        return isinstance(error, Reconnect)

    def _claim(
        self,
        conn: psycopg.Connection[Any],
        op: ClaimOp,
        known: StoredRecord | None = None,
    ) -> tuple[StoredRecord | None, int | None]:
        return claim_op(conn, op, STATEMENTS, self._clock)  # one statement, no waits

    def fence(self) -> Verdict:
        """Wait until the last failed write transaction can no longer commit (blocking).

        Its transaction id was learnt before it wrote. If the server restarted since,
        the transaction can no longer commit either: it committed before the crash or
        died with it (and its id may be given to another transaction now, so its
        status says nothing). While the server reports it ``in progress``, its
        backend is terminated (only if it still runs that transaction) and the status
        polled again. A server that cannot be reached (restarting) is tried again until
        ``fence_timeout``.

        Returns:
            ``"committed"`` or ``"aborted"`` (the server's verdict), or ``None`` when
            no transaction was pending, the server restarted, or it no longer knows
            (too old): what the transaction did is then read back.

        Raises:
            StoreUnavailableError: the server cannot tell within ``fence_timeout``.
        """
        with self._lock:
            if self._pending is None:
                return None
            deadline = time.monotonic() + self._fence_timeout
            while True:
                try:
                    verdict = self._settle(deadline)
                except StillRunning:
                    raise
                except StoreUnavailableError as exc:
                    if time.monotonic() >= deadline:
                        raise
                    logger.info("fencing a failed write, retrying: %r", exc)
                    time.sleep(0.1)
                    continue
                self._pending = None
                return verdict

    def _settle(self, deadline: float) -> Verdict:
        """One attempt of :meth:`fence`, on a connection of its own (the others may be
        broken or busy)."""
        assert self._pending is not None
        xid, pid, started = self._pending
        with self._translated(), self._connect() as conn:
            row = conn.execute(SQL_SERVER_STARTED).fetchone()
            if row is None or row[0] != started:
                # the server restarted: the transaction committed before the crash,
                # or died with it (its id may be another transaction's now)
                logger.info("failed write transaction %s: server restarted", xid)
                return None
            while True:
                row = conn.execute(SQL_XACT_STATUS, (xid,)).fetchone()
                status = None if row is None else row[0]
                if status != "in progress":
                    logger.info("failed write transaction %s ended: %s", xid, status)
                    return status if status in ("committed", "aborted") else None
                if time.monotonic() >= deadline:
                    raise StillRunning(
                        f"PostgreSQL at {self._address}: transaction {xid} of a "
                        f"failed write was still in progress after "
                        f"{self._fence_timeout} s",
                        path=f"postgresql:{self._address}",
                    )
                conn.execute(SQL_TERMINATE, {"pid": pid, "xid": xid})
                time.sleep(0.05)

    def listen(self) -> PostgresListener:
        """The inbox's notifications, on a connection of its own (opened at its first
        wait)."""
        return PostgresListener(self._connect, self._translated, self._schema)

    # --- operations ----------------------------------------------------------------

    def _writes(
        self,
        conn: psycopg.Connection[Any],
        ops: Sequence[StoreOp],
        results: list[outcome.Outcome[Any] | None],
    ) -> None:
        """Pipelined: see :mod:`~phronomy.storage._postgres_pipeline`."""
        hook = self.fault_hook

        def alone(op: StoreOp) -> outcome.Outcome[Any]:
            return write_op(self.apply, self._claim, hook, conn, op)

        pipelined_writes(conn, ops, results, self._clock, hook, alone)

    def apply(self, conn: psycopg.Connection[Any], op: StoreOp) -> Any:
        """Run one operation (see :class:`~phronomy.storage.BaseStore`)."""
        return apply_op(conn, op, STATEMENTS, self._clock)
