"""The store contract written once: batches, fault points, reconciliation, one-op helpers."""

from __future__ import annotations

import contextlib
import itertools
import logging
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar

import msgspec
import outcome

from phronomy.errors import ConflictError

from ._ops import (
    READ_OPS,
    BeginOp,
    ClaimOp,
    FindWriteOp,
    HistoryOp,
    LoadOp,
    SaveOp,
    op_name,
)
from ._records import SaveOutcome
from ._shortcuts import OneAtATime
from ._store import KNOWN_FAILURES, claimable, classify_uncertain_save, conflict_error

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from ._ops import StoreOp
    from ._records import SaveLogEntry, SaveRequest, StoredRecord

__all__ = ["BaseStore"]

logger = logging.getLogger(__name__)

C = TypeVar("C")

_stores = itertools.count(1)
"""Numbers the store objects of the process (their default identities)."""


class BaseStore(OneAtATime, Generic[C]):
    """A store: the batch logic of the contract around one backend ``apply``.

    A backend implements ``_reading`` (a connection that sees committed data),
    ``_writing`` (one transaction: committed when the block ends, rolled back when it
    raises), ``_read_errors`` (its errors as store errors, around each read) and
    :meth:`apply` (one operation on that connection), and may override
    :meth:`open`, :meth:`close`, :meth:`fence` and :attr:`identity`.

    :meth:`execute` runs a batch: reads on the read connection; writes in one
    transaction, where a conflict fails only its own operation. If the transaction as a
    whole fails, or an error arrives after its commit, its outcome is unknown: each save
    in it is reconciled on its own (:meth:`reconcile`), every other write fails with
    the error.

    Fault points (``fault_hook(name)`` may raise or delay, for tests):
    ``<op>.before`` (nothing of the operation ran; for a write, the whole transaction
    is abandoned), ``<op>.applied`` (it ran, not committed), ``commit.before``,
    ``commit.after`` (the batch committed, then an error), ``<op>.after`` (likewise, for
    one operation), ``readback.before`` (the reconciliation read), ``open.before``.
    ``<op>`` is the operation's name: ``load``, ``list``, ``find_write``, ``begin``,
    ``save``, ``mark``, ``delete``.
    """

    max_concurrency = 1

    def __init__(self, *, fault_hook: Callable[[str], None] | None = None) -> None:
        """Set the test hook called at each fault point (see the class docstring)."""
        self.fault_hook = fault_hook
        # unique for the life of the process (an id() is reused once its object is gone)
        self._object_identity = f"{type(self).__name__}:{next(_stores)}"

    # --- the backend ---------------------------------------------------------------

    def _reading(self) -> contextlib.AbstractContextManager[C]:
        raise NotImplementedError

    def _writing(self) -> contextlib.AbstractContextManager[C]:
        raise NotImplementedError

    def _read_errors(self) -> contextlib.AbstractContextManager[None]:
        """Translate the driver's errors of a read (backend; by default none)."""
        return contextlib.nullcontext()

    def apply(self, conn: C, op: StoreOp) -> Any:
        """Run one operation on *conn* (backend).

        Raises:
            ConflictError: a revision precondition failed (that operation only).
        """
        raise NotImplementedError

    @property
    def identity(self) -> str:
        """See :attr:`~phronomy.storage.WorkflowStore.identity` (this object)."""
        return self._object_identity

    def open(self) -> None:
        """See :meth:`~phronomy.storage.WorkflowStore.open`."""
        self._hook("open.before")

    def close(self) -> None:
        """See :meth:`~phronomy.storage.WorkflowStore.close`."""

    def fence(self) -> None:
        """Make sure no earlier failed transaction of this store can still commit."""

    def __enter__(self) -> Self:
        """Use the store in a ``with`` block that closes it at the end."""
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Close the store."""
        self.close()

    # --- batches -------------------------------------------------------------------

    def execute(self, ops: Sequence[StoreOp]) -> list[outcome.Outcome[Any]]:
        """See :meth:`~phronomy.storage.WorkflowStore.execute`."""
        if all(isinstance(op, READ_OPS) for op in ops):
            with self._reading() as conn:
                return [outcome.capture(self._read, conn, op) for op in ops]
        results: list[outcome.Outcome[Any]] = []
        try:
            with self._writing() as conn:
                results.extend(self._write(conn, op) for op in ops)
                self._hook("commit.before")
            self._hook("commit.after")
        except Exception as exc:  # noqa: BLE001 - the transaction's outcome is unknown
            return [self._uncertain(op, exc, results, i) for i, op in enumerate(ops)]
        for i, op in enumerate(ops):
            try:
                self._hook(f"{op_name(op)}.after")
            except Exception as exc:  # noqa: BLE001 - it landed, but its caller hears an error
                results[i] = self._uncertain(op, exc, results, i)
        return results

    def _read(self, conn: C, op: StoreOp) -> Any:
        name = op_name(op)
        self._hook(f"{name}.before")
        with self._read_errors():  # captured per operation: translated here
            value = self.apply(conn, op)
        self._hook(f"{name}.after")
        return value

    def _write(self, conn: C, op: StoreOp) -> outcome.Outcome[Any]:
        """Apply one operation inside the batch's transaction.

        A known failure (a conflict) is that operation's result; any other error
        abandons the whole transaction.
        """
        name = op_name(op)
        self._hook(f"{name}.before")
        value: Any
        try:
            if isinstance(op, ClaimOp):
                value = self._claim(conn, op)
            else:
                value = self.apply(conn, op)
        except KNOWN_FAILURES as exc:
            self._hook(f"{name}.applied")
            if isinstance(op, SaveOp):
                return outcome.Value(SaveOutcome(outcome="known_failure", error=exc))
            return outcome.Error(exc)
        self._hook(f"{name}.applied")
        if isinstance(op, SaveOp):
            return outcome.Value(SaveOutcome(outcome="success", revision=value))
        return outcome.Value(value)

    def _uncertain(
        self,
        op: StoreOp,
        error: Exception,
        results: list[outcome.Outcome[Any]],
        index: int,
    ) -> outcome.Outcome[Any]:
        if isinstance(op, SaveOp):
            return outcome.Value(self.reconcile(op.request, error))
        if isinstance(op, ClaimOp) or (
            isinstance(op, BeginOp) and op.lease_owner is not None
        ):
            return self._reconcile_claim(op, error)
        if isinstance(op, READ_OPS) and index < len(results):
            return results[index]  # a read that already completed stays valid
        return outcome.Error(error)

    def _claim(self, conn: C, op: ClaimOp) -> tuple[StoredRecord | None, int | None]:
        """Run a :class:`ClaimOp`: a load, then a claim at the revision it read."""
        iid = op.workflow_instance_id
        if op.create:  # the common case, a new instance: one statement
            new = BeginOp(
                workflow_instance_id=iid,
                workflow=op.workflow,
                lease_owner=op.lease_owner,
                ttl_ms=op.ttl_ms,
                only_new=True,
            )
            created: int | None = self.apply(conn, new)
            if created is not None:
                return None, created
        row: StoredRecord | None = self.apply(conn, LoadOp(workflow_instance_id=iid))
        if not claimable(op, row):
            return row, None
        begin = BeginOp(
            workflow_instance_id=iid,
            workflow=op.workflow,
            expected_revision=row.revision
            if row is not None and row.revision
            else None,
            lease_owner=op.lease_owner,
            ttl_ms=op.ttl_ms,
        )
        epoch: int | None = self.apply(conn, begin)
        return row, epoch

    def _reconcile_claim(
        self, op: BeginOp | ClaimOp, error: Exception
    ) -> outcome.Outcome[Any]:
        """A claim whose commit outcome is unknown: its epoch if the row holds this
        owner's lease (owner tokens are unique to a runtime, which claims an instance
        once at a time), else the error (nothing was claimed)."""
        iid = op.workflow_instance_id
        try:
            self._hook("readback.before")
            self.fence()
            with self._reading() as conn:
                row = self.apply(conn, LoadOp(workflow_instance_id=iid))
                saved = (
                    self.apply(conn, HistoryOp(workflow_instance_id=iid, limit=1))
                    if row is not None and row.revision
                    else []
                )
        except Exception as read_error:  # noqa: BLE001 - the claim stays unknown
            logger.warning("reconciliation read of %r failed: %r", iid, read_error)
            return outcome.Error(error)
        expected = op.expected_revision if isinstance(op, BeginOp) else None
        if (
            row is None
            or row.lease_owner != op.lease_owner
            or row.status != "running"
            or (isinstance(op, BeginOp) and row.revision != (expected or 0))
        ):
            return outcome.Error(error)
        logger.info("uncertain claim of %r had committed", iid)
        if isinstance(op, BeginOp):
            return outcome.Value(row.lease_epoch)
        # the row as it was before the claim: its last save says its status
        before = msgspec.structs.replace(row, status=saved[0].status) if saved else None
        return outcome.Value((before, row.lease_epoch))

    def reconcile(self, request: SaveRequest, error: BaseException) -> SaveOutcome:
        """Classify a save with an unknown outcome once it can no longer commit.

        Never saves again. The failed transaction is fenced first (:meth:`fence`), then
        the row and the save log are read back.

        Returns:
            ``success`` with the logged revision (post-state), ``known_failure`` with
            the original *error* (pre-state), or ``outcome_unknown`` (neither, or the
            read-back failed).
        """
        iid = request.workflow_instance_id
        expected = request.expected_revision or 0
        taken: SaveLogEntry | None = None
        try:
            self._hook("readback.before")
            self.fence()
            with self._reading() as conn:
                record = self.apply(conn, LoadOp(workflow_instance_id=iid))
                logged = self.apply(
                    conn,
                    FindWriteOp(workflow_instance_id=iid, write_id=request.write_id),
                )
                if logged is None and record is not None and record.revision > expected:
                    # the row moved on: did another write produce our revision?
                    back = min(record.revision - expected, 10_000)
                    history = self.apply(
                        conn, HistoryOp(workflow_instance_id=iid, limit=back)
                    )
                    taken = next(
                        (e for e in history if e.revision == expected + 1), None
                    )
        except Exception as read_error:  # noqa: BLE001 - reported as the unknown outcome
            logger.warning("reconciliation read of %r failed: %r", iid, read_error)
            return SaveOutcome(outcome="outcome_unknown", error=read_error)
        verdict = classify_uncertain_save(record, logged, request)
        if verdict == "neither" and taken is not None:
            # A revision is produced by one write only: ours never committed (and,
            # fenced above, never will). Another runtime saved it: ours is refused.
            refused = conflict_error(
                iid,
                "save",
                expected=request.expected_revision,
                lease=request.lease,
                found=(record.revision, record.lease_owner, record.lease_epoch),
            )
            refused.add_note(
                f"phronomy: revision {taken.revision} was saved by another write "
                f"({taken.write_id}); this save never committed"
            )
            return SaveOutcome(outcome="known_failure", error=refused)
        if verdict == "post":
            revision = logged if logged is not None else record.revision
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

    def _hook(self, point: str) -> None:
        if self.fault_hook is not None:
            self.fault_hook(point)
