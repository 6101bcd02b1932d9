"""The CLI tests' targets: a database on each store, the command run in-process, and
lease settings fast enough to test a live instance another runtime holds."""

from __future__ import annotations

import contextlib
import re
import secrets
from typing import TYPE_CHECKING, Any

import pytest

import phronomy
from phronomy.cli import main

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator
    from pathlib import Path

ONE_ERROR_LINE = re.compile(r"phronomy: error: [^\n]+\n")


@pytest.fixture(params=["sqlite", "postgres"])
def target(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[str, Callable[[], Any]]]:
    """``--db`` of a new database, and a function that opens a runtime's store on it."""
    if request.param == "sqlite":
        db = str(tmp_path / "ops.db")
        yield db, lambda: phronomy.SQLiteStore(db)
        return
    import psycopg

    dsn: str = request.getfixturevalue("postgres_dsn")
    schema = f"test_ops_{secrets.token_hex(6)}"
    sep = "&" if "?" in dsn else "?"
    yield (
        f"{dsn}{sep}options=-csearch_path%3D{schema}",
        lambda: phronomy.PostgresStore(dsn, schema=schema),
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    status, out, err = run_cli(capsys, *argv)
    assert status == 1, (out, err)
    assert ONE_ERROR_LINE.fullmatch(err), err
    return err


FAST: dict[str, Any] = {
    "lease_ttl": 0.6,
    "heartbeat_interval": 0.1,
    "lease_margin": 0.2,
    "sweep_interval": 0.1,
}


@contextlib.asynccontextmanager
async def live_runtime(
    make: Callable[[], Any],
) -> AsyncIterator[tuple[phronomy.Runtime, Any]]:
    """A runtime with :data:`FAST` leases on a store *make* opens (closed after)."""
    store = make()
    try:
        async with phronomy.open_runtime(store=store, shutdown_timeout=2, **FAST) as rt:
            yield rt, store
    finally:
        store.close()
