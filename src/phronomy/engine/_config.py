"""The settings of an engine."""

from __future__ import annotations

from typing import final

import msgspec

from phronomy.errors import InvalidInputError

__all__ = ["EngineConfig"]


@final
class EngineConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Settings of an engine.

    Attributes:
        pool_size: worker threads of the default offload pool.
        queue_size: queued operations the default pool admits.
        shutdown_timeout: seconds a graceful shutdown waits for live work to finish.
        cancel_grace: seconds shutdown then waits for worker threads, and, when the
            block raises, for the store writes owed for what was cut off (default:
            ``shutdown_timeout``; at least 0.2).
        backlog_threshold: queue depth that triggers a backlog warning.
        backlog_interval: minimum seconds between two backlog warnings.
        starvation_threshold: warn when an event waited longer than this in the queue.
        dispatch_threshold: warn when one dispatch took longer than this.
    """

    pool_size: int = 10
    queue_size: int = 100
    shutdown_timeout: float = 5.0
    cancel_grace: float | None = None
    backlog_threshold: int = 1000
    backlog_interval: float = 60.0
    starvation_threshold: float | None = None
    dispatch_threshold: float | None = None

    def __post_init__(self) -> None:
        """Validate the numbers."""
        if self.shutdown_timeout < 0 or (
            self.cancel_grace is not None and self.cancel_grace < 0
        ):
            raise InvalidInputError("shutdown_timeout and cancel_grace must be >= 0")
        if self.pool_size < 1 or self.queue_size < 0:
            raise InvalidInputError("pool_size must be >= 1 and queue_size >= 0")
        if self.backlog_threshold < 1 or self.backlog_interval < 0:
            raise InvalidInputError(
                "backlog_threshold must be >= 1, backlog_interval >= 0"
            )
