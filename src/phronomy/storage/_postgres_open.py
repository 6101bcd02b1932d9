"""Opening the PostgreSQL store: its DSN parsed, and the checks of a store opened
without migrating, or read-only (operators' tools)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from phronomy.errors import StoreUnavailableError

from ._postgres_errors import Secrets, driver
from ._postgres_schema import (
    MIGRATIONS,
    SCHEMA_VERSION,
    SQL_CLEAR_VERSION,
    SQL_CREATE_VERSION_TABLE,
    SQL_LOCK_SCHEMA,
    SQL_SCHEMA_VERSION,
    SQL_SET_LOG_DEPTH,
    SQL_SET_VERSION,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

    import psycopg

__all__ = [
    "check_server",
    "check_version",
    "migrate",
    "parse_dsn",
    "read_snapshot",
    "refused_write",
]


def check_server(conn: psycopg.Connection[Any], address: str) -> None:
    """Raise unless the server confirms a commit only once it is durable.

    Raises:
        StoreUnavailableError: it runs with ``synchronous_commit = off``.
    """
    setting = conn.execute("SHOW synchronous_commit").fetchone()
    if setting is not None and setting[0] == "off":
        raise StoreUnavailableError(
            f"PostgreSQL at {address} runs with synchronous_commit = off: a "
            "commit it acknowledges can still be lost, so phronomy refuses it; set "
            "synchronous_commit = on (or local) for the database or the user",
            path=f"postgresql:{address}",
        )


@contextlib.contextmanager
def read_snapshot(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """One ``REPEATABLE READ READ ONLY`` transaction on *conn* (autocommit): every
    statement of the block reads the database as of its first one, whatever commits
    meanwhile. Rolled back at the end (it wrote nothing), unless the connection broke
    (its reads failed, and it is replaced)."""
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    try:
        yield
    finally:
        if not conn.closed and conn.info.transaction_status.name in (
            "INTRANS",
            "INERROR",
        ):
            conn.execute("ROLLBACK")


def check_version(conn: psycopg.Connection[Any], schema: str, address: str) -> None:
    """Raise unless *schema* holds this release's tables (nothing is written).

    Raises:
        StoreUnavailableError: no phronomy tables, or another schema version.
    """
    row = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL", (f'"{schema}".phronomy_schema',)
    ).fetchone()
    found = row is not None and bool(row[0])
    version = 0
    if found:
        row = conn.execute(SQL_SCHEMA_VERSION).fetchone()
        version = int(row[0]) if row and row[0] is not None else 0
    if version == SCHEMA_VERSION:
        return
    what = (
        f"has phronomy schema version {version}; this release uses {SCHEMA_VERSION}"
        if found
        else "has no phronomy tables"
    )
    raise StoreUnavailableError(
        f"PostgreSQL schema {schema!r} at {address} {what}; a store opened without "
        "migrating changes nothing (migrate it with `python -m phronomy migrate`, or "
        "open a runtime on it)",
        path=f"postgresql:{address}",
    )


def refused_write(schema: str, address: str) -> StoreUnavailableError:
    """The error of a write to a store opened read-only."""
    return StoreUnavailableError(
        f"PostgreSQL at {address} (schema {schema!r}) was opened read-only: nothing "
        "was written",
        path=f"postgresql:{address}",
    )


def parse_dsn(dsn: str, secrets: Secrets) -> dict[str, Any]:
    """The DSN's parameters; an error that quotes it is redacted first.

    Raises:
        StoreUnavailableError: psycopg is not installed, or *dsn* cannot be parsed.
    """
    found = driver()
    params: dict[str, Any] | None = None
    error = ""
    try:
        params = found.conninfo.conninfo_to_dict(dsn)
    except found.ProgrammingError as exc:
        error = secrets.redact(str(exc).strip())
    if params is None:  # raised outside the handler: no chained driver error
        raise StoreUnavailableError(
            f"cannot parse the PostgreSQL DSN: {error}", path="postgresql:?"
        )
    return params


_MIGRATION_LOCK_TIMEOUT = "60s"
"""How long a store that opens waits for another one migrating the schema."""


def migrate(
    conn: psycopg.Connection[Any], schema: str, address: str, depth: int
) -> None:
    """Create or migrate the schema (in one transaction, under an advisory lock: one
    migrator at a time, across machines) and set the save log's *depth*.

    Raises:
        StoreUnavailableError: the schema is newer than this release.
    """
    with conn.transaction():
        # a migration may wait for another one, and build indexes over many rows
        conn.execute(f"SET LOCAL lock_timeout = '{_MIGRATION_LOCK_TIMEOUT}'")
        conn.execute("SET LOCAL statement_timeout = 0")
        conn.execute(SQL_LOCK_SCHEMA)  # one migrator at a time, across machines
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        conn.execute(SQL_CREATE_VERSION_TABLE)
        row = conn.execute(SQL_SCHEMA_VERSION).fetchone()
        version = int(row[0]) if row and row[0] is not None else 0
        if version > SCHEMA_VERSION:
            raise StoreUnavailableError(
                f"PostgreSQL schema {schema!r} at {address} has phronomy "
                f"schema version {version}; this release understands up to "
                f"{SCHEMA_VERSION} (upgrade phronomy to use it)",
                path=f"postgresql:{address}",
            )
        for step in range(version, SCHEMA_VERSION):
            for statement in MIGRATIONS[step]:
                conn.execute(statement)
        if version != SCHEMA_VERSION:
            conn.execute(SQL_CLEAR_VERSION)
            conn.execute(SQL_SET_VERSION, (SCHEMA_VERSION,))
        conn.execute(SQL_SET_LOG_DEPTH, (depth, depth))
