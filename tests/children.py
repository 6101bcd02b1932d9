"""Child processes of the cross-process tests (``inbox_child.py``, ``timer_child.py``)
and the stores they share: each test module names its script."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from inbox_child import open_store

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["Child", "children", "spec", "store"]


class Child:
    """A child process running *script* (a file next to this one), once it said
    ``ready`` (or at once with ``wait=False``: then :meth:`is_ready` says when)."""

    def __init__(
        self,
        script: str,
        spec: str,
        role: str,
        *args: object,
        poll: float = 0.1,
        wait: bool = True,
    ) -> None:
        env = {**os.environ, "PHRONOMY_CHILD_POLL": str(poll)}
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name(script)), role, spec]
            + [str(a) for a in args],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.process.stdout is not None
        self.stdout = self.process.stdout
        self.ready = False
        if wait:
            self._read_ready()

    def _read_ready(self) -> None:
        assert self.stdout.readline().strip() == "ready"
        self.ready = True

    def is_ready(self) -> bool:
        """Whether it said ``ready`` (without waiting for it)."""
        if not self.ready and select.select([self.stdout], [], [], 0)[0]:
            self._read_ready()
        return self.ready

    def lines(self) -> list[str]:
        """What it printed after ``ready`` until it ended (waits for the end)."""
        with self.stdout:
            out = self.stdout.read().splitlines()
        assert self.process.wait(timeout=60) == 0
        return out

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)
        self.stdout.close()


@pytest.fixture
def children() -> Iterator[list[Child]]:
    """Children to kill at the end, whatever happened."""
    started: list[Child] = []
    yield started
    for child in started:
        if child.process.poll() is None:
            child.process.send_signal(signal.SIGKILL)
        child.process.wait(timeout=30)
        child.stdout.close()


@pytest.fixture(params=["sqlite", "postgres"])
def spec(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store for the children (``inbox_child.open_store``'s spec)."""
    if request.param == "sqlite":
        return f"sqlite:{tmp_path / 'children.db'}"
    opener = request.getfixturevalue("open_postgres")
    schema = opener().schema  # dropped at the end
    return f"postgres:{schema}:{request.getfixturevalue('postgres_dsn')}"


@pytest.fixture
def store(spec: str) -> Iterator[Any]:
    """The children's store, opened here to check what they did."""
    opened = open_store(spec)
    yield opened
    opened.close()
