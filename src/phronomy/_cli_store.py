"""How the command line (and other operators' tools) opens a store named by ``--db``.

``--db`` is an SQLite file's path, a PostgreSQL URI (``postgresql://`` or
``postgres://``) or a libpq ``key=value`` connection string that starts with a libpq
keyword (``host=db.internal dbname=app user=ops``). The PostgreSQL schema is
``public``, or the one the DSN's ``options`` set
(``?options=-csearch_path%3Dmyschema``, ``options='-csearch_path=myschema'``), or
*schema*. A password in *db* is never shown: :func:`shown` is the text to print
instead of *db*.
"""

from __future__ import annotations

import os
import re
import urllib.parse

from phronomy.errors import StoreUnavailableError
from phronomy.storage import PostgresStore, SQLiteStore
from phronomy.storage._postgres_errors import Secrets

__all__ = ["CliStore", "is_dsn", "lease_now", "open_store", "shown"]

CliStore = SQLiteStore | PostgresStore
"""A store the command line opens."""

_SCHEMES = ("postgresql://", "postgres://")
_SEARCH_PATH = re.compile(r"-c\s*search_path\s*=\s*([A-Za-z0-9_]+)")
_KEYWORDS = (
    "host|hostaddr|port|dbname|user|password|passfile|service|sslmode|options"
    "|application_name|connect_timeout|target_session_attrs"
)
_CONNINFO = re.compile(rf"\s*(?:{_KEYWORDS})\s*=")


def is_dsn(db: str) -> bool:
    """Whether *db* names a PostgreSQL database: a ``postgresql://`` URI, or a libpq
    ``key=value`` string that starts with a libpq keyword (``host=``, ``dbname=``,
    ``user=``, ``password=``, ``port=``, ...)."""
    return db.startswith(_SCHEMES) or _CONNINFO.match(db) is not None


def shown(db: str) -> str:
    """*db* as it may be printed: a password in it replaced by ``***``."""
    return Secrets(db).redact(db)


def _schema(dsn: str) -> str:
    """The schema the DSN's ``options`` set (``-csearch_path=NAME``), else public."""
    if dsn.startswith(_SCHEMES):
        options = urllib.parse.parse_qs(urllib.parse.urlsplit(dsn).query).get(
            "options", []
        )
    else:
        options = [str(_conninfo(dsn).get("options", ""))]
    for value in options:
        found = _SEARCH_PATH.search(value)
        if found:
            return found.group(1)
    return "public"


def _conninfo(dsn: str) -> dict[str, object]:
    """The parameters of a ``key=value`` *dsn* (none if it cannot be parsed: the
    store then says why, without the password)."""
    try:
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:  # the store says that psycopg is missing
        return {}
    try:
        return dict(conninfo_to_dict(dsn))
    except Exception:  # noqa: BLE001 - the store reports it, redacted
        return {}


def open_store(
    db: str,
    *,
    read_only: bool,
    migrate: bool = False,
    schema: str | None = None,
    busy_timeout: float = 30.0,
) -> CliStore:
    """The store *db* names, open (blocking).

    Args:
        db: an SQLite file's path (it must exist: a mistyped path is an error, not a
            new database), a ``postgresql://`` URI or a libpq ``key=value`` string.
        read_only: open it for reading only (SQLite: a read-only connection;
            PostgreSQL: read-only sessions, writes refused).
        migrate: create or migrate the schema (``migrate`` only); otherwise a
            database of an earlier release is refused and left unchanged.
        schema: the PostgreSQL schema (default: the DSN's ``search_path``, else
            ``public``).
        busy_timeout: SQLite: seconds a statement waits for a lock another
            connection holds.

    Returns:
        The open store (close it when done).

    Raises:
        StoreUnavailableError: the database cannot be opened (the message shows
            *db* without its password).
        InvalidInputError: an invalid schema name.
    """
    store: CliStore
    if is_dsn(db):
        store = PostgresStore(
            db,
            schema=schema or _schema(db),
            read_only=read_only,
            migrate=migrate,
            connect_timeout=5.0,
        )
        try:
            store.open()
        except BaseException:
            store.close()
            raise
        return store
    _check_file(db, must_exist=not read_only)
    store = SQLiteStore(db, read_only=read_only, busy_timeout=busy_timeout)
    try:
        store.open(migrate=migrate)
    except BaseException:
        store.close()
        raise
    return store


def _check_file(path: str, *, must_exist: bool) -> None:
    if must_exist and not os.path.exists(path):
        raise StoreUnavailableError(
            f"SQLite database {path!r} does not exist (check the path)", path=path
        )


def lease_now(store: CliStore) -> int | None:
    """Now on the clock of *store*'s lease expiries (``None``: SQLite leases of another
    boot, all expired). PostgreSQL keeps them on the database's wall clock, read here
    as this machine's (a skew between the two moves the expiries shown)."""
    if isinstance(store, SQLiteStore):
        return store.lease_now_ms()
    return store.wall_now_ms()
