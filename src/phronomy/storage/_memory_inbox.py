"""MemoryStore's inbox: the SQL stores' inbox rules, on dictionaries."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from ._clock import monotonic_ms
from ._inbox import InboxEntry, PostOutcome, not_pending
from ._rules import goes_ahead, lookup

if TYPE_CHECKING:
    from ._inbox import Posting
    from ._records import Consumption, StoredRecord

__all__ = ["MemoryInbox", "refused"]


class MemoryInbox:
    """The inbox part of MemoryStore's tables (a mixin of its tables)."""

    rows: dict[str, StoredRecord]

    def __init__(self) -> None:
        self.inbox: dict[str, dict[int, InboxEntry]] = {}  # id -> seq -> entry
        self.seqs: dict[str, int] = {}  # id -> last sequence number given

    def note(self, iid: str) -> None:
        """Remember the state of *iid* before a write (the tables undo batches)."""
        raise NotImplementedError

    def inbox_state(self, iid: str) -> tuple[dict[int, InboxEntry] | None, int | None]:
        """What to restore to undo writes of *iid*'s inbox."""
        entries = self.inbox.get(iid)
        return (None if entries is None else dict(entries)), self.seqs.get(iid)

    def restore_inbox(
        self, iid: str, entries: dict[int, InboxEntry] | None, seq: int | None
    ) -> None:
        """Put back what :meth:`inbox_state` returned."""
        _set(self.inbox, iid, entries)
        _set(self.seqs, iid, seq)

    def forget(self, iid: str) -> None:
        """The instance's row went: its inbox goes with it."""
        self.inbox.pop(iid, None)
        self.seqs.pop(iid, None)

    # --- the operations -----------------------------------------------------------

    def post(self, posting: Posting, now: int, row: StoredRecord | None) -> PostOutcome:
        """See :class:`~phronomy.storage.PostOp` (*row*: the instance's, without its
        snapshot)."""
        iid = posting.workflow_instance_id
        entries = self.inbox.get(iid, {})
        earlier = next(
            (e for e in entries.values() if e.event_id == posting.event_id), None
        )
        rule = lookup("post", row, monotonic_ms())
        if goes_ahead(rule, row) and earlier is None:
            self.note(iid)
            seq = self.seqs.get(iid, 0) + 1  # no gaps: a repeat takes no number
            self.seqs[iid] = seq
            entry = posting.stored(seq=seq, stored_at_ms=now)
            self.inbox[iid] = {**entries, seq: entry}
            return PostOutcome(outcome="stored", entry=entry, row=row)
        if earlier is not None:
            repeat = earlier.same_event(posting)
            return PostOutcome(
                outcome="duplicate" if repeat else "mismatch", entry=earlier, row=row
            )
        return PostOutcome(outcome="missing" if row is None else "closed", row=row)

    def pending(self, iid: str, after: int, limit: int) -> tuple[InboxEntry, ...]:
        """The instance's pending entries after *after*, oldest first."""
        entries = self.inbox.get(iid, {})
        found = sorted(
            (e for e in entries.values() if e.status == "pending" and e.seq > after),
            key=lambda e: e.seq,
        )
        return tuple(found[:limit])

    def recent(self, iid: str, limit: int) -> tuple[InboxEntry, ...]:
        """The instance's last *limit* entries, newest first."""
        entries = sorted(self.inbox.get(iid, {}).values(), key=lambda e: -e.seq)
        return tuple(entries[:limit])

    def entry(self, iid: str, event_id: str) -> InboxEntry | None:
        """The entry with *event_id*, or ``None``."""
        entries = self.inbox.get(iid, {}).values()
        return next((e for e in entries if e.event_id == event_id), None)

    def poll(
        self, owner: str, workflows: tuple[str, ...], limit: int
    ) -> tuple[tuple[InboxEntry, str, str, str | None], ...]:
        """See :class:`~phronomy.storage.PollOp`."""
        found: list[tuple[InboxEntry, str, str, str | None]] = []
        now = monotonic_ms()
        for iid in sorted(self.inbox):
            row = self.rows.get(iid)
            rule = lookup("poll", row, now, owner=owner)
            served = row is not None and row.workflow in workflows
            if row is None or not goes_ahead(rule, row, served=served):
                continue
            found.extend(
                (e, row.status, row.workflow, row.lease_owner)
                for e in self.pending(iid, 0, limit)
            )
        return tuple(found[:limit])

    def check_pending(self, iid: str, consumed: tuple[Consumption, ...]) -> None:
        """A write that consumes entries that are not pending is refused (before it changes anything)."""
        entries = self.inbox.get(iid, {})
        missing = sorted(
            {c.seq for c in consumed}
            - {seq for seq, e in entries.items() if e.status == "pending"}
        )
        if missing:
            raise not_pending(iid, missing)

    def consume(
        self,
        iid: str,
        *,
        revision: int,
        consumed: tuple[Consumption, ...],
        closing: str | None,
        now: int,
        depth: int,
    ) -> None:
        """Record consumptions (see :class:`~phronomy.storage.SaveRequest`); keep the
        last *depth* consumed entries."""
        if not consumed and closing is None:
            return
        self.note(iid)
        entries = dict(self.inbox.get(iid, {}))
        for c in consumed:
            entry = entries.get(c.seq)
            if entry is not None and entry.status == "pending":
                entries[c.seq] = _consumed(entry, c.status, revision, now, c.detail)
        if closing is not None:
            detail = (
                f"the instance was {closing} at revision {revision} before it was "
                "applied"
            )
            for seq, entry in entries.items():
                if entry.status == "pending":
                    entries[seq] = _consumed(entry, "refused", revision, now, detail)
        done = sorted(seq for seq, e in entries.items() if e.status != "pending")
        for seq in done[: max(len(done) - depth, 0)]:
            del entries[seq]
        self.inbox[iid] = entries


def refused(entry: InboxEntry, revision: int, now: int, detail: str) -> InboxEntry:
    """*entry*, refused by the write that produced *revision* (*detail*: why)."""
    return _consumed(entry, "refused", revision, now, detail)


def _consumed(
    entry: InboxEntry, status: Any, revision: int, now: int, detail: str | None
) -> InboxEntry:
    return msgspec.structs.replace(
        entry, status=status, revision=revision, consumed_at_ms=now, detail=detail
    )


def _set(table: dict[str, Any], key: str, value: Any) -> None:
    if value is None:
        table.pop(key, None)
    else:
        table[key] = value
