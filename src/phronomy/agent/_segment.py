"""The caller of an execution's segment: the driver's stand-in for a result handle."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol, final

from phronomy.errors import CancellationError

if TYPE_CHECKING:
    from phronomy.engine import ResultHandle
    from phronomy.workflow import WorkflowResult

    from ._plan import ExecutionState

__all__ = ["SegmentCaller"]

logger = logging.getLogger(__name__)


class Ending(Protocol):
    """What a segment's end goes to (the execution's driver)."""

    def segment_done(
        self,
        result: WorkflowResult[ExecutionState] | None,
        error: BaseException | None,
    ) -> None:
        """A segment ended with *result*, or failed with *error*."""
        ...


@final
class SegmentCaller:
    """The caller of one segment of an execution (an :class:`~phronomy.engine.Caller`).

    The segment's end goes straight to the driver: a result handle with its callback
    and the engine's tracking cost more than the rest of a trivial execution's start.
    The first settlement wins, as a handle's; an error the driver raises is logged,
    as a handle's callback's. Not tracked by the engine: at shutdown the execution
    table settles the driver itself.
    """

    __slots__ = ("_driver", "done")

    def __init__(self, driver: Ending) -> None:
        """A caller whose segment's end goes to *driver*."""
        self._driver = driver
        self.done = False

    def complete(self, value: WorkflowResult[ExecutionState]) -> bool:
        """The segment ended with *value*; whether this call settled it."""
        return self._end(value, None)

    def fail(self, error: BaseException) -> bool:
        """The segment failed with *error*; whether this call settled it."""
        return self._end(None, error)

    def cancel(self, error: BaseException | None = None) -> bool:
        """The segment was cancelled; whether this call settled it."""
        return self._end(None, error or CancellationError("the segment was cancelled"))

    def settle_like(self, done: ResultHandle[WorkflowResult[ExecutionState]]) -> None:
        """Settle as the settled handle *done* (a later segment's, started by event)."""
        if done.status == "completed":
            self._end(done.result_nowait(), None)
        else:
            self._end(None, done.error)

    def _end(
        self,
        result: WorkflowResult[ExecutionState] | None,
        error: BaseException | None,
    ) -> bool:
        if self.done:
            return False
        self.done = True
        try:
            self._driver.segment_done(result, error)
        except Exception:  # as a result handle's callback: logged, not the settler's
            logger.exception("execution driver failed at a segment's end")
        return True
