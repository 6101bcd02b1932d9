from __future__ import annotations

import logging
import os
import secrets
from typing import TYPE_CHECKING, Any

import pytest
import trio.testing

import phronomy
from children import children, spec, store  # noqa: F401 - the cross-process tests' fixtures
from cli_targets import target  # noqa: F401 - the CLI tests' databases on each store
from phronomy.engine import Engine, open_engine

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Callable, Iterator


@pytest.fixture
async def engine() -> AsyncGenerator[Engine]:
    async with open_engine(shutdown_timeout=2.0) as eng:
        yield eng


@pytest.fixture
async def runtime() -> AsyncGenerator[phronomy.Runtime]:
    async with phronomy.open_runtime(shutdown_timeout=2.0) as rt:
        yield rt


@pytest.fixture
def thread_safe_autojump_clock() -> trio.testing.MockClock:
    # autojump_threshold=0 jumps while worker threads are still running; give them 0.5 s
    return trio.testing.MockClock(autojump_threshold=0.5)


@pytest.fixture(autouse=True)
def _phronomy_debug_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="phronomy")


@pytest.fixture
def open_sqlite() -> Iterator[Callable[..., phronomy.SQLiteStore]]:
    """Open SQLite stores that are closed when the test ends (3.13 warns on leaks)."""
    opened: list[phronomy.SQLiteStore] = []

    def open_store(
        path: str | os.PathLike[str], **options: Any
    ) -> phronomy.SQLiteStore:
        made = phronomy.SQLiteStore(path, **options)
        opened.append(made)
        return made

    yield open_store
    for each in opened:
        each.close()


@pytest.fixture(scope="session")
def postgres_dsn() -> str:
    """The DSN of the test PostgreSQL server (``scripts/postgres-test-server start``).

    Without one, PostgreSQL tests skip with the reason, or fail where the server is
    required (``PHRONOMY_REQUIRE_POSTGRES=1``, set by CI).
    """
    dsn = os.environ.get("PHRONOMY_TEST_POSTGRES_DSN")
    if dsn:
        return dsn
    reason = (
        'no PostgreSQL server: run `eval "$(scripts/postgres-test-server start)"` '
        "to test PostgresStore"
    )
    if os.environ.get("PHRONOMY_REQUIRE_POSTGRES"):
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture
def open_postgres(
    postgres_dsn: str,
) -> Iterator[Callable[..., phronomy.PostgresStore]]:
    """Open PostgreSQL stores, each test in a schema of its own (dropped at the end)."""
    import psycopg

    schema = f"test_{secrets.token_hex(6)}"
    opened: list[phronomy.PostgresStore] = []

    def open_store(**options: Any) -> phronomy.PostgresStore:
        options.setdefault("schema", schema)
        made = phronomy.PostgresStore(postgres_dsn, **options)
        opened.append(made)
        return made

    yield open_store
    for each in opened:
        each.close()
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
