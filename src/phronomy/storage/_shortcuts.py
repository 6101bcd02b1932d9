"""One operation at a time: the blocking conveniences of a store (operators, tests)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from phronomy.errors import InvalidInputError

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

if TYPE_CHECKING:
    from collections.abc import Sequence

    import outcome

    from ._ops import StoreOp
    from ._records import (
        InstancePage,
        InstanceStatus,
        SaveLogEntry,
        SaveOutcome,
        SaveRequest,
        StoredRecord,
    )

__all__ = ["MAX_LIMIT", "OneAtATime", "check_limit"]

MAX_LIMIT = 10_000
"""The most rows one :meth:`~OneAtATime.list_instances` page or history may ask for."""


def check_limit(limit: object) -> int:
    """*limit* if it is a whole number from 1 to :data:`~phronomy.storage.MAX_LIMIT`.

    Raises:
        InvalidInputError: it is not an ``int`` (``bool`` included), or out of range.
    """
    if not isinstance(limit, int) or isinstance(limit, bool):
        raise InvalidInputError(
            f"limit must be an int, got {type(limit).__name__} {limit!r}"
        )
    if limit < 1:
        raise InvalidInputError(f"limit must be >= 1, got {limit}")
    if limit > MAX_LIMIT:
        raise InvalidInputError(f"limit must be <= {MAX_LIMIT}, got {limit}")
    return limit


class OneAtATime:
    """Blocking shortcuts over :meth:`execute`, one operation per call.

    The runtime never uses them (it batches); operators' tools and tests do.
    """

    def execute(self, ops: Sequence[StoreOp]) -> list[outcome.Outcome[Any]]:
        """Run a batch of operations (implemented by the store)."""
        raise NotImplementedError

    def run(self, op: StoreOp) -> Any:
        """Run one operation and return its result (or raise its error)."""
        return self.execute([op])[0].unwrap()

    def load(self, workflow_instance_id: str) -> StoredRecord | None:
        """The row of *workflow_instance_id*, or ``None``."""
        record: StoredRecord | None = self.run(
            LoadOp(workflow_instance_id=workflow_instance_id)
        )
        return record

    def list_instances(
        self,
        *,
        status: InstanceStatus | None = None,
        workflow: str | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> InstancePage:
        """One page of rows (without snapshots), ordered by id.

        Args:
            status: only instances with this status.
            workflow: only instances of this workflow.
            limit: at most this many rows (1 to :data:`~phronomy.storage.MAX_LIMIT`).
            after: start after this instance id (the previous page's ``next_after``).

        Raises:
            InvalidInputError: *limit* is not an int from 1 to :data:`~phronomy.storage.MAX_LIMIT`.
        """
        op = ListOp(
            status=status, workflow=workflow, limit=check_limit(limit), after=after
        )
        page: InstancePage = self.run(op)
        return page

    def history(
        self, workflow_instance_id: str, *, limit: int = 100
    ) -> list[SaveLogEntry]:
        """The last saves of an instance, newest first (the store keeps a few).

        Args:
            workflow_instance_id: the instance.
            limit: at most this many saves (1 to :data:`~phronomy.storage.MAX_LIMIT`).

        Raises:
            InvalidInputError: *limit* is not an int from 1 to :data:`~phronomy.storage.MAX_LIMIT`.
        """
        entries: list[SaveLogEntry] = self.run(
            HistoryOp(
                workflow_instance_id=workflow_instance_id, limit=check_limit(limit)
            )
        )
        return entries

    def find_write(self, workflow_instance_id: str, write_id: str) -> int | None:
        """The revision the save *write_id* committed, or ``None``."""
        revision: int | None = self.run(
            FindWriteOp(workflow_instance_id=workflow_instance_id, write_id=write_id)
        )
        return revision

    def save_classified(self, request: SaveRequest) -> SaveOutcome:
        """Save and classify the result; never raises for store errors."""
        result: SaveOutcome = self.run(SaveOp(request=request))
        return result

    def save(self, request: SaveRequest) -> int:
        """Save and return the new revision.

        Raises:
            ConflictError: the revision check failed.
            Exception: the error of a failed save, or of one whose outcome is unknown.
        """
        result = self.save_classified(request)
        if result.outcome != "success" or result.revision is None:
            assert result.error is not None
            raise result.error
        return result.revision

    def begin(
        self,
        workflow_instance_id: str,
        workflow: str,
        *,
        expected_revision: int | None = None,
        lease_owner: str | None = None,
        ttl_ms: int = 0,
    ) -> int | None:
        """See :class:`~phronomy.storage.BeginOp`: the new epoch, or ``None``."""
        epoch: int | None = self.run(
            BeginOp(
                workflow_instance_id=workflow_instance_id,
                workflow=workflow,
                expected_revision=expected_revision,
                lease_owner=lease_owner,
                ttl_ms=ttl_ms,
            )
        )
        return epoch

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
        """See :class:`~phronomy.storage.MarkOp`."""
        changed: bool = self.run(
            MarkOp(
                workflow_instance_id=workflow_instance_id,
                status=status,
                expected_revision=expected_revision,
                detail=detail,
                create=create,
                workflow=workflow,
            )
        )
        return changed

    def delete(self, workflow_instance_id: str, expected_revision: int) -> None:
        """See :class:`~phronomy.storage.DeleteOp`."""
        self.run(
            DeleteOp(
                workflow_instance_id=workflow_instance_id,
                expected_revision=expected_revision,
            )
        )
