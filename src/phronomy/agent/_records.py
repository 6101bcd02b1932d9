"""Supervised executions' records: what a key's row in the store says (pure).

An execution is an instance ``agent:<agent_id>`` of its plan's generated workflow;
its :class:`~phronomy.agent.ExecutionRecord` is read from that row and its saved
:class:`~phronomy.agent.ExecutionState`. Used by ``runtime.executions`` and by the
command line alike.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any, get_args

from phronomy.errors import InstanceStateError, InvalidInputError
from phronomy.storage import (
    EXECUTION_KEY_PREFIX,
    EXECUTION_PLAN_PREFIX,
    MAX_LIMIT,
    ListOp,
    LoadOp,
    Posting,
    decode_snapshot,
    is_execution_plan,
    lease_now_ms,
)
from phronomy.workflow._inbox import encode_payload

from ._messages import ExecutionLease, ExecutionPage, ExecutionRecord, RecordStatus
from ._plan import ExecutionState, step_at

if TYPE_CHECKING:
    from collections.abc import Callable, Generator

    from phronomy.storage import StoredRecord, StoreOp

__all__ = [
    "RECORD_STATUSES",
    "agent_key",
    "answer",
    "answer_posting",
    "check_execution_row",
    "execution_record",
    "listing",
    "record_of",
    "run_listing",
    "saved_state",
]

RECORD_STATUSES: frozenset[str] = frozenset(get_args(RecordStatus))
"""The statuses a listing may filter by."""


def agent_key(agent_id: str) -> str:
    """The instance id (store key) of an agent's executions."""
    return f"{EXECUTION_KEY_PREFIX}{agent_id}"


def answer(execution_id: str, response: Any) -> dict[str, Any]:
    """The payload of an ``approve`` or ``reject`` event for *execution_id* (its
    guard refuses an answer meant for another execution of the key)."""
    return {"execution_id": execution_id, "response": response}


def answer_posting(
    agent_id: str, execution_id: str, *, approve: bool, response: Any
) -> Posting:
    """The inbox entry that answers execution *execution_id*'s approval.

    Raises:
        SerializationError: *response* is not JSON (the message names it).
    """
    key, event = agent_key(agent_id), "approve" if approve else "reject"
    return Posting(
        workflow_instance_id=key,
        event_id=str(uuid.uuid4()),
        event=event,
        payload=encode_payload(
            answer(execution_id, response), event=event, instance=key
        ),
    )


def check_execution_row(row: StoredRecord) -> None:
    """Refuse a row under an agent key that is not a supervised execution's.

    Raises:
        InstanceStateError: it belongs to a workflow (written by an older release).
    """
    if row.workflow and not is_execution_plan(row.workflow):
        raise InstanceStateError(
            f"{row.workflow_instance_id!r} is a workflow instance of {row.workflow!r}, "
            "not an execution record: executions commands leave it alone",
            instance_id=row.workflow_instance_id,
        )


def _status(row: StoredRecord, state: ExecutionState | None) -> RecordStatus:
    match row.status:
        case "recovery_required" | "cancelled" | "failed":
            return row.status
        case "running":
            return "active"
        case "halted":
            return (
                "suspended" if (row.phase or "").startswith("approval_") else "active"
            )
    if state is None or state.outcome == "deadline":
        return "cancelled"
    return "rejected" if state.outcome == "rejected" else "completed"


def saved_state(row: StoredRecord) -> ExecutionState | None:
    """The execution's state the row saved (``None`` before its first save).

    Raises:
        CorruptRecordError: the snapshot does not decode.
    """
    if row.snapshot is None:
        return None
    return decode_snapshot(
        row.snapshot,
        workflow_instance_id=row.workflow_instance_id,
        revision=row.revision,
        state_type=ExecutionState,
    ).fields


def execution_record(row: StoredRecord, *, live: bool | None = None) -> ExecutionRecord:
    """The record *row* holds (decode it in a worker thread); *live* says whether its
    lease had not expired (``None``: not judged).

    Raises:
        InstanceStateError: the row is not a supervised execution's.
        CorruptRecordError: its snapshot does not decode.
    """
    check_execution_row(row)
    state = saved_state(row)
    error = row.detail
    if state is not None and state.outcome == "deadline":
        error = "the execution passed its deadline"
    lease = None
    if row.lease_owner is not None and row.status in ("running", "recovery_required"):
        lease = ExecutionLease(
            owner=row.lease_owner,
            epoch=row.lease_epoch,
            expires_at_ms=row.lease_expires_at_ms or 0,
            live=live,
        )
    agent_id = row.workflow_instance_id.removeprefix(EXECUTION_KEY_PREFIX)
    return ExecutionRecord(
        agent_id=agent_id,
        execution_id=state.execution_id if state is not None else "",
        status=_status(row, state),
        plan=row.workflow.removeprefix(EXECUTION_PLAN_PREFIX)
        if row.workflow.startswith(EXECUTION_PLAN_PREFIX)
        else "",  # a record written before schema 7
        steps_completed=state.steps_completed if state is not None else 0,
        step=step_at(row.phase) if row.phase != "__end__" else None,
        pending_approval=state.approval_request
        if state is not None and row.status == "halted"
        else None,
        value=state.value if state is not None else None,
        error=error,
        revision=row.revision,
        updated_at_ms=row.updated_at_ms,
        lease=lease,
    )


def record_of(store: Any, row: StoredRecord | None) -> ExecutionRecord | None:
    """:func:`execution_record` of a row loaded from *store* (``None``: no row), its
    lease judged on the store's lease clock: the ``finish`` of a load on the store's
    read lane (it runs in the worker thread).

    Raises:
        StoreUnavailableError: the store's lease clock could not be read.
    """
    if row is None:
        return None
    if row.lease_owner is None:
        return execution_record(row)
    now = lease_now_ms(store)
    expires = row.lease_expires_at_ms or 0
    return execution_record(row, live=now is not None and expires > now)


def listing(
    *,
    status: RecordStatus | None,
    after: str | None,
    limit: int,
    prefix: str = "",
) -> Generator[StoreOp, Any, ExecutionPage]:
    """One page of executions, sans I/O: it yields the store reads it needs (send
    each one's result back) and returns the page.

    Executions' keys share one prefix, so the page reads only their range of the
    instance table (of agent ids starting with *prefix*), in id order, and each listed
    row for its snapshot.

    Raises:
        InvalidInputError: an unknown *status* or a bad *limit*.
    """
    if status is not None and status not in RECORD_STATUSES:
        raise InvalidInputError(
            f"status must be one of {sorted(RECORD_STATUSES)}, got {status!r}"
        )
    given: object = limit  # checked at run time: callers are not typed
    if (
        isinstance(given, bool)
        or not isinstance(given, int)
        or not 1 <= given <= MAX_LIMIT
    ):
        raise InvalidInputError(f"limit must be from 1 to {MAX_LIMIT}, got {limit!r}")
    records: list[ExecutionRecord] = []
    start = EXECUTION_KEY_PREFIX + prefix
    cursor = max(after or "", start)
    while True:
        page = yield ListOp(after=cursor, limit=500)
        for row in page.records:
            iid = row.workflow_instance_id
            if not iid.startswith(start):
                return ExecutionPage(records=tuple(records))
            full = yield LoadOp(workflow_instance_id=iid)
            if full is None or not is_execution_plan(full.workflow):
                continue
            record = execution_record(full)
            if status is None or record.status == status:
                records.append(record)
                if len(records) == limit:
                    return ExecutionPage(records=tuple(records), next_after=iid)
        if page.next_after is None:
            return ExecutionPage(records=tuple(records))
        cursor = page.next_after


def run_listing(
    steps: Generator[StoreOp, Any, ExecutionPage], run: Callable[[StoreOp], Any]
) -> ExecutionPage:
    """Carry out a :func:`listing` with *run* (blocking: the command line's store)."""
    try:
        op = next(steps)
        while True:
            op = steps.send(run(op))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
