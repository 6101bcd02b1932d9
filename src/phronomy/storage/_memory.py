"""An in-memory store for tests and ephemeral use."""

from __future__ import annotations

import contextlib
import heapq
import threading
from typing import TYPE_CHECKING, Any, final

import msgspec

from phronomy.errors import InvalidInputError

from ._base import BaseStore
from ._clock import monotonic_ms
from ._memory_inbox import refused
from ._memory_schedules import apply_schedule_op
from ._memory_tables import Tables as _Tables
from ._ops import (
    BeginOp,
    DeleteOp,
    EntryOp,
    FindWriteOp,
    FireOp,
    HistoryOp,
    InboxOp,
    ListOp,
    LoadOp,
    MarkOp,
    NextDueOp,
    PendingOp,
    PollOp,
    PostOp,
    RecoverOp,
    RenewOp,
    RequestCancelOp,
    RevisionOp,
    SaveOp,
    TakeoversOp,
    TerminateOp,
    TimersOp,
)
from ._records import (
    InstancePage,
    SaveLogEntry,
    SaveRequest,
    StoredRecord,
    Takeover,
    saved_workflow,
)
from ._rule_effects import lease_after, status_after, swept
from ._rules import goes_ahead, lookup
from ._sql_schedules import SCHEDULE_OPS
from ._store import SAVE_LOG_DEPTH, conflict_error

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from ._inbox import Posting, PostOutcome
    from ._lanes import Lane
    from ._ops import StoreOp

__all__ = ["MemoryStore"]


@final
class MemoryStore(BaseStore[_Tables]):
    """A thread-safe store in memory, with the same contract as :class:`SQLiteStore`.

    A batch of writes is applied atomically (undone on failure). Snapshots are
    immutable bytes, so callers can never mutate what is stored.
    """

    def __init__(
        self,
        *,
        save_log_depth: int = SAVE_LOG_DEPTH,
        fault_hook: Callable[[str], None] | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        """Create an empty store.

        Args:
            save_log_depth: saves kept per instance in its history (at least 2).
            fault_hook: test hook called at each fault point.
            clock: the store's wall clock in milliseconds (timestamps and the due
                times of timers; default: the host's), for a test clock
                (:class:`phronomy.testing.StoreClock`).

        Raises:
            InvalidInputError: *save_log_depth* is not an integer >= 2.
        """
        super().__init__(fault_hook=fault_hook, clock=clock)
        depth: object = save_log_depth  # checked at run time: callers are not typed
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 2:
            raise InvalidInputError(
                f"save_log_depth must be an integer >= 2, got {save_log_depth!r}"
            )
        self._depth = save_log_depth
        self._lock = threading.Lock()
        self._tables = _Tables(self.wall_now_ms)

    @contextlib.contextmanager
    def _reading(self) -> Iterator[_Tables]:
        with self._lock:
            yield self._tables

    @contextlib.contextmanager
    def _writing(self, lane: Lane = "write") -> Iterator[_Tables]:
        # every lane takes the one lock: no write holds it for long
        with self._lock:
            tables = self._tables
            tables.undo = []
            try:
                yield tables
            except BaseException:
                tables.rollback()
                raise
            tables.undo = None

    def apply(self, conn: _Tables, op: StoreOp) -> Any:
        """Run one operation (see :class:`~phronomy.storage.BaseStore`)."""
        if isinstance(op, SCHEDULE_OPS):
            return apply_schedule_op(
                conn, op, lambda request: self.apply(conn, SaveOp(request=request))
            )
        match op:
            case LoadOp(workflow_instance_id=iid):
                return conn.rows.get(iid)
            case ListOp():
                rows = sorted(
                    (
                        r
                        for r in conn.rows.values()
                        if (op.status is None or r.status == op.status)
                        and (op.workflow is None or r.workflow == op.workflow)
                        and (op.after is None or r.workflow_instance_id > op.after)
                    ),
                    key=lambda r: r.workflow_instance_id,
                )
                page = tuple(
                    msgspec.structs.replace(r, snapshot=None) for r in rows[: op.limit]
                )
                more = len(rows) > op.limit
                return InstancePage(
                    records=page,
                    next_after=page[-1].workflow_instance_id if more else None,
                )
            case HistoryOp(workflow_instance_id=iid, limit=limit):
                saves = sorted(
                    conn.log.get(iid, {}).values(), key=lambda e: -e.revision
                )
                return saves[:limit]
            case RevisionOp(workflow_instance_id=iid, revision=revision):
                return _revision(conn, iid, revision)
            case TakeoversOp(workflow_instance_id=iid, limit=limit):
                return conn.history.get(iid, ({}, ()))[1][:limit]
            case FindWriteOp(workflow_instance_id=iid, write_id=write_id):
                entry = conn.log.get(iid, {}).get(write_id)
                return None if entry is None else entry.revision
            case BeginOp():
                return self._begin(conn, op)
            case SaveOp(request=request):
                iid = request.workflow_instance_id
                conn.check_pending(iid, request.consumed)
                revision = self._save(conn, request)
                self._consume(conn, iid, revision, request)
                now = conn.wall()
                conn.arm_and_disarm(
                    iid,
                    revision=revision,
                    arm=request.arm,
                    disarm=request.disarm,
                    closing=request.status in ("finished", "cancelled"),
                    now=now,
                    refuse=lambda e, why: refused(e, revision, now, why),
                )
                return revision
            case MarkOp():
                conn.check_pending(op.workflow_instance_id, op.consumed)
                changed = self._mark(conn, op)
                if changed:
                    iid = op.workflow_instance_id
                    revision = conn.rows[iid].revision
                    self._consume(conn, iid, revision, op)
                    if op.status in ("finished", "cancelled"):
                        conn.timers.pop(iid, None)
                return changed
            case TerminateOp(workflow_instance_id=iid, expected_revision=expected):
                row = conn.rows.get(iid)
                rule = lookup("terminate", row, monotonic_ms())
                if row is None or not goes_ahead(rule, row, expected=expected):
                    return False
                conn.put(
                    iid,
                    msgspec.structs.replace(
                        row,
                        status=status_after(rule, row, op.status),
                        detail=op.detail,
                        updated_at_ms=conn.wall(),
                        **lease_after(rule, row, written=op.status),
                    ),
                    conn.log.get(iid),
                )
                closing = MarkOp(workflow_instance_id=iid, status=op.status)
                self._consume(conn, iid, row.revision, closing)
                if op.status == "cancelled":
                    conn.timers.pop(iid, None)
                return True
            case PostOp(posting=posting):
                return self._post_in(conn)(posting)
            case InboxOp(workflow_instance_id=iid):
                if op.pending_only:
                    return conn.pending(iid, op.after, op.limit)
                return conn.recent(iid, op.limit)
            case EntryOp(workflow_instance_id=iid, event_id=event_id):
                return conn.entry(iid, event_id)
            case PollOp(owner=owner, workflows=workflows, limit=limit):
                return conn.poll(owner, workflows, limit)
            case NextDueOp(workflows=workflows):
                return conn.next_due(workflows, conn.wall())
            case FireOp(owner=owner, workflows=workflows, limit=limit):
                post = self._post_in(conn)
                return conn.fire_due(owner, workflows, limit, conn.wall(), post)
            case TimersOp(workflow_instance_id=iid):
                return conn.timers_of(iid)
            case PendingOp(workflows=workflows):
                return conn.pending_counts(workflows)
            case RenewOp():
                return self._renew(conn, op)
            case RecoverOp():
                return self._recover(conn, op)
            case RequestCancelOp():
                return self._request_cancel(conn, op)
            case DeleteOp(workflow_instance_id=iid, expected_revision=expected):
                row = conn.rows.get(iid)
                rule = lookup("delete", row, monotonic_ms())
                closed_only = op.closed_only
                if not goes_ahead(
                    rule, row, expected=expected, closed_only=closed_only
                ):
                    raise conflict_error(
                        iid,
                        "delete",
                        expected=expected,
                        lease=None,
                        found=None
                        if row is None
                        else (row.revision, row.lease_owner, row.lease_epoch),
                    )
                conn.put(iid, None, None)
                return None
        raise TypeError(f"unknown store operation {op!r}")  # pragma: no cover

    @staticmethod
    def _post_in(conn: _Tables) -> Callable[[Posting], PostOutcome]:
        def post(posting: Posting) -> PostOutcome:
            row = conn.rows.get(posting.workflow_instance_id)
            if row is not None:
                row = msgspec.structs.replace(row, snapshot=None)
            return conn.post(posting, conn.wall(), row)

        return post

    @staticmethod
    def _begin(conn: _Tables, op: BeginOp) -> int | None:
        iid, owner, now = op.workflow_instance_id, op.lease_owner, monotonic_ms()
        row = conn.rows.get(iid)
        rule = lookup("begin_new" if op.only_new else "begin", row, now, owner=owner)
        if not goes_ahead(rule, row, expected=op.expected_revision):
            return None
        if row is None:
            row = StoredRecord(
                workflow_instance_id=iid,
                workflow=op.workflow,
                revision=0,
                status="running",
            )
        claimed = msgspec.structs.replace(
            row,
            status=status_after(rule, row),
            workflow=row.workflow or op.workflow,
            updated_at_ms=conn.wall(),
            **lease_after(rule, row, owner=owner, expires=now + op.ttl_ms),
        )
        conn.put(iid, claimed, conn.log.get(iid))
        return claimed.lease_epoch

    @staticmethod
    def _renew(conn: _Tables, op: RenewOp) -> dict[str, tuple[int, str | None, bool]]:
        now, renewed = monotonic_ms(), {}
        for iid in op.instance_ids:
            row = conn.rows.get(iid)
            rule = lookup("renew", row, now, owner=op.owner)
            if row is not None and goes_ahead(rule, row):
                expires = now + op.ttl_ms
                row = msgspec.structs.replace(
                    row, **lease_after(rule, row, expires=expires)
                )
                conn.put(iid, row, conn.log.get(iid))
                renewed[iid] = (row.lease_epoch, row.cancel_requested, True)
        return renewed

    @staticmethod
    def _request_cancel(conn: _Tables, op: RequestCancelOp) -> tuple[int, bool] | None:
        iid = op.workflow_instance_id
        row = conn.rows.get(iid)
        rule = lookup("request_cancel", row, monotonic_ms())
        if row is None or not goes_ahead(rule, row):
            return None
        lease = lease_after(rule, row, reason=op.reason)
        conn.put(iid, msgspec.structs.replace(row, **lease), conn.log.get(iid))
        return row.lease_epoch, True

    def _recover(self, conn: _Tables, op: RecoverOp) -> list[tuple[str, str]]:
        now = monotonic_ms()
        expired = heapq.nsmallest(
            op.limit,
            (r for r in conn.rows.values() if goes_ahead(lookup("recover", r, now), r)),
            key=lambda r: r.lease_expires_at_ms or 0,
        )
        recovered: list[tuple[str, str]] = []
        for row in expired:
            iid = row.workflow_instance_id
            log = conn.log.get(iid)
            saved = [e for e in (log or {}).values() if e.revision == row.revision]
            status, detail = swept(
                row.revision,
                row.takeovers,
                op.max_takeovers,
                saved[0].status if saved else None,
                row.cancel_requested,
            )
            rule = lookup("recover", row, now)
            conn.put(
                iid,
                msgspec.structs.replace(
                    row,
                    status=status,
                    detail=detail,
                    updated_at_ms=conn.wall(),
                    takeovers=row.takeovers + 1,
                    **lease_after(rule, row),
                ),
                log,
            )
            taken = Takeover(
                epoch=conn.rows[iid].lease_epoch,
                revision=row.revision,
                status=status,
                detail=detail,
                taken_at_ms=conn.wall(),
            )
            conn.log_takeover(iid, taken, self._depth)
            recovered.append((iid, status))
            if status in ("finished", "cancelled"):  # nothing applies any more
                conn.consume(
                    iid,
                    revision=row.revision,
                    consumed=(),
                    closing=status,
                    now=conn.wall(),
                    depth=self._depth,
                )
                conn.timers.pop(iid, None)
        return recovered

    def _consume(
        self, conn: _Tables, iid: str, revision: int, op: SaveRequest | MarkOp
    ) -> None:
        closing = op.status if op.status in ("finished", "cancelled") else None
        conn.consume(
            iid,
            revision=revision,
            consumed=op.consumed,
            closing=closing,
            now=conn.wall(),
            depth=self._depth,
        )

    def _save(self, conn: _Tables, request: SaveRequest) -> int:
        iid = request.workflow_instance_id
        row = conn.rows.get(iid)
        current = 0 if row is None else row.revision
        lease = request.lease
        rule = lookup(
            "save" if lease is None else "save_fenced",
            row,
            monotonic_ms(),
            owner=None if lease is None else lease.owner,
            epoch=None if lease is None else lease.epoch,
        )
        if not goes_ahead(rule, row, expected=request.expected_revision):
            found = None if row is None else (current, row.lease_owner, row.lease_epoch)
            raise conflict_error(
                iid,
                "save",
                expected=request.expected_revision,
                lease=lease,
                found=found,
            )
        revision = current + 1
        log = {
            w: e
            for w, e in conn.log.get(iid, {}).items()
            if e.revision > revision - self._depth
        }
        now = conn.wall()
        base = row or StoredRecord(
            workflow_instance_id=iid,
            workflow=request.workflow,
            revision=0,
            status="running",
        )
        log[request.write_id] = SaveLogEntry(
            revision=revision,
            status=request.status,
            phase=request.phase,
            write_id=request.write_id,
            committed_at_ms=now,
            definition_version=request.definition_version,
            detail=request.detail,
        )
        conn.put(
            iid,
            StoredRecord(
                workflow_instance_id=iid,
                workflow=saved_workflow(base.workflow, request.workflow),
                revision=revision,
                status=status_after(rule, base, request.status),
                phase=request.phase,
                snapshot=request.snapshot,
                write_id=request.write_id,
                detail=request.detail,
                updated_at_ms=now,
                definition_version=request.definition_version,
                **lease_after(rule, base, written=request.status),
            ),
            log,
        )
        conn.keep_state(iid, revision, request.snapshot, self._depth)
        return revision

    @staticmethod
    def _mark(conn: _Tables, op: MarkOp) -> bool:
        iid = op.workflow_instance_id
        row, lease = conn.rows.get(iid), op.lease
        rule = lookup(
            "mark" if lease is None else "mark_fenced",
            row,
            monotonic_ms(),
            owner=None if lease is None else lease.owner,
            epoch=None if lease is None else lease.epoch,
        )
        if not goes_ahead(rule, row, expected=op.expected_revision, create=op.create):
            return False
        if row is None:  # a placeholder, so that the status stays visible
            row = StoredRecord(
                workflow_instance_id=iid,
                workflow=op.workflow,
                revision=0,
                status=op.status,
            )
        conn.put(
            iid,
            msgspec.structs.replace(
                row,
                status=status_after(rule, row, op.status),
                detail=op.detail,
                updated_at_ms=conn.wall(),
                **lease_after(rule, row, written=op.status),
            ),
            conn.log.get(iid),
        )
        return True


def _revision(conn: _Tables, iid: str, revision: int) -> StoredRecord | None:
    """See :class:`~phronomy.storage.RevisionOp`."""
    row = conn.rows.get(iid)
    logged = [e for e in conn.log.get(iid, {}).values() if e.revision == revision]
    if row is None or not logged:
        return None
    (entry,) = logged
    return StoredRecord(
        workflow_instance_id=iid,
        workflow=row.workflow,
        revision=revision,
        status=entry.status,
        phase=entry.phase,
        snapshot=conn.history.get(iid, ({}, ()))[0].get(revision),
        write_id=entry.write_id,
        detail=entry.detail,
        updated_at_ms=entry.committed_at_ms,
        definition_version=entry.definition_version,
    )
