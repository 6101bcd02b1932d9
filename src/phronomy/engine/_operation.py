"""One offloaded call and the thread body that decides whether it starts."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, final

import outcome

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._cancel import CancellationToken
    from ._handle import ResultHandle
    from ._timers import Timer

__all__ = ["SKIPPED", "Operation", "thread_body"]

SKIPPED: Any = object()
"""What a thread returns when the operation was settled before it started."""


@final
class Operation:
    """One submitted call. ``lock`` makes "started" vs "settled first" a single decision."""

    __slots__ = (
        "abandoned",
        "args",
        "fn",
        "handle",
        "lock",
        "queued",
        "started",
        "submitted_at",
        "timer",
        "token",
        "token_callback",
    )

    def __init__(
        self, fn: Callable[..., Any], args: tuple[Any, ...], handle: ResultHandle[Any]
    ) -> None:
        self.fn = fn
        self.args = args
        self.handle = handle
        self.lock = threading.Lock()
        self.started = False
        self.abandoned = False
        self.queued = False
        self.timer: Timer | None = None
        self.token: CancellationToken | None = None
        self.token_callback: Callable[[], None] | None = None
        self.submitted_at = 0.0


def thread_body(op: Operation) -> outcome.Outcome[Any]:
    """Run *op* in its worker thread, unless it was settled first."""
    # The linearisation point: either the operation starts here, or something settled
    # it before and the block never runs.
    with op.lock:
        if op.handle.done:
            return outcome.Value(SKIPPED)
        op.started = True
    result: outcome.Outcome[Any] = outcome.capture(op.fn, *op.args)
    return result
