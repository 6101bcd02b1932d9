"""The console on a real PostgreSQL server: it opens its store as the command line
does (read-only sessions, never migrated), in the schema ``--schema`` or the DSN's
``search_path`` names, and works under a role that may only read."""

from __future__ import annotations

import re
import secrets
import socket
import urllib.parse
from typing import TYPE_CHECKING

import psycopg
import pytest

import phronomy
from console.asgi import Client
from console.filling import expenses, fill
from phronomy.cli import main
from phronomy.console import ConsoleApp, open_console_store

if TYPE_CHECKING:
    from collections.abc import Callable

ONE_ERROR_LINE = re.compile(r"phronomy: error: [^\n]+\n")


def _schemas(dsn: str, name: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname = %s", (name,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def _dsn(dsn: str, *, user: str | None = None, schema: str | None = None) -> str:
    parts = urllib.parse.urlsplit(dsn)
    netloc = f"{user or parts.username}@{parts.hostname}:{parts.port}"
    query = f"options=-csearch_path%3D{schema}" if schema else ""
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def test_a_database_without_the_schema_is_refused_and_left_unchanged(
    postgres_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = f"test_empty_{secrets.token_hex(4)}"
    for read_only in (True, False):  # the actions' store is never migrated either
        with pytest.raises(phronomy.StoreUnavailableError, match="no phronomy tables"):
            open_console_store(postgres_dsn, read_only=read_only, schema=empty)
        with pytest.raises(phronomy.StoreUnavailableError, match=empty):
            open_console_store(_dsn(postgres_dsn, schema=empty), read_only=read_only)
    assert main(["console", "--db", postgres_dsn, "--schema", empty]) == 1
    err = capsys.readouterr().err
    assert ONE_ERROR_LINE.fullmatch(err), err
    assert f"schema {empty!r}" in err
    assert _schemas(postgres_dsn, empty) == 0  # nothing was created


async def test_a_role_that_may_only_read_sees_the_pages(
    open_postgres: Callable[..., phronomy.PostgresStore], postgres_dsn: str
) -> None:
    store = open_postgres()
    await fill(store)
    schema = store.schema
    role = f"console_ro_{secrets.token_hex(4)}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        database = urllib.parse.urlsplit(postgres_dsn).path.lstrip("/")
        conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute(f"GRANT CONNECT ON DATABASE {database} TO {role}")
        conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
        conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {role}")
    try:
        for db, option in [
            (_dsn(postgres_dsn, user=role, schema=schema), None),  # the DSN's path
            (_dsn(postgres_dsn, user=role), schema),  # --schema
        ]:
            reader = open_console_store(db, read_only=True, schema=option)
            try:
                client = Client(ConsoleApp(reader, definitions=[expenses()]))
                listed = await client.get("/instances")
                assert listed.status == 200, listed.text
                assert "total 4" in listed.text
                one = await client.get("/instance", id="exp-1")
                assert 'data-state="awaiting_manager"' in one.text
                assert (await client.get("/executions")).status == 200
                assert "nightly" in (await client.get("/schedules")).text
            finally:
                reader.close()
    finally:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")


def test_the_console_command_opens_the_schema_it_is_given(
    open_postgres: Callable[..., phronomy.PostgresStore],
    postgres_dsn: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    store = open_postgres()
    store.open()  # the schema exists: the console gets as far as listening
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        argv = ["console", "--db", postgres_dsn, "--schema", store.schema]
        assert main([*argv, "--port", port]) == 1
    err = capsys.readouterr().err
    assert ONE_ERROR_LINE.fullmatch(err), err
    assert "cannot listen on '127.0.0.1' port" in err
