"""An in-memory store for tests and ephemeral use."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import TYPE_CHECKING, Any, final

import msgspec

from phronomy.errors import ConflictError, InvalidInputError

from ._base import BaseStore
from ._ops import (
    BeginOp,
    DeleteOp,
    FindWriteOp,
    HistoryOp,
    ListOp,
    LoadOp,
    MarkOp,
    SaveOp,
)
from ._records import InstancePage, SaveLogEntry, SaveRequest, StoredRecord
from ._store import SAVE_LOG_DEPTH

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from ._ops import StoreOp

__all__ = ["MemoryStore"]


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class _Tables:
    """The rows and the save log; writes note what they replace, to undo a batch."""

    def __init__(self) -> None:
        self.rows: dict[str, StoredRecord] = {}
        self.log: dict[str, dict[str, SaveLogEntry]] = {}  # id -> write id -> save
        self.undo: (
            list[tuple[str, StoredRecord | None, dict[str, SaveLogEntry] | None]] | None
        ) = None

    def put(
        self,
        iid: str,
        row: StoredRecord | None,
        log: dict[str, SaveLogEntry] | None,
    ) -> None:
        """Replace (or with ``None``, remove) the row and save log of *iid*."""
        if self.undo is not None:
            self.undo.append((iid, self.rows.get(iid), self.log.get(iid)))
        _set(self.rows, iid, row)
        _set(self.log, iid, log)

    def rollback(self) -> None:
        """Undo every write of the batch, newest first."""
        undo, self.undo = self.undo or [], None
        for iid, row, log in reversed(undo):
            _set(self.rows, iid, row)
            _set(self.log, iid, log)


def _set(table: dict[str, Any], key: str, value: Any) -> None:
    if value is None:
        table.pop(key, None)
    else:
        table[key] = value


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
    ) -> None:
        """Create an empty store.

        Args:
            save_log_depth: saves kept per instance in its history (at least 2).
            fault_hook: test hook called at each fault point.

        Raises:
            InvalidInputError: *save_log_depth* is not an integer >= 2.
        """
        super().__init__(fault_hook=fault_hook)
        depth: object = save_log_depth  # checked at run time: callers are not typed
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 2:
            raise InvalidInputError(
                f"save_log_depth must be an integer >= 2, got {save_log_depth!r}"
            )
        self._depth = save_log_depth
        self._lock = threading.Lock()
        self._tables = _Tables()

    @contextlib.contextmanager
    def _reading(self) -> Iterator[_Tables]:
        with self._lock:
            yield self._tables

    @contextlib.contextmanager
    def _writing(self) -> Iterator[_Tables]:
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
            case FindWriteOp(workflow_instance_id=iid, write_id=write_id):
                entry = conn.log.get(iid, {}).get(write_id)
                return None if entry is None else entry.revision
            case BeginOp():
                return self._begin(conn, op)
            case SaveOp(request=request):
                return self._save(conn, request)
            case MarkOp():
                return self._mark(conn, op)
            case DeleteOp(workflow_instance_id=iid, expected_revision=expected):
                row = conn.rows.get(iid)
                if row is None or row.revision != expected:
                    raise ConflictError(
                        f"cannot delete workflow instance {iid!r}: at revision "
                        f"{row.revision if row else None}, expected {expected}"
                    )
                conn.put(iid, None, None)
                return None
        raise TypeError(f"unknown store operation {op!r}")  # pragma: no cover

    @staticmethod
    def _begin(conn: _Tables, op: BeginOp) -> bool:
        iid = op.workflow_instance_id
        row = conn.rows.get(iid)
        if row is None:
            if op.expected_revision:
                return False
            row = StoredRecord(
                workflow_instance_id=iid,
                workflow=op.workflow,
                revision=0,
                status="running",
            )
        elif (
            row.revision != (op.expected_revision or 0)
            or row.status == "recovery_required"
        ):
            return False
        conn.put(
            iid,
            msgspec.structs.replace(
                row,
                status="running",
                workflow=row.workflow or op.workflow,
                updated_at_ms=_now_ms(),
            ),
            conn.log.get(iid),
        )
        return True

    def _save(self, conn: _Tables, request: SaveRequest) -> int:
        iid = request.workflow_instance_id
        row = conn.rows.get(iid)
        current = 0 if row is None else row.revision
        if current != (request.expected_revision or 0):
            raise ConflictError(
                f"workflow instance {iid!r} is at revision {current if row else None}, "
                f"expected {request.expected_revision}"
            )
        revision = current + 1
        log = {
            w: e
            for w, e in conn.log.get(iid, {}).items()
            if e.revision > revision - self._depth
        }
        now = _now_ms()
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
                workflow=request.workflow or (row.workflow if row else ""),
                revision=revision,
                status=request.status,
                phase=request.phase,
                snapshot=request.snapshot,
                write_id=request.write_id,
                detail=request.detail,
                updated_at_ms=now,
                definition_version=request.definition_version,
            ),
            log,
        )
        return revision

    @staticmethod
    def _mark(conn: _Tables, op: MarkOp) -> bool:
        iid = op.workflow_instance_id
        row = conn.rows.get(iid)
        if row is None and op.create:
            row = StoredRecord(
                workflow_instance_id=iid,
                workflow=op.workflow,
                revision=0,
                status=op.status,
            )
        if row is None or (
            op.expected_revision is not None and row.revision != op.expected_revision
        ):
            return False
        conn.put(
            iid,
            msgspec.structs.replace(
                row, status=op.status, detail=op.detail, updated_at_ms=_now_ms()
            ),
            conn.log.get(iid),
        )
        return True
