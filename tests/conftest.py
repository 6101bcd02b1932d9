from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import pytest
import trio.testing

import phronomy
from phronomy.engine import Engine, open_engine

if TYPE_CHECKING:
    import os
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
        store = phronomy.SQLiteStore(path, **options)
        opened.append(store)
        return store

    yield open_store
    for store in opened:
        store.close()
