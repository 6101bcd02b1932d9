"""The one polling helper of the test suite."""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from collections.abc import Callable


async def until(predicate: Callable[[], object], limit: float = 5.0) -> None:
    """Wait until *predicate* holds, polling every 2 ms; fail after *limit* seconds.

    Only for conditions nothing can signal: state set by worker threads, or by the
    dispatcher in ways a test cannot await. Anything a test can await, it awaits.
    """
    with trio.fail_after(limit):
        while not predicate():  # noqa: ASYNC110 - state changed by other tasks and threads
            await trio.sleep(0.002)
