"""Shutting the engine down: gracefully, at once, or after the dispatcher failed."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Literal, final

import trio

from phronomy.errors import RuntimeShutdownError

from ._messages import Continuation, ShutdownResult

if TYPE_CHECKING:
    from ._dispatcher import Dispatcher
    from ._lifecycle import Lifecycle
    from ._messages import DispatcherStatus
    from ._receivers import ReceiverTable
    from ._sessions import SessionTable
    from ._supervision import Supervisor

__all__ = ["Shutdown"]

logger = logging.getLogger(__name__)

_MIN_STOP_GRACE = 0.2


@final
class Shutdown:
    """The shutdown sequence of one engine, run once; later calls share its result.

    Graceful: stop admitting new work; wait until the drain deadline for live work;
    stop the dispatcher after what is queued; cut off what is still live (callers get
    :class:`~phronomy.RuntimeShutdownError`, or a more specific error from their
    receiver); let receivers finish the writes they owe; close pools, cancel queued
    operations, tasks and timers, and wait for worker threads until the grace deadline
    (threads are never killed). A step that fails is recorded, never raised.
    """

    def __init__(
        self,
        lifecycle: Lifecycle,
        dispatcher: Dispatcher,
        sessions: SessionTable,
        receivers: ReceiverTable,
        supervisor: Supervisor,
    ) -> None:
        """Bind the sequence to the engine's parts."""
        self._lifecycle = lifecycle
        self._dispatcher = dispatcher
        self._sessions = sessions
        self._receivers = receivers
        self._supervisor = supervisor
        self._idle: trio.Event | None = None
        self.started = False
        self.done = trio.Event()
        self.result: ShutdownResult | None = None

    # --- idleness ------------------------------------------------------------------

    def is_idle(self) -> bool:
        """No live work on the dispatcher (a failed engine counts as idle)."""
        return self._lifecycle.state == "failed" or (
            self._sessions.idle and self._receivers.idle
        )

    def after_batch(self) -> None:
        """Called by the dispatcher after each batch: wake a waiting shutdown."""
        if self._idle is not None and self.is_idle():
            self._idle.set()
            self._idle = None

    async def _wait_idle(self) -> None:
        while True:
            while not self.is_idle():
                if self._idle is None:
                    self._idle = trio.Event()
                await self._idle.wait()
            await self._supervisor.wait_pools_idle()
            if self.is_idle():
                return

    # --- the sequences -----------------------------------------------------------------

    async def run(self, drain: float, grace: float) -> ShutdownResult:
        """The graceful sequence; *drain* and *grace* are seconds.

        Cancellation:
            Callers shield it; its waits are bounded by *drain* and *grace*.
        """
        self.started = True
        try:
            self.result = await self._graceful(drain, grace)
        except Exception as exc:  # a bug in a shutdown step: still end with a result
            logger.exception("the graceful shutdown failed; stopping at once")
            self._lifecycle.errors.append(exc)
            await self.abort(0)  # its flush may have run already: bounded anew, briefly
        finally:
            self.done.set()
        assert self.result is not None
        return self.result

    async def _graceful(self, drain: float, grace: float) -> ShutdownResult:
        drain_deadline = trio.current_time() + drain
        if self._lifecycle.state == "running":
            self._lifecycle.set("draining")
        with trio.move_on_at(drain_deadline) as drained:
            await self._wait_idle()
        # quiescent when it was once, before the deadline: a store read housekeeping
        # starts right after (the inbox poll's next one) is no live work cut off
        quiescent = not drained.cancelled_caught
        status: DispatcherStatus
        if self._lifecycle.state == "failed":
            status = "failed"
        else:
            self._lifecycle.set("stopping")
            status = "terminated" if quiescent else "cancel_timeout"
        await self._dispatcher.stop(graceful=True)
        cut_off = self._teardown()
        stop_deadline = trio.current_time() + max(grace, _MIN_STOP_GRACE)
        with trio.move_on_at(stop_deadline):
            await self._receivers.flush()
        threads, tasks_left = await self._supervisor.stop(stop_deadline, wait=True)
        return self._finish(status, cut_off, threads, tasks_left)

    async def abort(self, grace: float) -> None:
        """The runtime block raised: stop at once and cut everything off. What the
        receivers flush is waited for, up to *grace* seconds (at least 0.2): for
        workflows, every store operation queued or running, the writes owed for what
        was cut off (lease releases) among them, so that nothing of the runtime uses
        the store once the block has exited. Worker threads are not waited for.

        Cancellation:
            Callers shield it; its one wait is bounded by *grace*.
        """
        if self.result is not None:
            return
        self.started = True
        if self._lifecycle.accepting:
            self._lifecycle.set("stopping")
        status: DispatcherStatus = (
            "failed"
            if self._lifecycle.failure is not None
            else (
                "terminated"
                if self.is_idle() and self._supervisor.pools_idle
                else "cancel_timeout"
            )
        )
        await self._dispatcher.stop(graceful=False)
        cut_off = self._teardown()
        with trio.move_on_after(max(grace, _MIN_STOP_GRACE)):
            await self._receivers.flush()
        threads, _ = await self._supervisor.stop(0.0, wait=False)
        self.result = self._finish(status, cut_off, threads, 0)
        self.done.set()

    def fail(self, error: Exception) -> None:
        """The dispatcher failed: everything pending fails with *error*."""
        logger.error("phronomy dispatcher failed", exc_info=error)
        lifecycle = self._lifecycle
        if lifecycle.failure is None:
            lifecycle.failure = error
        lifecycle.set("failed")
        lifecycle.exclusive = True
        try:
            self._sessions.fail(error)
            self._receivers.fail_pending(self._drained(), error)
            self._receivers.shutdown(error)
            self._receivers.settle_callers(lambda _: error)
        finally:
            lifecycle.exclusive = False
        if self._idle is not None:
            self._idle.set()

    # --- steps ---------------------------------------------------------------------

    def _teardown(self) -> tuple[str, ...]:
        """With the dispatcher stopped: cut off live work, shut receivers down."""
        self._lifecycle.exclusive = True
        try:
            cut = self._receivers.describe_live()
            cut.extend(self._sessions.cut_off())
            self._receivers.fail_pending(
                self._drained(),
                RuntimeShutdownError(
                    "the runtime shut down before the request was processed"
                ),
            )
            self._receivers.shutdown(None)
            self._receivers.settle_callers(
                lambda h: RuntimeShutdownError(
                    f"the runtime shut down before {h.name} finished"
                )
            )
        finally:
            self._lifecycle.exclusive = False
        return tuple(cut)

    def _drained(self) -> list[Any]:
        """What was still queued: continuations run now (their posts are refused
        since the engine stopped), the rest is returned."""
        rest: list[Any] = []
        for item in self._dispatcher.drain():
            if type(item) is Continuation:
                self._lifecycle.attempt("running a queued continuation", item.call)
            else:
                rest.append(item)
        return rest

    def _finish(
        self,
        status: DispatcherStatus,
        cut_off: tuple[str, ...],
        threads: int,
        tasks_left: int,
    ) -> ShutdownResult:
        lifecycle = self._lifecycle
        cleanup_complete = not lifecycle.errors and threads == 0 and tasks_left == 0
        error = lifecycle.failure or (lifecycle.errors[0] if lifecycle.errors else None)
        outcome: Literal["terminated", "failed"] = (
            "failed"
            if (lifecycle.failure is not None or lifecycle.errors)
            else "terminated"
        )
        lifecycle.set(outcome if cleanup_complete else "failed")
        if threads:
            logger.warning(
                "phronomy runtime closed with %d worker thread(s) still running; "
                "trio will wait for them before trio.run returns",
                threads,
            )
        return ShutdownResult(
            outcome=outcome,
            cleanup_complete=cleanup_complete,
            dispatcher_status=status,
            error=error,
            cut_off=cut_off,
            threads_running=threads,
        )
