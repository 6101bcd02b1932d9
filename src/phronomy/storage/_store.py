"""The store contract, and the rules that classify what a save did."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from phronomy.errors import (
    BusyError,
    ConflictError,
    InstanceStateError,
    LeaseLostError,
    NotFoundError,
    PhronomyError,
    RecoveryRequiredError,
    SerializationError,
)

from ._quarantine import quarantined

if TYPE_CHECKING:
    from collections.abc import Sequence

    import outcome

    from ._ops import ClaimOp, StoreOp
    from ._records import Lease, SaveRequest, StoredRecord

__all__ = [
    "KNOWN_FAILURES",
    "SAVE_LOG_DEPTH",
    "WorkflowStore",
    "check_not_quarantined",
    "check_startable",
    "check_workflow",
    "claimable",
    "classify_uncertain_save",
    "conflict_error",
    "run_op",
]

KNOWN_FAILURES: tuple[type[PhronomyError], ...] = (
    BusyError,
    ConflictError,
    NotFoundError,
    SerializationError,
)
"""Errors that prove the operation wrote nothing (the batch's other operations go
on); no read-back is needed (a :class:`StoreUnavailableError` proves nothing: its
save is reconciled)."""

SAVE_LOG_DEPTH = 32
"""How many recent saves per instance a store remembers (see :class:`FindWriteOp`)."""


@runtime_checkable
class WorkflowStore(Protocol):
    """What the runtime needs from a durable store: operations, run in batches.

    All methods block; the runtime calls them from worker threads, writes at most
    ``max_concurrency`` at a time and reads from one more thread. A batch of reads
    sees committed data; a batch with writes runs in one transaction (group commit),
    each write still revision-checked on its own (see :mod:`phronomy.storage` for the
    operations). Connection loss is never reported as a conflict.

    :class:`~phronomy.storage.BaseStore` implements the batch logic once; a backend
    adds one ``apply(connection, op)``.
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

    def execute(self, ops: Sequence[StoreOp]) -> list[outcome.Outcome[Any]]:
        """Run a batch; one outcome per operation, in order.

        A batch of reads only reads one snapshot of the store: no operation of it
        sees a write that committed after its first one read (a read transaction; a
        store runs one batch at a time on its read connection), so reads of the rows
        and inboxes of one batch agree. A :class:`~phronomy.storage.SaveOp` always
        yields a classified :class:`~phronomy.storage.SaveOutcome` (its failures are
        values, not errors).
        """
        ...

    def close(self) -> None:
        """Release connections (the store reopens on the next call)."""
        ...


def conflict_error(
    workflow_instance_id: str,
    action: str,
    *,
    expected: int | None,
    lease: Lease | None,
    found: tuple[int, str | None, int] | None,
) -> ConflictError:
    """The error of a revision-checked write that changed nothing.

    Args:
        workflow_instance_id: the instance.
        action: what was refused (``"save"``, ``"delete"``).
        expected: the revision the writer expected.
        lease: the writer's lease, if any.
        found: the row's ``(revision, lease_owner, lease_epoch)``, or ``None``.

    Returns:
        :class:`~phronomy.LeaseLostError` when another runtime took over the writer's
        lease, else a :class:`~phronomy.ConflictError` that says what was found.
    """
    iid = workflow_instance_id
    if found is not None:
        _, owner, epoch = found
        if lease is not None and (owner, epoch) != (lease.owner, lease.epoch):
            return LeaseLostError(
                f"cannot {action} workflow instance {iid!r}: another runtime took it "
                f"over (lease epoch {epoch}, this runtime held epoch {lease.epoch}); "
                "this runtime no longer writes it"
            )
        if lease is None and owner is not None:
            return ConflictError(
                f"cannot {action} workflow instance {iid!r}: a runtime holds (or "
                f"held) its lease (epoch {epoch}); only a runtime that claims it may "
                "write it"
            )
    return ConflictError(
        f"cannot {action} workflow instance {iid!r}: expected revision {expected}, "
        f"the store has {found[0] if found else 'no saved revision'}"
    )


def claimable(op: ClaimOp, row: StoredRecord | None) -> bool:
    """Whether the status of *row* (``None``: no row) lets *op* claim it (a lease held
    by another runtime is checked by the claim itself)."""
    if row is None:
        return op.create
    if row.status in op.statuses:
        return True
    return op.placeholders and row.revision == 0 and row.status == "failed"


def run_op(store: WorkflowStore, op: StoreOp) -> Any:
    """Run one operation on *store* (blocking) and return its result or raise its error."""
    return store.execute([op])[0].unwrap()


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
    check_workflow(row, workflow)


def check_workflow(row: StoredRecord, workflow: str) -> None:
    """Raise if *row* belongs to another workflow than *workflow*.

    Raises:
        InstanceStateError: it does (the message names both workflows).
    """
    if row.workflow and workflow and row.workflow != workflow:
        raise InstanceStateError(
            f"workflow instance {row.workflow_instance_id!r} belongs to workflow "
            f"{row.workflow!r}, not {workflow!r} (the definition given)",
            instance_id=row.workflow_instance_id,
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
