"""An in-memory store for tests and ephemeral use."""

from __future__ import annotations

import threading
import time
from typing import final

import msgspec

from phronomy.errors import ConflictError

from ._records import InstancePage, InstanceStatus, SaveRequest, StoredRecord
from ._store import SAVE_LOG_DEPTH, BaseStore

__all__ = ["MemoryStore"]


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@final
class MemoryStore(BaseStore):
    """A thread-safe store in a dict, with the same contract as :class:`SQLiteStore`.

    Snapshots are immutable bytes, so callers can never mutate what is stored.
    """

    max_concurrency = 1

    def __init__(self) -> None:
        """Create an empty store."""
        self._lock = threading.Lock()
        self._rows: dict[str, StoredRecord] = {}
        self._log: dict[str, dict[str, int]] = {}  # id -> write id -> revision

    def load(self, workflow_instance_id: str) -> StoredRecord | None:
        """See :meth:`~phronomy.storage.WorkflowStore.load`."""
        with self._lock:
            return self._rows.get(workflow_instance_id)

    def begin(
        self,
        workflow_instance_id: str,
        workflow: str,
        *,
        expected_revision: int | None = None,
    ) -> bool:
        """See :meth:`~phronomy.storage.WorkflowStore.begin`."""
        with self._lock:
            row = self._rows.get(workflow_instance_id)
            if row is None:
                if expected_revision:
                    return False
                self._rows[workflow_instance_id] = StoredRecord(
                    workflow_instance_id=workflow_instance_id,
                    workflow=workflow,
                    revision=0,
                    status="running",
                    updated_at_ms=_now_ms(),
                )
                return True
            if (
                row.revision != (expected_revision or 0)
                or row.status == "recovery_required"
            ):
                return False
            self._rows[workflow_instance_id] = msgspec.structs.replace(
                row,
                status="running",
                workflow=row.workflow or workflow,
                updated_at_ms=_now_ms(),
            )
            return True

    def save(self, request: SaveRequest) -> int:
        """See :meth:`~phronomy.storage.WorkflowStore.save`."""
        iid = request.workflow_instance_id
        with self._lock:
            row = self._rows.get(iid)
            current = 0 if row is None else row.revision
            if current != (request.expected_revision or 0):
                raise ConflictError(
                    f"workflow instance {iid!r} is at revision {current if row else None}, "
                    f"expected {request.expected_revision}"
                )
            revision = current + 1
            self._rows[iid] = StoredRecord(
                workflow_instance_id=iid,
                workflow=request.workflow or (row.workflow if row else ""),
                revision=revision,
                status=request.status,
                phase=request.phase,
                snapshot=request.snapshot,
                write_id=request.write_id,
                updated_at_ms=_now_ms(),
            )
            log = self._log.setdefault(iid, {})
            log[request.write_id] = revision
            if len(log) > SAVE_LOG_DEPTH:
                self._log[iid] = {
                    w: r for w, r in log.items() if r > revision - SAVE_LOG_DEPTH
                }
            return revision

    def mark(
        self,
        workflow_instance_id: str,
        status: InstanceStatus,
        *,
        expected_revision: int | None = None,
        detail: str | None = None,
        create: bool = False,
        workflow: str = "",
    ) -> bool:
        """See :meth:`~phronomy.storage.WorkflowStore.mark`."""
        with self._lock:
            row = self._rows.get(workflow_instance_id)
            if row is None and create:
                row = StoredRecord(
                    workflow_instance_id=workflow_instance_id,
                    workflow=workflow,
                    revision=0,
                    status=status,
                )
            if row is None or (
                expected_revision is not None and row.revision != expected_revision
            ):
                return False
            self._rows[workflow_instance_id] = msgspec.structs.replace(
                row, status=status, detail=detail, updated_at_ms=_now_ms()
            )
            return True

    def delete(self, workflow_instance_id: str, expected_revision: int) -> None:
        """See :meth:`~phronomy.storage.WorkflowStore.delete`."""
        with self._lock:
            row = self._rows.get(workflow_instance_id)
            if row is None or row.revision != expected_revision:
                raise ConflictError(
                    f"cannot delete workflow instance {workflow_instance_id!r}: at revision "
                    f"{row.revision if row else None}, expected {expected_revision}"
                )
            del self._rows[workflow_instance_id]
            self._log.pop(workflow_instance_id, None)

    def find_write(self, workflow_instance_id: str, write_id: str) -> int | None:
        """See :meth:`~phronomy.storage.WorkflowStore.find_write`."""
        with self._lock:
            return self._log.get(workflow_instance_id, {}).get(write_id)

    def list_instances(
        self,
        *,
        status: InstanceStatus | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> InstancePage:
        """See :meth:`~phronomy.storage.WorkflowStore.list_instances`."""
        with self._lock:
            rows = sorted(
                (
                    r
                    for r in self._rows.values()
                    if status is None or r.status == status
                ),
                key=lambda r: r.workflow_instance_id,
            )
        if after is not None:
            rows = [r for r in rows if r.workflow_instance_id > after]
        page = tuple(msgspec.structs.replace(r, snapshot=None) for r in rows[:limit])
        more = len(rows) > limit
        return InstancePage(
            records=page, next_after=page[-1].workflow_instance_id if more else None
        )
