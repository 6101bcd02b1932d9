"""The inbox poll's loop with a store that notifies, on trio's MockClock: notified
polls, the fallback interval, and a listener that cannot connect."""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, Any

import trio
import trio.testing

from phronomy.workflow import _poller

if TYPE_CHECKING:
    import pytest


class _Coordinator:
    def __init__(self) -> None:
        self.sessions: dict[str, Any] = {}
        self.waiters = self

    def awaited(self) -> list[tuple[str, str]]:
        return []


class _FailingListener:
    """A listener whose server cannot be reached."""

    def __init__(self) -> None:
        self.opens: list[float] = []

    def open(self) -> None:
        self.opens.append(trio.current_time())
        raise OSError("connection refused")

    def fileno(self) -> int:  # pragma: no cover - never open
        raise AssertionError("not open")

    def drain(self) -> frozenset[str]:  # pragma: no cover - never open
        raise AssertionError("not open")

    def close(self) -> None:
        pass


async def test_a_listener_that_cannot_connect_is_retried_with_backoff_while_polling(
    monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    # Before: a listener that could not connect was opened again at every poll
    # (ten connection attempts a second against a server that refuses them).
    polls: list[float] = []

    async def poll_once(coordinator: Any) -> float:
        polls.append(trio.current_time())
        return math.inf  # no timer armed

    async def run_sync(fn: Any, *args: Any, **kwargs: Any) -> Any:
        return fn(*args)  # on the trio thread: the fake reads the mock clock

    monkeypatch.setattr(_poller, "poll_once", poll_once)
    monkeypatch.setattr(trio.to_thread, "run_sync", run_sync)
    listener = _FailingListener()
    start = trio.current_time()
    with trio.move_on_after(10):
        await _poller._poll_when_told(_Coordinator(), listener, 0.1)  # type: ignore[arg-type]
    opened = [round(t - start, 1) for t in listener.opens]
    assert opened == [0.0, 1.0, 3.0, 7.0]  # 1, 2, 4 s apart (up to 30 s)
    assert 95 <= len(polls) <= 101  # the poll goes on every 0.1 s meanwhile
    gaps = [b - a for a, b in itertools.pairwise(polls)]
    assert max(gaps) < 0.11
