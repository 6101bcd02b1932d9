"""A batch's operations: the order of the rows they lock, and their outcomes when
its transaction failed (fenced, not written, unknown) or when it read rows."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Literal

import outcome

from ._inbox import Claimed
from ._ops import PostOp, SaveOp
from ._quarantine import any_quarantined, note_unknown, settle
from ._records import InstancePage, SaveOutcome, StoredRecord

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from ._ops import StoreOp
    from ._records import SaveRequest

__all__ = [
    "Verdict",
    "fenced",
    "instance_of",
    "not_written",
    "row_order",
    "settle_rows",
    "unknown",
]

logger = logging.getLogger(__name__)

Verdict = Literal["committed", "aborted", "unsettled"] | None
"""What became of a failed write transaction: the backend knows it committed or
aborted, cannot tell once it can no longer commit (``None``: read back), or could not
make sure it can no longer commit (``unsettled``)."""


def row_order(ops: Sequence[StoreOp]) -> list[int]:
    """A write batch's operations in the order of the rows they lock: by instance id
    (each instance's operations in the batch's order), then those of many rows.

    When every transaction locks rows in one order, no two can wait for each other.
    """

    def key(index: int) -> tuple[int, str]:
        iid = instance_of(ops[index])
        return (1, "") if iid is None else (0, iid)

    return sorted(range(len(ops)), key=key)


def instance_of(op: StoreOp) -> str | None:
    """The instance whose rows *op* locks, or ``None`` (an operation of many rows)."""
    of: object = op
    if isinstance(op, SaveOp):
        of = op.request
    elif isinstance(op, PostOp):
        of = op.posting
    iid = getattr(of, "workflow_instance_id", None)
    return iid if isinstance(iid, str) else None


def not_written(op: StoreOp, error: Exception) -> outcome.Outcome[Any]:
    """The outcome of an operation whose transaction never began or aborted."""
    if isinstance(op, SaveOp):
        return outcome.Value(SaveOutcome(outcome="known_failure", error=error))
    return outcome.Error(error)


def fenced(fence: Callable[[], Verdict]) -> Verdict:
    """What became of a write transaction that failed once it had begun: fenced
    (:meth:`BaseStore.fence`) so that it can no longer commit, then the backend's
    verdict; ``unsettled`` if the fence failed."""
    try:
        return fence()
    except Exception as exc:  # noqa: BLE001 - it may still commit: nothing is read
        logger.warning("could not settle a failed write transaction: %r", exc)
        return "unsettled"


def unknown(identity: str, request: SaveRequest, error: BaseException) -> SaveOutcome:
    """``outcome_unknown``; the lease epoch of the save is noted, so that the
    instance's quarantine ends once another runtime settled it."""
    if request.lease is not None:
        note_unknown(identity, request.workflow_instance_id, request.lease.epoch)
    return SaveOutcome(outcome="outcome_unknown", error=error)


def settle_rows(identity: str, results: list[outcome.Outcome[Any]]) -> None:
    """Lift the quarantine of every row read that another runtime settled."""
    if not any_quarantined():  # the common case: no row of the batch is looked at
        return
    for result in results:
        if not isinstance(result, outcome.Value):
            continue
        value = result.value
        if isinstance(value, Claimed):
            value = value.row
        rows = value.records if isinstance(value, InstancePage) else (value,)
        for row in rows:
            if isinstance(row, StoredRecord):
                settle(identity, row)
