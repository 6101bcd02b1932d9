"""MemoryStore's timers: the SQL stores' timer rules, on dictionaries."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._clock import monotonic_ms
from ._rules import goes_ahead, lookup
from ._timers import ALL_TIMERS, StoredTimer, disarm_prefix

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._inbox import InboxEntry, Posting, PostOutcome
    from ._records import StoredRecord, TimerSpec

__all__ = ["MemoryTimers"]


class MemoryTimers:
    """The timers part of MemoryStore's tables (a mixin of its tables)."""

    rows: dict[str, StoredRecord]
    inbox: dict[str, dict[int, InboxEntry]]

    def __init__(self) -> None:
        self.timers: dict[str, dict[str, StoredTimer]] = {}  # id -> name -> timer

    def note(self, iid: str) -> None:
        """Remember the state of *iid* before a write (the tables undo batches)."""
        raise NotImplementedError

    def arm_and_disarm(
        self,
        iid: str,
        *,
        revision: int,
        arm: tuple[TimerSpec, ...],
        disarm: tuple[str, ...],
        closing: bool,
        now: int,
        refuse: Callable[[InboxEntry, str], InboxEntry],
    ) -> None:
        """See :func:`phronomy.storage._sql_timers.arm_and_disarm`; *refuse* makes an
        entry refused with a detail."""
        if not (arm or disarm or closing):
            return
        self.note(iid)
        if closing:
            self.timers.pop(iid, None)
            return
        timers = dict(self.timers.get(iid, {}))
        entries = dict(self.inbox.get(iid, {}))
        if ALL_TIMERS in disarm:
            timers.clear()
        for name in (*disarm, *(spec.name for spec in arm)):
            timers.pop(name, None)
            prefix = disarm_prefix(name)
            for seq, entry in entries.items():
                if entry.status == "pending" and entry.event_id.startswith(prefix):
                    detail = f"timer {name!r} was disarmed before it was applied"
                    entries[seq] = refuse(entry, detail)
        for spec in arm:
            timers[spec.name] = StoredTimer(
                workflow_instance_id=iid,
                name=spec.name,
                due_at_ms=now + spec.delay_ms,
                event=spec.event,
                payload=spec.payload,
                kind=spec.kind,
                state=spec.state,
                armed_revision=revision,
                armed_at_ms=now,
                workflow=self.rows[iid].workflow,
            )
        self.inbox[iid] = entries
        if timers:
            self.timers[iid] = timers
        else:
            self.timers.pop(iid, None)

    def _served(
        self, owner: str | None, workflows: tuple[str, ...]
    ) -> list[StoredTimer]:
        """The timers of *workflows* (those *owner* may fire, unless ``None``), by
        due time (see :mod:`phronomy.storage._sql_timers`)."""
        found: list[StoredTimer] = []
        now = monotonic_ms()
        for iid, timers in self.timers.items():
            row = self.rows.get(iid)
            if row is None:
                continue
            rule = lookup("fire", row, now, owner=owner)
            if owner is None or goes_ahead(rule, row):
                found.extend(t for t in timers.values() if t.workflow in workflows)
        return sorted(
            found, key=lambda t: (t.due_at_ms, t.workflow_instance_id, t.name)
        )

    def next_due(self, workflows: tuple[str, ...], now: int) -> int | None:
        """See :class:`~phronomy.storage.NextDueOp` (the first timer of the workflows
        served, whoever may fire it)."""
        served = self._served(None, workflows)
        return served[0].due_at_ms - now if served else None

    def fire_due(
        self,
        owner: str,
        workflows: tuple[str, ...],
        limit: int,
        now: int,
        post: Callable[[Posting], PostOutcome],
    ) -> int:
        """See :class:`~phronomy.storage.FireOp`."""
        due = [t for t in self._served(owner, workflows) if t.due_at_ms <= now]
        fired = 0
        for timer in due[:limit]:
            iid = timer.workflow_instance_id
            self.note(iid)
            timers = dict(self.timers[iid])
            del timers[timer.name]
            if timers:
                self.timers[iid] = timers
            else:
                del self.timers[iid]
            fired += post(timer.posting()).outcome == "stored"
        return fired

    def timers_of(self, iid: str) -> tuple[StoredTimer, ...]:
        """The instance's pending timers, soonest first."""
        timers = self.timers.get(iid, {}).values()
        return tuple(sorted(timers, key=lambda t: (t.due_at_ms, t.name)))
