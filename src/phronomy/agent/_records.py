"""Durable per-key records of supervised executions: storing, reading and resolving them.

One row per agent key (``agent:<agent_id>``, kind :data:`~phronomy.storage.EXECUTION_KIND`)
holds the latest execution's :class:`ExecutionRecord`. While an execution runs its
record says ``active`` and a second start of the key is refused. A record that stays
``active`` although nothing runs it any more (its runtime stopped while it waited for an
approval, or its process crashed) is *stale*: :func:`stale_records` lists such records
and :func:`resolve_record` closes them, for the runtime and for the command line.

The functions here block (they call the store); the runtime runs them in its store's
worker threads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, final

import msgspec

from phronomy.engine import random_hex
from phronomy.errors import (
    BusyError,
    CancellationError,
    ConflictError,
    NotFoundError,
    RecoveryRequiredError,
)
from phronomy.storage import (
    EXECUTION_KEY_PREFIX,
    EXECUTION_KIND,
    FINISH_PHASE,
    ListOp,
    LoadOp,
    MarkOp,
    SaveOp,
    SaveOutcome,
    SaveRequest,
    decode_snapshot,
    encode_snapshot,
    quarantined,
    release_quarantine,
    run_op,
)

from ._messages import ExecutionRecord, ExecutionResult

if TYPE_CHECKING:
    from phronomy.storage import (
        InstancePage,
        InstanceStatus,
        StoredRecord,
        WorkflowStore,
    )

__all__ = [
    "RESOLVE_HINT",
    "StaleExecution",
    "agent_key",
    "decode_record",
    "record_request",
    "record_resolution",
    "resolve_record",
    "stale_entry",
    "stale_records",
    "startable_revision",
    "terminal_record",
    "written",
]

RESOLVE_HINT = (
    "runtime.executions.resolve({agent!r}, action='release') or "
    "`python -m phronomy executions resolve --db FILE {agent} release`"
)
"""How an operator releases a key (formatted with ``agent``)."""

_STALE_ROWS: tuple[InstanceStatus, ...] = ("running", "recovery_required")


def agent_key(agent_id: str) -> str:
    """The store key of an agent's execution record."""
    return f"{EXECUTION_KEY_PREFIX}{agent_id}"


@final
class StaleExecution(msgspec.Struct, frozen=True, kw_only=True):
    """An execution record that may have no live owner any more.

    Attributes:
        agent_id: the key.
        execution_id: the execution the record describes.
        status: ``active`` (the record says the execution runs, but no runtime that
            asked holds it) or ``recovery_required`` (the outcome of its last write is
            unknown).
        steps_completed: steps the record says finished.
        detail: why, when the store knows.
        updated_at_ms: wall-clock milliseconds of the record's last change.
        in_process: this runtime holds the key's admission as recovery-required.
    """

    agent_id: str
    execution_id: str | None
    status: Literal["active", "recovery_required"]
    steps_completed: int = 0
    detail: str | None = None
    updated_at_ms: int = 0
    in_process: bool = False


def decode_record(
    row: StoredRecord | None,
) -> tuple[StoredRecord | None, ExecutionRecord | None]:
    """Decode the record in *row* (in a worker thread).

    Raises:
        CorruptRecordError: the stored snapshot does not decode.
    """
    if row is None or row.snapshot is None:
        return row, None
    record = decode_snapshot(
        row.snapshot,
        workflow_instance_id=row.workflow_instance_id,
        revision=row.revision,
        state_type=ExecutionRecord,
    ).fields
    return row, record


def record_request(
    agent_id: str, record: ExecutionRecord, expected_revision: int | None
) -> SaveRequest:
    """The revision-checked save of *record* for *agent_id* (a new ``write_id`` each)."""
    key = agent_key(agent_id)
    revision = (expected_revision or 0) + 1
    active = record.status == "active"
    phase = "active" if active else FINISH_PHASE
    status: InstanceStatus = (
        "running"
        if active
        else ("failed" if record.status == "abandoned" else "finished")
    )
    return SaveRequest(
        workflow_instance_id=key,
        expected_revision=expected_revision,
        snapshot=encode_snapshot(
            record,
            workflow_instance_id=key,
            revision=revision,
            phase=phase,
            workflow=EXECUTION_KIND,
        ),
        write_id=random_hex(),
        status=status,
        phase=phase,
        workflow=EXECUTION_KIND,
    )


def stale_entry(
    row: StoredRecord | None, record: ExecutionRecord | None, *, quarantined: bool
) -> StaleExecution | None:
    """What is stale about an execution key's row, or ``None``.

    Args:
        row: the key's row, as read.
        record: its decoded record.
        quarantined: whether this process refuses the key (an unknown outcome whose
            ``recovery_required`` mark could not be written).
    """
    if row is None:
        return None
    if row.status == "recovery_required" or quarantined:
        status: Literal["active", "recovery_required"] = "recovery_required"
    elif record is not None and record.status == "active":
        status = "active"
    else:
        return None
    return StaleExecution(
        agent_id=row.workflow_instance_id.removeprefix(EXECUTION_KEY_PREFIX),
        execution_id=None if record is None else record.execution_id,
        status=status,
        steps_completed=0 if record is None else record.steps_completed,
        detail=row.detail,
        updated_at_ms=row.updated_at_ms,
    )


def record_resolution(
    agent_id: str,
    row: StoredRecord | None,
    record: ExecutionRecord | None,
    action: Literal["adopt", "release"],
    *,
    by: str,
    quarantined: bool,
) -> tuple[MarkOp | SaveOp, ExecutionRecord]:
    """The revision-checked write that closes a stale record, and the record after it.

    ``adopt`` keeps what the store recorded: a record with a terminal status stays as
    it is (only a ``recovery_required`` mark is cleared), and one that still says
    ``active`` is closed as ``abandoned``, since the store recorded no outcome.
    ``release`` closes the record as ``abandoned`` whatever it says. Either way the
    execution does not continue; what its steps did before is not known here.

    Raises:
        NotFoundError: the key has no stale record.
    """
    if row is None or stale_entry(row, record, quarantined=quarantined) is None:
        raise NotFoundError(f"agent {agent_id!r} has no stale execution record")
    if action == "adopt" and record is not None and record.status != "active":
        op = MarkOp(
            workflow_instance_id=row.workflow_instance_id,
            status="finished",
            expected_revision=row.revision,
            detail=f"recorded {record.status} outcome adopted by {by}",
        )
        return op, record
    closed = ExecutionRecord(
        execution_id=record.execution_id if record is not None else "",
        status="abandoned",
        steps_completed=record.steps_completed if record is not None else 0,
        error=f"{'released' if action == 'release' else 'adopted'} by {by}: "
        + (
            "the store recorded no outcome"
            if record is None or record.status == "active"
            else f"its recorded outcome was {record.status}"
        ),
    )
    return SaveOp(
        request=record_request(agent_id, closed, row.revision or None)
    ), closed


def written(result: bool | SaveOutcome, agent_id: str) -> None:
    """Raise unless the write of a resolution (its result *result*) changed the record.

    Raises:
        ConflictError: the record changed meanwhile (try again).
    """
    if isinstance(result, SaveOutcome):
        if result.outcome == "success":
            return
        if result.error is not None:
            raise result.error
    elif result:
        return
    raise ConflictError(f"the record of agent {agent_id!r} changed; retry")


def stale_records(store: WorkflowStore) -> list[StaleExecution]:
    """Every execution record that is stale in this process's view (blocking).

    Without leases a record that says ``active`` may still belong to an execution that
    runs in *another* process sharing the store; only the caller can know.

    Raises:
        CorruptRecordError: a stored record does not decode.
    """
    found: list[StaleExecution] = []
    for status in _STALE_ROWS:
        after: str | None = None
        while True:
            page: InstancePage = run_op(
                store, ListOp(status=status, after=after, limit=500)
            )
            for listed in page.records:
                if listed.workflow != EXECUTION_KIND:
                    continue
                key = listed.workflow_instance_id
                row, record = decode_record(
                    run_op(store, LoadOp(workflow_instance_id=key))
                )
                entry = stale_entry(
                    row,
                    record,
                    quarantined=quarantined(store.identity, key) is not None,
                )
                if entry is not None:
                    found.append(entry)
            if page.next_after is None:
                break
            after = page.next_after
    return sorted(found, key=lambda s: s.agent_id)


def resolve_record(
    store: WorkflowStore,
    agent_id: str,
    action: Literal["adopt", "release"],
    *,
    by: str = "an operator",
) -> ExecutionRecord:
    """Close a stale execution record (blocking; see :func:`record_resolution`).

    Raises:
        NotFoundError: the key has no stale record.
        ConflictError: the record changed during the resolution (try again).
        CorruptRecordError: the stored record does not decode.
    """
    key = agent_key(agent_id)
    row, record = decode_record(run_op(store, LoadOp(workflow_instance_id=key)))
    op, result = record_resolution(
        agent_id,
        row,
        record,
        action,
        by=by,
        quarantined=quarantined(store.identity, key) is not None,
    )
    written(run_op(store, op), agent_id)
    release_quarantine(store.identity, key)
    return result


def startable_revision(
    agent_id: str, row: StoredRecord | None, current: ExecutionRecord | None
) -> int | None:
    """The revision a new ``active`` record replaces, or raise if the key is taken.

    Raises:
        RecoveryRequiredError: the stored record requires recovery.
        BusyError: the stored record says an execution is active.
    """
    if row is not None and row.status == "recovery_required":
        raise RecoveryRequiredError(
            f"the durable record of agent {agent_id!r} requires recovery "
            f"({row.detail or 'the outcome of a write is unknown'}); resolve it with "
            + RESOLVE_HINT.format(agent=agent_id),
            instance_id=agent_key(agent_id),
        )
    if current is not None and current.status == "active":
        raise BusyError(
            f"Agent {agent_id!r} already has a nonterminal top-level execution "
            f"({current.execution_id!r} is active in the store: it runs in another "
            "process, or its runtime stopped before it ended). If it is stale, list it "
            "with runtime.executions.stale() and release it with "
            + RESOLVE_HINT.format(agent=agent_id)
        )
    return row.revision if row is not None and row.revision > 0 else None


def terminal_record(
    execution_id: str, outcome: Any, steps_completed: int
) -> ExecutionRecord:
    """The record an execution ends with: its result's status, ``cancelled`` or
    ``failed`` (with the error)."""
    if isinstance(outcome, ExecutionResult):
        return ExecutionRecord(
            execution_id=execution_id,
            status=outcome.status,
            steps_completed=steps_completed,
        )
    return ExecutionRecord(
        execution_id=execution_id,
        status="cancelled" if isinstance(outcome, CancellationError) else "failed",
        steps_completed=steps_completed,
        error=f"{type(outcome).__name__}: {outcome}",
    )
