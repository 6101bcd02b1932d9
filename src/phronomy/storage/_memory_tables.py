"""MemoryStore's tables: the rows, the save log, the inbox and the timers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._memory_inbox import MemoryInbox
from ._memory_timers import MemoryTimers

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._records import SaveLogEntry, StoredRecord, Takeover
    from ._schedules import ScheduleRecord

    History = tuple[dict[int, bytes | None], tuple[Takeover, ...]]
    """The states of an instance's logged revisions, by revision; its takeovers,
    newest first."""

__all__ = ["Tables"]


class Tables(MemoryInbox, MemoryTimers):
    """The rows, the save log, the inbox, the timers and the schedules; writes note
    what they replace, to undo a batch."""

    def __init__(self, wall: Callable[[], int]) -> None:
        MemoryInbox.__init__(self)
        MemoryTimers.__init__(self)
        self.wall = wall
        """The store's wall clock (milliseconds)."""
        self.rows: dict[str, StoredRecord] = {}
        self.log: dict[str, dict[str, SaveLogEntry]] = {}  # id -> write id -> save
        self.schedules: dict[str, ScheduleRecord] = {}
        self.history: dict[str, History] = {}
        """Per instance: the states its logged revisions saved, its takeovers."""
        self.undo: list[tuple[str, str, Any]] | None = None  # (table, key, kept)

    def put(
        self,
        iid: str,
        row: StoredRecord | None,
        log: dict[str, SaveLogEntry] | None,
    ) -> None:
        """Replace (or with ``None``, remove: its inbox goes too) the row and save log
        of *iid*."""
        self.note(iid)
        _set(self.rows, iid, row)
        _set(self.log, iid, log)
        if row is None:
            self.forget(iid)
            self.timers.pop(iid, None)
            self.history.pop(iid, None)

    def keep_state(
        self, iid: str, revision: int, snapshot: bytes | None, depth: int
    ) -> None:
        """The save of *revision* (of *snapshot*) is logged: its state is kept, with
        those of the saves the log keeps (*depth*). Call it after :meth:`put`."""
        states, takeovers = self.history.get(iid, ({}, ()))
        kept = {r: s for r, s in states.items() if r > revision - depth}
        self.history[iid] = ({**kept, revision: snapshot}, takeovers)

    def log_takeover(self, iid: str, takeover: Takeover, depth: int) -> None:
        """The sweep took *iid* over (the last *depth* takeovers are kept). Call it
        after :meth:`put`."""
        states, takeovers = self.history.get(iid, ({}, ()))
        self.history[iid] = (states, (takeover, *takeovers)[:depth])

    def note(self, iid: str) -> None:
        """Remember the state of *iid*, to undo this batch's writes of it."""
        if self.undo is not None:
            kept = (
                self.rows.get(iid),
                self.log.get(iid),
                self.timers.get(iid),
                self.history.get(iid),
                *self.inbox_state(iid),
            )
            self.undo.append(("instance", iid, kept))

    def pending_counts(self, workflows: tuple[str, ...]) -> tuple[int, int]:
        """See :class:`~phronomy.storage.PendingOp`."""
        wanted = set(workflows)
        served = [iid for iid, row in self.rows.items() if row.workflow in wanted]
        events = sum(
            e.status == "pending"
            for iid in served
            for e in self.inbox.get(iid, {}).values()
        )
        return events, sum(len(self.timers.get(iid, {})) for iid in served)

    def put_schedule(self, schedule_id: str, record: ScheduleRecord | None) -> None:
        """Replace (or with ``None``, remove) a schedule."""
        if self.undo is not None:
            self.undo.append(("schedule", schedule_id, self.schedules.get(schedule_id)))
        _set(self.schedules, schedule_id, record)

    def rollback(self) -> None:
        """Undo every write of the batch, newest first."""
        undo, self.undo = self.undo or [], None
        for table, key, kept in reversed(undo):
            if table == "schedule":
                _set(self.schedules, key, kept)
                continue
            row, log, timers, history, *inbox = kept
            _set(self.rows, key, row)
            _set(self.log, key, log)
            _set(self.timers, key, timers)
            _set(self.history, key, history)
            self.restore_inbox(key, *inbox)


def _set(table: dict[str, Any], key: str, value: Any) -> None:
    if value is None:
        table.pop(key, None)
    else:
        table[key] = value
