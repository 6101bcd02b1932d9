"""Values the stores exchange with the runtime (all frozen msgspec Structs)."""

from __future__ import annotations

import re
from typing import Literal, final

import msgspec

from phronomy.errors import InvalidInputError

__all__ = [
    "EXECUTION_KEY_PREFIX",
    "EXECUTION_KIND",
    "MAX_INSTANCE_ID_LENGTH",
    "InstancePage",
    "InstanceStatus",
    "SaveOutcome",
    "SaveRequest",
    "StoredRecord",
    "validate_instance_id",
]

EXECUTION_KIND = "phronomy.execution"
"""The ``workflow`` column of supervised executions' per-key records (workflow names
may not start with ``phronomy.``)."""
EXECUTION_KEY_PREFIX = "agent:"
"""Supervised executions' records are stored under ``agent:<agent_id>``."""

InstanceStatus = Literal["running", "halted", "finished", "failed", "recovery_required"]
"""What operators see for an instance.

``running``: a live segment is waiting for a signal or an effect (a segment that runs
straight to its terminal state goes from its previous status to the next one directly,
without an extra write). ``halted``: waiting at a wait state.
``finished``: reached FINISH. ``failed``: its last segment failed (the last durable
revision is still resumable). ``recovery_required``: the outcome of a save is unknown;
an operator must resolve it before the instance runs again.
"""


@final
class StoredRecord(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One instance's durable row.

    Attributes:
        workflow_instance_id: the instance id.
        workflow: the workflow name that owns the instance ("" if unknown).
        revision: 0 while nothing was saved yet (a placeholder), then 1, 2, ...
        status: the instance status.
        phase: the phase of the saved snapshot (a wait state, or ``"__end__"``).
        snapshot: the encoded snapshot, or ``None`` at revision 0.
        write_id: the ``write_id`` of the save that produced this revision.
        detail: a diagnostic for ``failed`` / ``recovery_required``.
        updated_at_ms: wall-clock milliseconds of the last change.
    """

    workflow_instance_id: str
    workflow: str
    revision: int
    status: InstanceStatus
    phase: str | None = None
    snapshot: bytes | None = None
    write_id: str | None = None
    detail: str | None = None
    updated_at_ms: int = 0


@final
class SaveRequest(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A revision-checked save.

    Attributes:
        workflow_instance_id: the instance id.
        expected_revision: the revision the writer read (``None``: no row yet).
        snapshot: the encoded snapshot.
        write_id: unique per save; recorded with the row so an uncertain commit can be
            classified later.
        status: the instance status this save sets (``halted`` or ``finished``).
        phase: the snapshot's phase.
        workflow: the owning workflow's name.
    """

    workflow_instance_id: str
    expected_revision: int | None
    snapshot: bytes
    write_id: str
    status: InstanceStatus
    phase: str | None
    workflow: str = ""


@final
class SaveOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """How a save ended, classified.

    Attributes:
        outcome: ``success`` (the revision is durable), ``known_failure`` (nothing was
            written), or ``outcome_unknown`` (the store cannot tell).
        revision: the durable revision on success.
        error: the error for the two failures.
    """

    outcome: Literal["success", "known_failure", "outcome_unknown"]
    revision: int | None = None
    error: BaseException | None = None


@final
class InstancePage(msgspec.Struct, frozen=True, kw_only=True):
    """One page of :meth:`~phronomy.storage.BaseStore.list_instances`.

    Attributes:
        records: the rows, ordered by instance id (snapshots omitted).
        next_after: pass as ``after`` to get the next page; ``None`` on the last page.
    """

    records: tuple[StoredRecord, ...]
    next_after: str | None = None


MAX_INSTANCE_ID_LENGTH = 255
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def validate_instance_id(value: object, *, what: str = "workflow_instance_id") -> str:
    """Return *value* if it is a usable instance id.

    Raises:
        InvalidInputError: not a string, empty, longer than 255 characters, or
            containing control characters.
    """
    if not isinstance(value, str):
        raise InvalidInputError(f"{what} must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidInputError(f"{what} is required and must not be empty")
    if len(value) > MAX_INSTANCE_ID_LENGTH:
        raise InvalidInputError(
            f"{what} is {len(value)} characters long; the limit is {MAX_INSTANCE_ID_LENGTH}"
        )
    if _CONTROL.search(value):
        raise InvalidInputError(f"{what} {value!r} contains control characters")
    return value
