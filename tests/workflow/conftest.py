"""Fixtures of the workflow tests."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

import phronomy

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def make_store(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    open_sqlite: Callable[..., phronomy.SQLiteStore],
) -> Callable[[], phronomy.storage.BaseStore[Any]]:
    if request.param == "memory":
        shared = phronomy.MemoryStore()
        return lambda: shared
    if request.param == "postgres":  # every call: another store on one schema
        return request.getfixturevalue("open_postgres")  # type: ignore[no-any-return]
    return lambda: open_sqlite(tmp_path / "durable.db")
