"""Following an execution's instance while it waits for an answer or runs elsewhere.

An approval can be answered from any process and applied by any runtime that serves
the plan. The runtime that started the execution learns where its instance went from
the updates its own segments publish (at once) and, for a segment elsewhere, from a
read of the row now and then (every 0.5 s, doubled while nothing changes, up to 10 s).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol, final

from phronomy.storage import LoadOp

from ._records import saved_state

if TYPE_CHECKING:
    from collections.abc import Callable

    import outcome

    from phronomy.engine import Host, Timer
    from phronomy.storage import StoredRecord
    from phronomy.workflow import InstanceUpdate, WorkflowCoordinator

__all__ = ["FIRST_CHECK", "LAST_CHECK", "RowFollower"]

logger = logging.getLogger(__name__)

FIRST_CHECK, LAST_CHECK = 0.5, 10.0
"""Seconds between two reads of a waiting execution's row: the first wait, doubled
while nothing changes, up to the second."""


class _Runtime(Protocol):
    @property
    def engine(self) -> Host: ...

    coordinator: WorkflowCoordinator


def _decode(row: StoredRecord | None) -> tuple[StoredRecord | None, Any]:
    """The row and its saved state (in the store's worker thread)."""
    return row, None if row is None else saved_state(row)


@final
class RowFollower:
    """Tells *moved* ``(status, phase, state, detail)`` of the instance *key*: each
    update a segment here publishes, and what each read of its row finds.

    Without a store (*runtime* ``None``) only this runtime can move the instance,
    and the follower only marks the execution as waiting.
    """

    def __init__(
        self,
        runtime: _Runtime | None,
        key: str,
        moved: Callable[[str, str | None, Any, str | None], None],
    ) -> None:
        """Start following (register as a watcher, schedule the first read)."""
        self.workflow_instance_id = key
        self._runtime = runtime
        self._moved = moved
        self._every = FIRST_CHECK
        self._timer: Timer | None = None
        self._stopped = False
        if runtime is not None:
            runtime.coordinator.watchers.add(self)  # type: ignore[arg-type]
            self._schedule()

    def stop(self) -> None:
        """Stop following."""
        self._stopped = True
        if self._runtime is not None:
            self._runtime.coordinator.watchers.remove(self)  # type: ignore[arg-type]
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # --- as a watcher of the instance ----------------------------------------------

    def publish(self, update: InstanceUpdate[Any]) -> None:
        """A segment here published an update of the instance."""
        if not self._stopped and update.status != "running":
            self._moved(update.status, update.phase, update.state, None)

    def close(self) -> None:
        """Watchers close at shutdown: nothing to do (the runtime settles callers)."""

    # --- reading the row -------------------------------------------------------------

    def _schedule(self) -> None:
        assert self._runtime is not None
        self._timer = self._runtime.engine.timers.schedule(self._every, self._read)

    def _read(self) -> None:
        self._timer = None
        runtime = self._runtime
        gateway = None if runtime is None else runtime.coordinator.gateway
        if self._stopped or gateway is None:
            return
        gateway.submit(
            LoadOp(workflow_instance_id=self.workflow_instance_id),
            self._was_read,
            finish=_decode,
        )

    def _was_read(self, done: outcome.Outcome[Any]) -> None:
        if self._stopped:
            return
        try:
            row, state = done.unwrap()
        except Exception as exc:  # noqa: BLE001 - read again later
            logger.info("could not read %r: %r", self.workflow_instance_id, exc)
            self._every = min(self._every * 2, LAST_CHECK)
            self._schedule()
            return
        if row is None:
            self._moved("purged", None, None, "its record was deleted")
        elif row.status != "running":
            self._moved(row.status, row.phase, state, row.detail)
        if not self._stopped:
            self._every = min(self._every * 2, LAST_CHECK)
            self._schedule()
