"""The store contract written once: batches, fault points, reconciliation, one-op helpers."""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar

import msgspec
import outcome

from phronomy.errors import ConflictError

from ._batch import Verdict, fenced, not_written, row_order, settle_rows, unknown
from ._claiming import Claim, claim_and_post, inbox_of, load_and_claim
from ._clock import wall_ms
from ._inbox import Claimed, InboxEntry
from ._lanes import Lane, lane_of
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
from ._records import SaveOutcome, StoredRecord
from ._shortcuts import OneAtATime
from ._store import KNOWN_FAILURES, classify_uncertain_save, conflict_error

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from ._ops import StoreOp
    from ._records import SaveLogEntry, SaveRequest

__all__ = ["BaseStore", "Verdict", "applied", "refused", "row_order", "write_op"]

logger = logging.getLogger(__name__)

C = TypeVar("C")
T = TypeVar("T")

_stores = itertools.count(1)
"""Numbers the store objects of the process (their default identities)."""


class BaseStore(OneAtATime, Generic[C]):
    """A store: the batch logic of the contract around one backend ``apply``.

    A backend implements ``_reading`` (a connection that sees committed data, the
    block in one read transaction: its reads see one snapshot of the store),
    ``_writing`` (one transaction on the ``Lane``'s connection: committed when the
    block ends, rolled back when it raises), ``_read_errors`` (its errors as store
    errors, around each read) and :meth:`apply` (one operation on that connection), and
    may override :meth:`open`, :meth:`close`, :meth:`fence`, ``_claim``, ``_writes``
    (a batch's writes: PostgreSQL pipelines them), ``_reconnected`` and
    :attr:`identity`.

    :meth:`execute` runs a batch: reads on the read connection, in one snapshot (none
    sees what committed after the first one read); writes in one transaction, where a
    conflict fails only its own operation; the writes run in the order of the rows
    they lock (``row_order``: by instance id, each instance's in the batch's order,
    then those of many rows), the same on every backend, so no two transactions wait
    for each other, and results come back in the batch's order. A batch of renewals
    only runs on the ``renew`` lane. If the transaction fails before it began, nothing
    was written (on a connection found broken, it is run once more on a new one, and
    so is a batch of reads). If it fails later, or an error arrives after its commit,
    its outcome is unknown until it is fenced (:meth:`fence`): the fence's verdict
    decides when it has one (committed: what each operation did; aborted: nothing was
    written), else each save is classified on its own from what is read back (retried
    on a fresh connection), each claim likewise; every other write fails with the
    error.

    Every row a batch reads (or a claim returns) lifts the process's quarantine of
    its instance if another runtime settled it since (a newer lease epoch).

    Fault points (``fault_hook(name)`` may raise or delay, for tests):
    ``<op>.before`` (nothing of the operation ran; for a write, the whole transaction
    is abandoned), ``<op>.applied`` (it ran, not committed), ``commit.before``,
    ``commit.after`` (the batch committed, then an error), ``<op>.after`` (likewise, for
    one operation), ``readback.before`` (the reconciliation read), ``open.before``.
    ``<op>`` is the operation's name: ``load``, ``list``, ``history``, ``find_write``,
    ``begin``, ``claim``, ``save``, ``mark``, ``delete``, ``renew``, ``recover``,
    ``request_cancel``.
    """

    max_concurrency = 1
    readback_delays: tuple[float, ...] = (0.05, 0.2, 1.0)
    """Seconds before each further attempt of a reconciliation read."""

    def __init__(
        self,
        *,
        fault_hook: Callable[[str], None] | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        """Set the test hook called at each fault point (see the class docstring) and
        the store's wall clock in milliseconds (default: the host's)."""
        self.fault_hook = fault_hook
        self.wall_now_ms: Callable[[], int] = clock or wall_ms
        """The store's wall clock in ms (a server's statements read its own)."""
        # unique for the life of the process (an id() is reused once its object is gone)
        self._object_identity = f"{type(self).__name__}:{next(_stores)}"

    # --- the backend ---------------------------------------------------------------

    def _reading(self) -> contextlib.AbstractContextManager[C]:
        raise NotImplementedError

    def _writing(self, lane: Lane = "write") -> contextlib.AbstractContextManager[C]:
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

    def fence(self) -> Verdict:
        """Make sure no earlier failed transaction of this store can still commit.

        Returns:
            ``"committed"`` or ``"aborted"`` when the backend knows what became of it,
            else ``None``.

        Raises:
            StoreUnavailableError: it cannot be made sure (it may still commit).
        """
        return None

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
            values: list[outcome.Outcome[Any]] = []
            for attempt in range(2):  # reads change nothing: again on a new connection
                try:
                    with self._reading() as conn:  # one snapshot
                        values = [outcome.capture(self._read, conn, op) for op in ops]
                except Exception as exc:  # the snapshot's begin or end: as its reads'
                    if attempt or not self._reconnected(exc):
                        raise
                    continue
                errors = (v.error for v in values if isinstance(v, outcome.Error))
                if not any(self._reconnected(error) for error in errors):
                    break
            settle_rows(self.identity, values)
            return values
        lane = lane_of(ops)
        done = self._transaction(ops, lane)
        if isinstance(done, Exception) and self._reconnected(done):
            done = self._transaction(ops, lane)  # nothing was sent: once more
        if isinstance(done, Exception):  # it never began: nothing was written
            return [not_written(op, done) for op in ops]
        if self.fault_hook is not None:  # (no point's name is built without one)
            for i, op in enumerate(ops):
                try:
                    self._hook(f"{op_name(op)}.after")
                except Exception as exc:  # noqa: BLE001 - it landed, but its caller hears an error
                    done[i] = self._uncertain(op, exc, done[i], None)
        settle_rows(self.identity, done)
        return done

    def _transaction(
        self, ops: Sequence[StoreOp], lane: Lane
    ) -> list[outcome.Outcome[Any]] | Exception:
        """Run a write batch in one transaction: each operation's outcome, or the
        error that kept the transaction from beginning (nothing was sent)."""
        results: list[outcome.Outcome[Any] | None] = [None] * len(ops)
        started = False
        try:
            with self._writing(lane) as conn:
                started = True
                self._writes(conn, ops, results)
                self._hook("commit.before")
            self._hook("commit.after")
        except Exception as exc:  # noqa: BLE001 - the transaction's outcome is unknown
            if not started:
                return exc
            verdict = fenced(self.fence)
            return [
                self._uncertain(op, exc, results[i], verdict)
                for i, op in enumerate(ops)
            ]
        return [r for r in results if r is not None]

    def _reconnected(self, error: BaseException) -> bool:
        """Whether *error* came from a connection found broken, which the next call
        replaces (backend; by default never)."""
        return False

    def _read(self, conn: C, op: StoreOp) -> Any:
        hook = self.fault_hook
        if hook is not None:
            hook(f"{op_name(op)}.before")
        with self._read_errors():  # captured per operation: translated here
            value = self.apply(conn, op)
        if hook is not None:
            hook(f"{op_name(op)}.after")
        return value

    def _writes(
        self,
        conn: C,
        ops: Sequence[StoreOp],
        results: list[outcome.Outcome[Any] | None],
    ) -> None:
        """Apply a write batch's operations inside its transaction, in the order of
        the rows they lock (:func:`row_order`), each outcome in *results* (backend; by
        default one operation after another, see :func:`write_op`)."""
        for i in row_order(ops):
            results[i] = write_op(
                self.apply, self._claim, self.fault_hook, conn, ops[i]
            )

    def _uncertain(
        self,
        op: StoreOp,
        error: Exception,
        result: outcome.Outcome[Any] | None,
        verdict: Verdict,
    ) -> outcome.Outcome[Any]:
        """The outcome of *op*, whose transaction failed with *error*: by the fence's
        *verdict* when it has one (*result*: what the operation did inside it), else
        read back (``None``), or unknown (``unsettled``: it may still commit)."""
        if verdict == "committed" and result is not None:
            return result  # every operation ran, and the transaction committed
        if verdict == "aborted":
            return not_written(op, error)
        claim = isinstance(op, ClaimOp) or (
            isinstance(op, BeginOp) and op.lease_owner is not None
        )
        if isinstance(op, SaveOp):
            if verdict == "unsettled":
                return outcome.Value(unknown(self.identity, op.request, error))
            return outcome.Value(self._classify(op.request, error))
        if claim and verdict is None:
            return self._reconcile_claim(op, error)  # type: ignore[arg-type]
        if isinstance(op, READ_OPS) and result is not None:
            return result  # a read that already completed stays valid
        return outcome.Error(error)

    def _claim(
        self, conn: C, op: ClaimOp, known: StoredRecord | None = None
    ) -> tuple[StoredRecord | None, int | None]:
        """Run a :class:`ClaimOp` without its inbox part (backend; by default a load,
        then a claim at the revision it read; *known*: the row its posting's numbering
        returned, see :func:`~phronomy.storage._claiming.load_and_claim`)."""
        return load_and_claim(self.apply, conn, op, known)

    def _reconcile_claim(
        self, op: BeginOp | ClaimOp, error: Exception
    ) -> outcome.Outcome[Any]:
        """A claim whose commit outcome is unknown (its transaction can no longer
        commit): its epoch if the row holds this owner's lease (owner tokens are unique
        to a runtime, which claims an instance once at a time), else the error (nothing
        was claimed)."""
        iid = op.workflow_instance_id

        def read(conn: C) -> tuple[StoredRecord | None, list[SaveLogEntry]]:
            row = self.apply(conn, LoadOp(workflow_instance_id=iid))
            saved = (
                self.apply(conn, HistoryOp(workflow_instance_id=iid, limit=1))
                if row is not None and row.revision
                else []
            )
            return row, saved

        try:
            self._hook("readback.before")
            row, saved = self._read_back(read)
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
        posted = None
        pending: tuple[InboxEntry, ...] = ()
        if op.post is not None or op.pending:  # the claim committed: its post too
            try:
                posted, pending = self._read_back(lambda c: inbox_of(self.apply, c, op))
            except Exception as read_error:  # noqa: BLE001 - the claim stays unknown
                logger.warning("reconciliation read of %r failed: %r", iid, read_error)
                return outcome.Error(error)
        return outcome.Value(
            Claimed(row=before, epoch=row.lease_epoch, pending=pending, posted=posted)
        )

    def reconcile(self, request: SaveRequest, error: BaseException) -> SaveOutcome:
        """Classify a save with an unknown outcome once it can no longer commit.

        Never saves again. The failed transaction is fenced first (:meth:`fence`); if
        the fence cannot tell what became of it, the row and the save log are read
        back.

        Returns:
            ``success`` with the logged revision (post-state), ``known_failure`` with
            the original *error* (pre-state, or the transaction aborted), or
            ``outcome_unknown`` (neither, or it could not be settled or read back).
        """
        verdict = fenced(self.fence)
        if verdict == "aborted":
            return SaveOutcome(outcome="known_failure", error=error)
        if verdict == "unsettled":
            return unknown(self.identity, request, error)
        return self._classify(request, error)

    def _classify(self, request: SaveRequest, error: BaseException) -> SaveOutcome:
        """Classify an uncertain save whose transaction can no longer commit, from the
        row and the save log read back."""
        iid = request.workflow_instance_id
        expected = request.expected_revision or 0

        def read(
            conn: C,
        ) -> tuple[StoredRecord | None, int | None, SaveLogEntry | None]:
            record = self.apply(conn, LoadOp(workflow_instance_id=iid))
            logged = self.apply(
                conn, FindWriteOp(workflow_instance_id=iid, write_id=request.write_id)
            )
            taken = None
            if logged is None and record is not None and record.revision > expected:
                # the row moved on: did another write produce our revision?
                back = min(record.revision - expected, 10_000)
                history = self.apply(
                    conn, HistoryOp(workflow_instance_id=iid, limit=back)
                )
                taken = next((e for e in history if e.revision == expected + 1), None)
            return record, logged, taken

        try:
            self._hook("readback.before")
            record, logged, taken = self._read_back(read)
        except Exception as read_error:  # noqa: BLE001 - reported as the unknown outcome
            logger.warning("reconciliation read of %r failed: %r", iid, read_error)
            return unknown(self.identity, request, read_error)
        verdict = classify_uncertain_save(record, logged, request)
        if verdict == "neither" and taken is not None and record is not None:
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
        if verdict == "post":  # logged, or the row carries its write id
            revision = (
                logged if logged is not None or record is None else record.revision
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
        return unknown(self.identity, request, conflict)

    def _read_back(self, read: Callable[[C], T]) -> T:
        """*read* on the read connection, tried again on a fresh one (the backend drops
        a broken connection) after each delay of :attr:`readback_delays`."""
        for delay in self.readback_delays:
            try:
                with self._reading() as conn:
                    return read(conn)
            except Exception as exc:  # noqa: BLE001 - tried again below
                logger.info("reconciliation read failed, retrying: %r", exc)
            time.sleep(delay)
        with self._reading() as conn:
            return read(conn)

    def _hook(self, point: str) -> None:
        if self.fault_hook is not None:
            self.fault_hook(point)


def write_op(
    apply: Callable[[C, StoreOp], Any],
    claim: Claim[C],
    hook: Callable[[str], None] | None,
    conn: C,
    op: StoreOp,
) -> outcome.Outcome[Any]:
    """Apply one operation inside a batch's transaction with the backend's *apply* and
    *claim* (:class:`~phronomy.storage.BaseStore`), calling the fault *hook* around it.

    A known failure (a conflict) is that operation's result; any other error
    abandons the whole transaction.
    """
    if hook is not None:  # (no point's name is built without one)
        hook(f"{op_name(op)}.before")
    value: Any
    try:
        if isinstance(op, ClaimOp):
            value = claim_and_post(apply, conn, op, claim)
        else:
            value = apply(conn, op)
    except KNOWN_FAILURES as exc:
        if hook is not None:
            hook(f"{op_name(op)}.applied")
        return refused(op, exc)
    if hook is not None:
        hook(f"{op_name(op)}.applied")
    return applied(op, value)


def applied(op: StoreOp, value: Any) -> outcome.Outcome[Any]:
    """The outcome of an operation that ran (a save's: its revision)."""
    if isinstance(op, SaveOp):
        return outcome.Value(SaveOutcome(outcome="success", revision=value))
    return outcome.Value(value)


def refused(op: StoreOp, error: Exception) -> outcome.Outcome[Any]:
    """The outcome of an operation refused with a known failure (*error*)."""
    if isinstance(op, SaveOp):
        return outcome.Value(SaveOutcome(outcome="known_failure", error=error))
    return outcome.Error(error)
