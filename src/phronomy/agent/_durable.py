"""The durable side of supervised executions: their records in the store.

Every write goes through the runtime's durability service (batched, group-committed,
reconciled); results come back to the coordinator as messages on the dispatcher.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, final

from phronomy.durability import mark_op
from phronomy.storage import LoadOp, SaveOp, check_not_quarantined, quarantine

from ._messages import ExecutionEntry, ExecutionRecord
from ._records import (
    RESOLVE_HINT,
    agent_key,
    decode_record,
    record_request,
    startable_revision,
    terminal_record,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    import outcome

    from phronomy.durability import DurabilityService
    from phronomy.storage import StoredRecord

__all__ = ["ExecutionRecords"]


@final
class ExecutionRecords:
    """Reads and writes the one record each agent key has in the store."""

    def __init__(self, service: DurabilityService) -> None:
        """Write through *service*."""
        self.service = service

    def load(self, agent_id: str, back: Callable[[outcome.Outcome[Any]], None]) -> None:
        """Read the key's record; *back* gets ``(row, ExecutionRecord | None)``."""
        self.service.submit(
            LoadOp(workflow_instance_id=agent_key(agent_id)), back, finish=decode_record
        )

    def write_active(
        self,
        agent_id: str,
        execution_id: str,
        row: StoredRecord | None,
        current: ExecutionRecord | None,
        back: Callable[[outcome.Outcome[Any]], None],
    ) -> None:
        """Write the ``active`` record of a new execution over what was loaded.

        Raises:
            RecoveryRequiredError: the key is quarantined or its record requires
                recovery (nothing is written).
            BusyError: the stored record says another execution is active.
        """
        check_not_quarantined(self.service.store.identity, agent_key(agent_id))
        request = record_request(
            agent_id,
            ExecutionRecord(execution_id=execution_id, status="active"),
            startable_revision(agent_id, row, current),
        )
        self.service.submit(SaveOp(request=request), back)

    def write_terminal(
        self, entry: ExecutionEntry, back: Callable[[outcome.Outcome[Any]], None]
    ) -> None:
        """Write the record *entry* ends with (its terminal outcome).

        Raises:
            SerializationError: the record cannot be encoded (nothing is written).
        """
        assert entry.durable_revision is not None
        record = terminal_record(entry.execution_id, entry.terminal, entry.index)
        request = record_request(entry.agent_id, record, entry.durable_revision)
        self.service.submit(SaveOp(request=request), back)

    def mark_recovery_required(
        self, agent_id: str, error: BaseException | None
    ) -> None:
        """Refuse the key in every runtime on this store until it is resolved."""
        key = agent_key(agent_id)
        detail = f"the outcome of a write is unknown: {error!r}"
        quarantine(self.service.store.identity, key, detail)
        self.service.submit_quietly(
            mark_op(key, "recovery_required", expected_revision=None, detail=detail),
            f"mark agent {agent_id!r} recovery_required",
        )

    def close_cut_off(self, entry: ExecutionEntry, quiescent: bool) -> str:
        """The runtime shuts down with *entry* live: close its record if that is honest.

        Returns:
            What happened to the record, as a sentence for the caller's error.
        """
        if entry.durable_revision is None:
            return ""
        if not quiescent or entry.status == "recovery_required":
            return (
                " Its durable record stays active (work it started was still running, "
                "or its outcome is unknown): runtime.executions.stale() lists it and "
                + RESOLVE_HINT.format(agent=entry.agent_id)
                + " releases it."
            )
        record = ExecutionRecord(
            execution_id=entry.execution_id,
            status="abandoned",
            steps_completed=entry.index,
            error=f"cut off when the runtime shut down ({entry.status})",
        )
        self.service.submit_quietly(
            SaveOp(
                request=record_request(entry.agent_id, record, entry.durable_revision)
            ),
            f"close the record of execution {entry.execution_id!r} as abandoned",
        )
        return " Its durable record is closed as abandoned, so the key can start again."
