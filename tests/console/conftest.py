"""Fixtures of the console's tests: a store filled by a real run (copied per test)."""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING

import pytest

from console.filling import fill_sqlite

if TYPE_CHECKING:
    from pathlib import Path


@pytest.fixture(scope="session")
def filled_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("console") / "filled.db"
    fill_sqlite(path)
    return path


@pytest.fixture
def filled_db(filled_template: Path, tmp_path: Path) -> Path:
    """A copy of the filled SQLite file, this test's own."""
    path = tmp_path / "filled.db"
    shutil.copy(filled_template, path)
    return path
