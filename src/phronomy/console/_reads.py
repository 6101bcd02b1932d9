"""The console's store reads: blocking functions the app runs in a worker thread.

They read through the same store operations as the command line's inspecting
commands (``instances list|show|history``, ``executions list|show``, ``schedules
list``) and return plain values for the pages.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

import msgspec

from phronomy._cli_commands import (
    _live,
    _who_applies,
    _workflow_page,
    lease_state,
    pending_timers,
)
from phronomy.agent import ExecutionRecord
from phronomy.agent._records import agent_key, execution_record, listing, run_listing
from phronomy.durability import kind_of
from phronomy.errors import InvalidInputError, NotFoundError, PhronomyError
from phronomy.storage import (
    EXECUTION_KEY_PREFIX,
    MAX_LIMIT,
    InboxEntry,
    InboxOp,
    ListOp,
    SaveLogEntry,
    SchedulesOp,
    StoredRecord,
    StoredTimer,
    Takeover,
    TakeoversOp,
    TimersOp,
    decode_snapshot_builtins,
    lease_now_ms,
)
from phronomy.workflow._inbox_client import interleave

from ._html import clip

if TYPE_CHECKING:
    from phronomy.agent import ExecutionPage
    from phronomy.storage import BaseStore, ScheduleRecord

__all__ = [
    "COUNT_CAP",
    "Counts",
    "ExecutionView",
    "InstanceView",
    "InstancesPage",
    "execution",
    "executions",
    "instance",
    "instances",
    "schedules",
]

COUNT_CAP = 100_000
"""The most rows the counts by status and workflow read (beyond: marked partial)."""
HISTORY_LIMIT = 200
"""The most saves, events and timers an instance page's timeline shows."""


class Counts(msgspec.Struct, frozen=True, kw_only=True):
    """Workflow instances by status and by workflow (executions not counted).

    Attributes:
        total: rows counted.
        by_status: status -> rows.
        by_workflow: workflow -> rows.
        partial: more than :data:`COUNT_CAP` rows: these count the first ones.
    """

    total: int
    by_status: dict[str, int]
    by_workflow: dict[str, int]
    partial: bool = False


class InstancesPage(msgspec.Struct, frozen=True, kw_only=True):
    """One page of the instances list.

    Attributes:
        records: the rows (without snapshots), by id.
        next_after: the next page's ``after`` (``None``: the last page).
        counts: the counts over the whole table.
        lease_now_ms: the store's lease clock (``None``: restarted since).
    """

    records: tuple[StoredRecord, ...]
    next_after: str | None
    counts: Counts
    lease_now_ms: int | None


class InstanceView(msgspec.Struct, frozen=True, kw_only=True):
    """One workflow instance, as its page shows it.

    Attributes:
        record: its row (with the snapshot).
        fields: its saved state's fields (``None``: nothing saved, or unreadable).
        snapshot_error: why the snapshot could not be read.
        lease: the lease in words.
        pending: its pending events (as ``instances show`` prints them) and the note.
        timers: its armed timers, soonest first.
        timeline: saves, events, fired timers and takeovers, newest first.
    """

    record: StoredRecord
    fields: dict[str, Any] | None
    snapshot_error: str | None
    lease: str
    pending: dict[str, Any]
    timers: list[dict[str, Any]]
    timeline: list[SaveLogEntry | InboxEntry | StoredTimer | Takeover]


class ExecutionView(msgspec.Struct, frozen=True, kw_only=True):
    """One agent's execution, as its page shows it.

    Attributes:
        record: what the store says of it.
        row: its row.
        lease: the lease in words.
        pending: its pending events (answers).
        timers: its armed timers.
    """

    record: ExecutionRecord
    row: StoredRecord
    lease: str
    pending: dict[str, Any]
    timers: list[dict[str, Any]]


def _pending(store: BaseStore[Any], record: StoredRecord) -> dict[str, Any]:
    """The row's pending events, and who applies them (as ``instances show``)."""
    entries: list[InboxEntry] = store.run(
        InboxOp(workflow_instance_id=record.workflow_instance_id, limit=MAX_LIMIT)
    )
    view: dict[str, Any] = {"entries": entries, "note": None}
    if entries:
        live = _live(record, lease_now_ms(store))
        view["note"] = _who_applies(record, entries[0], live=live)
    return view


def count(store: BaseStore[Any]) -> Counts:
    """The workflow instances by status and by workflow (up to :data:`COUNT_CAP`)."""
    by_status: dict[str, int] = {}
    by_workflow: dict[str, int] = {}
    total, after = 0, None
    while total < COUNT_CAP:
        page = store.run(ListOp(limit=MAX_LIMIT, after=after))
        for record in page.records:
            if kind_of(record) == "workflow":
                total += 1
                by_status[record.status] = by_status.get(record.status, 0) + 1
                by_workflow[record.workflow] = by_workflow.get(record.workflow, 0) + 1
        if page.next_after is None:
            return Counts(total=total, by_status=by_status, by_workflow=by_workflow)
        after = page.next_after
    return Counts(
        total=total, by_status=by_status, by_workflow=by_workflow, partial=True
    )


def instances(
    store: BaseStore[Any],
    *,
    status: str | None,
    workflow: str | None,
    after: str | None,
    limit: int,
    counts: Counts | None = None,
) -> InstancesPage:
    """One page of workflow instances (the ``instances list`` page) and the counts
    (*counts*, counted again when ``None``)."""
    args = argparse.Namespace(
        status=status, workflow=workflow, after=after, limit=limit
    )
    records, next_after = _workflow_page(store, args)  # type: ignore[arg-type]
    return InstancesPage(
        records=tuple(records),
        next_after=next_after,
        counts=count(store) if counts is None else counts,
        lease_now_ms=lease_now_ms(store),
    )


def instance(store: BaseStore[Any], iid: str) -> InstanceView:
    """One workflow instance: row, state, lease, pending events and timers, timeline.

    Raises:
        NotFoundError: nothing is stored under *iid*.
        InvalidInputError: *iid* is a supervised execution's row.
    """
    record: StoredRecord | None = store.load(iid)
    if record is None:
        raise NotFoundError(f"workflow instance {clip(iid)!r} does not exist")
    if kind_of(record) == "execution":
        raise InvalidInputError(
            f"{iid!r} is the record of a supervised execution (agent "
            f"{iid.removeprefix(EXECUTION_KEY_PREFIX)!r})"
        )
    fields: dict[str, Any] | None = None
    error: str | None = None
    if record.snapshot is not None:
        try:
            fields = decode_snapshot_builtins(
                record.snapshot, workflow_instance_id=iid, revision=record.revision
            ).fields
        except PhronomyError as exc:  # a corrupt row: show what is readable
            error = str(exc)
    saves = store.history(iid, limit=HISTORY_LIMIT)
    events = store.run(
        InboxOp(workflow_instance_id=iid, pending_only=False, limit=HISTORY_LIMIT)
    )
    armed: list[StoredTimer] = store.run(TimersOp(workflow_instance_id=iid))[::-1]
    taken = store.run(TakeoversOp(workflow_instance_id=iid, limit=HISTORY_LIMIT))
    timeline = [*armed, *interleave(saves, events, taken)][:HISTORY_LIMIT]
    return InstanceView(
        record=record,
        fields=fields,
        snapshot_error=error,
        lease=lease_state(record, lease_now_ms(store)),
        pending=_pending(store, record),
        timers=pending_timers(store, iid),  # type: ignore[arg-type]
        timeline=timeline,
    )


def executions(
    store: BaseStore[Any], *, status: str | None, after: str | None, limit: int
) -> ExecutionPage:
    """One page of executions, by agent id.

    Raises:
        InvalidInputError: an unknown *status*.
    """
    return run_listing(
        listing(status=status, after=after, limit=limit),  # type: ignore[arg-type]
        store.run,
    )


def execution(store: BaseStore[Any], agent_id: str) -> ExecutionView:
    """One agent's execution, its pending answers and its lease.

    Raises:
        NotFoundError: the agent has no execution.
    """
    row: StoredRecord | None = store.load(agent_key(agent_id))
    if row is None:
        raise NotFoundError(f"agent {clip(agent_id)!r} has no execution record")
    record = execution_record(row)
    return ExecutionView(
        record=record,
        row=row,
        lease=lease_state(row, lease_now_ms(store)),
        pending=_pending(store, row),
        timers=pending_timers(store, row.workflow_instance_id),  # type: ignore[arg-type]
    )


def schedules(
    store: BaseStore[Any], *, after: str | None, limit: int
) -> tuple[str | None, list[ScheduleRecord]]:
    """One page of schedules by id, and the next page's ``after``."""
    _, records = store.run(SchedulesOp(after=after, limit=limit + 1))
    more = len(records) > limit
    records = list(records)[:limit]
    return (records[-1].schedule_id if more else None), records
