"""Test helpers: a store wrapper that injects faults at named points.

Example::

    store = FaultyStore(SQLiteStore(path))
    store.fail("save.after", OSError("connection lost"))   # commits, then raises
    gate = store.block("load.before")                        # holds loads until gate.set()

Points are ``<operation>.before`` (raise or wait before the inner store runs: nothing
is written) and ``<operation>.after`` (the inner store ran and committed, then the
fault fires: the caller sees an error although the write landed). Operations: ``load``,
``begin``, ``save``, ``mark``, ``delete``, ``find_write``; ``readback`` fires
when an uncertain save is being reconciled, before the store is read back.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Self, final

from phronomy.storage import BaseStore, SaveOutcome

if TYPE_CHECKING:
    from phronomy.storage import (
        InstancePage,
        InstanceStatus,
        SaveRequest,
        StoredRecord,
        WorkflowStore,
    )

__all__ = ["FaultyStore"]


class _Fault:
    __slots__ = ("error", "gate", "remaining", "seconds")

    def __init__(
        self,
        *,
        error: BaseException | None = None,
        seconds: float = 0.0,
        gate: threading.Event | None = None,
        times: int | None = 1,
    ) -> None:
        self.error = error
        self.seconds = seconds
        self.gate = gate
        self.remaining = times


@final
class FaultyStore(BaseStore):
    """Wrap *inner* and fire faults at named points (thread-safe).

    Attributes:
        calls: every operation called, in order (for example ``"save"``).
    """

    def __init__(self, inner: WorkflowStore) -> None:
        """Wrap *inner*; no faults are armed yet."""
        self.inner = inner
        self.max_concurrency = inner.max_concurrency
        self.calls: list[str] = []
        self._faults: dict[str, list[_Fault]] = {}
        self._lock = threading.Lock()

    # --- arming -----------------------------------------------------------------------

    def fail(
        self, point: str, error: BaseException | None = None, *, times: int | None = 1
    ) -> Self:
        """Raise *error* (default ``OSError("injected fault at <point>")``) at *point*.

        Args:
            point: for example ``"save.before"`` or ``"save.after"``.
            error: the exception to raise.
            times: how many times (``None``: every time).
        """
        fault = _Fault(
            error=error or OSError(f"injected fault at {point}"), times=times
        )
        return self._arm(point, fault)

    def delay(self, point: str, seconds: float, *, times: int | None = 1) -> Self:
        """Sleep *seconds* at *point*."""
        return self._arm(point, _Fault(seconds=seconds, times=times))

    def block(self, point: str, *, times: int | None = 1) -> threading.Event:
        """Block at *point* until the returned event is set (at most 30 s)."""
        gate = threading.Event()
        self._arm(point, _Fault(gate=gate, times=times))
        return gate

    def clear(self) -> None:
        """Disarm every fault."""
        with self._lock:
            self._faults.clear()

    def _arm(self, point: str, fault: _Fault) -> Self:
        with self._lock:
            self._faults.setdefault(point, []).append(fault)
        return self

    def _fire(self, point: str) -> None:
        with self._lock:
            queue = self._faults.get(point)
            if not queue:
                return
            fault = queue[0]
            if fault.remaining is not None:
                fault.remaining -= 1
                if fault.remaining <= 0:
                    queue.pop(0)
        if fault.gate is not None:
            fault.gate.wait(30)
        if fault.seconds:
            time.sleep(fault.seconds)
        if fault.error is not None:
            raise fault.error

    def _record(self, operation: str) -> None:
        with self._lock:
            self.calls.append(operation)

    def count(self, operation: str) -> int:
        """How many times *operation* was called."""
        with self._lock:
            return self.calls.count(operation)

    # --- the store contract -------------------------------------------------------------

    @property
    def identity(self) -> str:
        """The wrapped store's identity (the same database)."""
        return self.inner.identity

    def open(self) -> None:
        """Fire ``open.before``, then open the wrapped store."""
        self._record("open")
        self._fire("open.before")
        self.inner.open()

    def load(self, workflow_instance_id: str) -> StoredRecord | None:
        """See :meth:`~phronomy.storage.WorkflowStore.load`."""
        self._record("load")
        self._fire("load.before")
        result = self.inner.load(workflow_instance_id)
        self._fire("load.after")
        return result

    def begin(
        self,
        workflow_instance_id: str,
        workflow: str,
        *,
        expected_revision: int | None = None,
    ) -> bool:
        """See :meth:`~phronomy.storage.WorkflowStore.begin`."""
        self._record("begin")
        self._fire("begin.before")
        result = self.inner.begin(
            workflow_instance_id, workflow, expected_revision=expected_revision
        )
        self._fire("begin.after")
        return result

    def save(self, request: SaveRequest) -> int:
        """See :meth:`~phronomy.storage.WorkflowStore.save`."""
        self._record("save")
        self._fire("save.before")
        revision = self.inner.save(request)
        self._fire("save.after")
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
        self._record("mark")
        self._fire("mark.before")
        result = self.inner.mark(
            workflow_instance_id,
            status,
            expected_revision=expected_revision,
            detail=detail,
            create=create,
            workflow=workflow,
        )
        self._fire("mark.after")
        return result

    def delete(self, workflow_instance_id: str, expected_revision: int) -> None:
        """See :meth:`~phronomy.storage.WorkflowStore.delete`."""
        self._record("delete")
        self._fire("delete.before")
        self.inner.delete(workflow_instance_id, expected_revision)
        self._fire("delete.after")

    def find_write(self, workflow_instance_id: str, write_id: str) -> int | None:
        """See :meth:`~phronomy.storage.WorkflowStore.find_write`."""
        self._record("find_write")
        self._fire("find_write.before")
        return self.inner.find_write(workflow_instance_id, write_id)

    def list_instances(
        self,
        *,
        status: InstanceStatus | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> InstancePage:
        """See :meth:`~phronomy.storage.WorkflowStore.list_instances`."""
        self._record("list_instances")
        return self.inner.list_instances(status=status, limit=limit, after=after)

    def reconcile(self, request: SaveRequest, error: BaseException) -> SaveOutcome:
        """Fire ``readback.before``, then reconcile like any store."""
        self._record("reconcile")
        try:
            self._fire("readback.before")
        except Exception as read_error:  # noqa: BLE001 - a failing read-back is the test
            return SaveOutcome(outcome="outcome_unknown", error=read_error)
        return super().reconcile(request, error)

    def fence(self) -> None:
        """Delegate to the inner store."""
        fence = getattr(self.inner, "fence", None)
        if fence is not None:
            fence()

    def close(self) -> None:
        """Close the inner store."""
        self.inner.close()
