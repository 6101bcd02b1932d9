"""``open_engine``: an engine for the duration of an ``async with`` block."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import trio

from ._config import EngineConfig
from ._engine import Engine
from ._exits import raise_keeping_context, unwrap

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator

__all__ = ["open_engine"]


@asynccontextmanager
async def open_engine(
    *,
    pool_size: int = 10,
    queue_size: int = 100,
    shutdown_timeout: float = 5.0,
    cancel_grace: float | None = None,
    backlog_threshold: int = 1000,
    backlog_interval: float = 60.0,
    starvation_threshold: float | None = None,
    dispatch_threshold: float | None = None,
) -> AsyncGenerator[Engine]:
    """Run an engine for the duration of the ``async with`` block.

    On a normal exit the engine shuts down gracefully (:meth:`~Engine.shutdown`). If
    the body raises (or is cancelled), the engine stops at once: live work is cut off,
    its callers get :class:`~phronomy.RuntimeShutdownError`, queued offloaded
    operations are cancelled, the store writes owed for what was cut off are waited
    for (up to *cancel_grace*), and the body's exception propagates unchanged (never
    wrapped in an exception group).

    Args:
        pool_size: worker threads of the default offload pool.
        queue_size: queued operations of the default offload pool.
        shutdown_timeout: seconds a graceful shutdown waits for live work.
        cancel_grace: seconds shutdown waits for worker threads (and, when the body
            raises, for the store writes owed for what was cut off); default:
            *shutdown_timeout*.
        backlog_threshold: queue depth that triggers a backlog warning.
        backlog_interval: minimum seconds between backlog warnings.
        starvation_threshold: optional queue-lag warning threshold in seconds.
        dispatch_threshold: optional long-dispatch warning threshold in seconds.

    Yields:
        The running :class:`Engine`.

    Raises:
        InvalidInputError: invalid settings.
        PhronomyInternalError: an internal task failed (a bug; please report it).

    Cancellation:
        Cancelling the block stops the engine at once; the teardown is shielded and
        bounded.
    """
    config = EngineConfig(
        pool_size=pool_size,
        queue_size=queue_size,
        shutdown_timeout=shutdown_timeout,
        cancel_grace=cancel_grace,
        backlog_threshold=backlog_threshold,
        backlog_interval=backlog_interval,
        starvation_threshold=starvation_threshold,
        dispatch_threshold=dispatch_threshold,
    )
    body_error: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            engine = Engine(config, nursery)
            await nursery.start(engine._dispatcher.run)  # noqa: SLF001 - own factory
            try:
                yield engine
            except BaseException as exc:  # noqa: BLE001, ASYNC103 - re-raised after the nursery
                body_error = exc
                grace = shutdown_timeout if cancel_grace is None else cancel_grace
                with trio.CancelScope(shield=True):
                    await engine._shutdown.abort(grace)  # noqa: SLF001 - own factory
            else:
                await engine.shutdown()
            nursery.cancel_scope.cancel(reason="phronomy runtime closed")
    except BaseExceptionGroup as group:
        raise_keeping_context(unwrap(group, body_error))
    if body_error is not None:
        raise_keeping_context(body_error)
