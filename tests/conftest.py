from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pytest
import trio.testing

import phronomy
from phronomy.engine import Engine, open_engine

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator


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
