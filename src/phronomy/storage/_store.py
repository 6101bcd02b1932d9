"""The workflow store contract, and the classification of uncertain saves."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Literal, Protocol, Self, runtime_checkable

import outcome

from phronomy.errors import (
    ConflictError,
    InstanceStateError,
    NotFoundError,
    RecoveryRequiredError,
    SerializationError,
    StorageError,
    UnsupportedBackendError,
)

from ._quarantine import quarantined
from ._records import (
    BeginOp,
    DeleteOp,
    InstancePage,
    InstanceStatus,
    ListOp,
    LoadOp,
    MarkOp,
    SaveOp,
    SaveOutcome,
    SaveRequest,
    StoredRecord,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._records import StoreOp

__all__ = [
    "KNOWN_FAILURES",
    "SAVE_LOG_DEPTH",
    "BaseStore",
    "WorkflowStore",
    "check_not_quarantined",
    "check_startable",
    "classify_uncertain_save",
]

logger = logging.getLogger(__name__)

KNOWN_FAILURES: tuple[type[StorageError], ...] = (
    ConflictError,
    NotFoundError,
    SerializationError,
    UnsupportedBackendError,
)
"""Save errors that prove nothing was written; no read-back is needed (spec §4.6)."""


@runtime_checkable
class WorkflowStore(Protocol):
    """What the runtime needs from a durable store. All methods block; the runtime calls
    them from worker threads: writes at most ``max_concurrency`` at a time, and reads
    (:meth:`load`, :meth:`find_write`, :meth:`list_instances`) from one more thread,
    concurrently with the writes. A read sees only committed data.

    Revisions: a save with ``expected_revision=None`` creates revision 1 (also over a
    revision-0 placeholder written by :meth:`begin`); a save with ``expected_revision=N`` on revision N
    creates N+1; anything else raises :class:`~phronomy.ConflictError`. Connection loss
    is never reported as a conflict.
    """

    max_concurrency: int

    @property
    def identity(self) -> str:
        """The name of the database (the same for two store objects on the same data)."""
        ...

    def open(self) -> None:
        """Open the store and check that it can be used (the runtime calls it first).

        Raises:
            StoreUnavailableError: the store cannot be used (the message says why).
        """
        ...

    def load(self, workflow_instance_id: str) -> StoredRecord | None:
        """Return the row, or ``None`` if there is none."""
        ...

    def begin(
        self,
        workflow_instance_id: str,
        workflow: str,
        *,
        expected_revision: int | None = None,
    ) -> bool:
        """Mark the instance ``running`` if it is still at *expected_revision*.

        Creates a revision-0 placeholder when there is no row. Returns whether a row was
        marked (``False`` if the row moved on or requires recovery).
        """
        ...

    def save(self, request: SaveRequest) -> int:
        """Save a snapshot; returns the new revision (revision-checked, see above)."""
        ...

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
        """Set the status (metadata only); returns whether a row changed.

        A row is changed only while it is at *expected_revision* (any revision if
        ``None``). With *create*, a missing row becomes a revision-0 placeholder of
        *workflow* with this status.
        """
        ...

    def delete(self, workflow_instance_id: str, expected_revision: int) -> None:
        """Delete the row at *expected_revision* (``ConflictError`` otherwise)."""
        ...

    def find_write(self, workflow_instance_id: str, write_id: str) -> int | None:
        """The revision the save *write_id* committed, or ``None`` if it never did.

        Stores remember at least the last :data:`SAVE_LOG_DEPTH` saves of an instance;
        an older one may be reported as ``None`` (reconciliation then fails closed).
        """
        ...

    def list_instances(
        self,
        *,
        status: InstanceStatus | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> InstancePage:
        """List rows (without snapshots) ordered by instance id, optionally by status."""
        ...

    def execute(self, ops: Sequence[StoreOp]) -> list[outcome.Outcome[Any]]:
        """Run a batch (group commit); one outcome per op, in order."""
        ...

    def reconcile(self, request: SaveRequest, error: BaseException) -> SaveOutcome:
        """Classify a save that raised *error* with an unknown commit outcome."""
        ...

    def close(self) -> None:
        """Release connections (the store may be reopened by the next call)."""
        ...


SAVE_LOG_DEPTH = 32
"""How many recent saves per instance a store remembers for :meth:`find_write`."""


def classify_uncertain_save(
    record: StoredRecord | None, logged_revision: int | None, request: SaveRequest
) -> Literal["post", "pre", "neither"]:
    """Decide what an uncertain save did, from state read after it can no longer commit.

    ``post``: the save's ``write_id`` is logged or on the row. ``pre``: it is not, and the
    row is still at the expected revision. ``neither``: something else changed the row.
    """
    if logged_revision is not None:
        return "post"
    if record is not None and record.write_id == request.write_id:
        return "post"
    current = 0 if record is None else record.revision
    expected = request.expected_revision or 0
    return "pre" if current == expected else "neither"


def check_startable(row: StoredRecord, workflow: str) -> None:
    """Raise if a new segment of *workflow* may not run on *row*.

    Raises:
        RecoveryRequiredError: the instance requires recovery (fail-closed across
            processes; see also :func:`check_not_quarantined`).
        InstanceStateError: the instance belongs to another workflow.
    """
    if row.status == "recovery_required":
        raise RecoveryRequiredError(
            f"workflow instance {row.workflow_instance_id!r} requires recovery "
            f"({row.detail or 'a save outcome is unknown'}); resolve it first",
            instance_id=row.workflow_instance_id,
        )
    if row.workflow and workflow and row.workflow != workflow:
        raise InstanceStateError(
            f"workflow instance {row.workflow_instance_id!r} belongs to workflow "
            f"{row.workflow!r}, not {workflow!r}"
        )


def check_not_quarantined(identity: str, instance_id: str) -> None:
    """Raise if this process saw an unresolved unknown outcome of *instance_id*.

    Raises:
        RecoveryRequiredError: the instance requires recovery.
    """
    reason = quarantined(identity, instance_id)
    if reason is not None:
        raise RecoveryRequiredError(
            f"{instance_id!r} requires recovery ({reason}); resolve it first "
            "(runtime.recovery.resolve, or `python -m phronomy instances resolve`)",
            instance_id=instance_id,
        )


class BaseStore:
    """Shared behaviour of stores: the batch loop and the reconciliation of uncertain saves.

    Subclasses implement the single-operation methods of :class:`WorkflowStore`; they
    may override :meth:`execute` for real group commit and :meth:`fence` to make sure a
    failed transaction can no longer commit before :meth:`reconcile` reads.
    """

    max_concurrency = 1

    @property
    def identity(self) -> str:
        """See :attr:`~phronomy.storage.WorkflowStore.identity` (this object)."""
        return f"{type(self).__name__}:{id(self):x}"

    def open(self) -> None:
        """See :meth:`~phronomy.storage.WorkflowStore.open` (nothing to check here)."""

    # --- to implement --------------------------------------------------------------

    def load(self, workflow_instance_id: str) -> StoredRecord | None:
        """See :meth:`~phronomy.storage.WorkflowStore.load`."""
        raise NotImplementedError

    def begin(
        self,
        workflow_instance_id: str,
        workflow: str,
        *,
        expected_revision: int | None = None,
    ) -> bool:
        """See :meth:`~phronomy.storage.WorkflowStore.begin`."""
        raise NotImplementedError

    def save(self, request: SaveRequest) -> int:
        """See :meth:`~phronomy.storage.WorkflowStore.save`."""
        raise NotImplementedError

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
        raise NotImplementedError

    def delete(self, workflow_instance_id: str, expected_revision: int) -> None:
        """See :meth:`~phronomy.storage.WorkflowStore.delete`."""
        raise NotImplementedError

    def find_write(self, workflow_instance_id: str, write_id: str) -> int | None:
        """See :meth:`~phronomy.storage.WorkflowStore.find_write`."""
        raise NotImplementedError

    def list_instances(
        self,
        *,
        status: InstanceStatus | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> InstancePage:
        """See :meth:`~phronomy.storage.WorkflowStore.list_instances`."""
        raise NotImplementedError

    def close(self) -> None:
        """See :meth:`~phronomy.storage.WorkflowStore.close`."""

    def __enter__(self) -> Self:
        """Use the store in a ``with`` block that closes it at the end."""
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Close the store."""
        self.close()

    def fence(self) -> None:
        """Make sure no earlier failed transaction of this store can still commit."""

    # --- shared ----------------------------------------------------------------------

    def save_classified(self, request: SaveRequest) -> SaveOutcome:
        """Save and classify the result (spec §4.7); never raises for store errors."""
        try:
            revision = self.save(request)
        except KNOWN_FAILURES as exc:
            return SaveOutcome(outcome="known_failure", error=exc)
        except Exception as exc:  # noqa: BLE001 - the commit outcome is unknown
            return self.reconcile(request, exc)
        return SaveOutcome(outcome="success", revision=revision)

    def reconcile(self, request: SaveRequest, error: BaseException) -> SaveOutcome:
        """Classify an uncertain save once it can no longer commit; never saves again.

        Returns:
            ``success`` with the logged revision (post-state), ``known_failure`` with
            the original *error* (pre-state), or ``outcome_unknown`` (neither, or the
            read-back failed).
        """
        iid = request.workflow_instance_id
        try:
            self.fence()
            record = self.load(iid)
            logged = self.find_write(iid, request.write_id)
        except Exception as read_error:  # noqa: BLE001 - reported as the unknown outcome
            logger.warning("reconciliation read of %r failed: %r", iid, read_error)
            return SaveOutcome(outcome="outcome_unknown", error=read_error)
        verdict = classify_uncertain_save(record, logged, request)
        if verdict == "post":
            revision = (
                logged if logged is not None else (record.revision if record else None)
            )
            logger.info(
                "uncertain save of %r had committed (revision %s)", iid, revision
            )
            return SaveOutcome(outcome="success", revision=revision)
        if verdict == "pre":
            return SaveOutcome(outcome="known_failure", error=error)
        conflict = ConflictError(
            "Workflow terminal Persistence outcome conflicts with both expected pre-state "
            f"and intended post-state for workflow instance {iid!r} (expected revision "
            f"{request.expected_revision}, found {record.revision if record else None})"
        )
        conflict.__cause__ = error
        return SaveOutcome(outcome="outcome_unknown", error=conflict)

    def execute(self, ops: Sequence[StoreOp]) -> list[outcome.Outcome[Any]]:
        """Run each operation on its own (stores with group commit override this)."""
        return [outcome.capture(self._run_op, op) for op in ops]

    def _run_op(self, op: StoreOp) -> Any:
        match op:
            case LoadOp(workflow_instance_id=iid):
                return self.load(iid)
            case ListOp(status=status, limit=limit, after=after):
                return self.list_instances(status=status, limit=limit, after=after)
            case BeginOp(workflow_instance_id=iid, workflow=workflow):
                return self.begin(iid, workflow, expected_revision=op.expected_revision)
            case SaveOp(request=request):
                return self.save_classified(request)
            case MarkOp():
                return self.mark(
                    op.workflow_instance_id,
                    op.status,
                    expected_revision=op.expected_revision,
                    detail=op.detail,
                    create=op.create,
                    workflow=op.workflow,
                )
            case DeleteOp(workflow_instance_id=iid, expected_revision=revision):
                self.delete(iid, revision)
                return None
        raise TypeError(f"unknown store operation {op!r}")  # pragma: no cover
