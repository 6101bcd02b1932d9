"""Hydration: the state a segment starts from, and what its durable base says (pure)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast, final

import msgspec

from phronomy.errors import (
    ConflictError,
    DefinitionMismatchError,
    InstanceStateError,
    InvalidInputError,
    NotFoundError,
)
from phronomy.storage import (
    InstanceStatus,
    check_workflow,
    decode_snapshot,
    decode_snapshot_builtins,
    normalize,
)

from ._definition import FINISH, SCHEDULED
from ._state import build_state, state_spec

if TYPE_CHECKING:
    from phronomy.storage import StoredRecord

    from ._definition import WorkflowDefinition
    from ._messages import InputOverlay, ResumeCommand
    from ._state import State

__all__ = [
    "DurableBase",
    "cancelled_state",
    "check_unchanged",
    "decode_stored",
    "require_durable",
    "resume_state",
    "start_state",
]


@final
class DurableBase(msgspec.Struct, frozen=True, kw_only=True):
    """What a durable segment started from: the revision it read and what it says."""

    expected: int | None
    status: InstanceStatus

    @classmethod
    def of(cls, record: StoredRecord | None) -> DurableBase:
        """What *record* (the instance's row, if any) says the segment starts from."""
        if record is None or record.revision == 0 or record.phase is None:
            return cls(expected=None, status="failed")  # nothing durable yet
        if record.status in ("running", "recovery_required"):  # what the save says
            status: InstanceStatus = "finished" if record.phase == FINISH else "halted"
        else:
            status = record.status
        return cls(expected=record.revision, status=status)


def start_state(
    definition: WorkflowDefinition[Any], given: InputOverlay, stored: State | None
) -> State:
    """The state a segment starts from at the entry point: a complete state given as
    input, or the stored fields (if any) overridden by the input fields."""
    if given.state is not None:
        return cast("State", given.state)
    state_type: type[State] = definition.state_type
    return build_state(state_type, given.fields, stored)


def require_durable(decoded: object, workflow_instance_id: str) -> None:
    """Raise :class:`~phronomy.NotFoundError` when nothing durable was loaded."""
    if decoded is None:
        raise NotFoundError(
            f"workflow instance {workflow_instance_id!r} has no durable state to resume"
        )


def resume_state(given: InputOverlay, halted: State) -> State:
    """Resume input is merged into the halted state through its reducers."""
    if given.state is not None:
        return cast("State", given.state)
    return halted.merge(**given.fields) if given.fields else halted


def check_unchanged(
    cmd: ResumeCommand, durable_fields: State, durable_phase: str | None
) -> None:
    """Resume validation: the halted result must match the durable snapshot."""
    halted = cmd.halted
    assert halted is not None
    if (
        normalize(halted.state) != normalize(durable_fields)
        or halted.phase != durable_phase
    ):
        raise ConflictError(
            "Workflow state changed since the supplied halted result for "
            f"workflow_instance_id {cmd.workflow_instance_id!r}; explicit reload/reconciliation "
            "is required (resume by id to continue from the durable state)"
        )


def decode_stored(
    definition: WorkflowDefinition[Any],
    record: StoredRecord | None,
    *,
    resuming: bool,
) -> tuple[StoredRecord | None, Any]:
    """Decode a loaded row's snapshot into the definition's state class.

    Runs in the store's worker thread. A row saved by another version of the
    definition is checked first: its phase must be a state this definition declares
    and its fields must fit the state class (the phase only when *resuming*: a start
    begins at the entry point).

    Returns:
        ``(record, decoded)``: the decoded snapshot, or ``None`` without one.

    Raises:
        InstanceStateError: the row belongs to another workflow.
        DefinitionMismatchError: another version saved it, and this definition lacks
            its phase or its fields (or has new required ones).
        CorruptRecordError: the snapshot does not decode.
    """
    if record is None:
        return record, None
    check_workflow(record, definition.name)
    if record.snapshot is None:
        return record, None
    iid, revision = record.workflow_instance_id, record.revision
    if record.definition_version != definition.version:
        _check_compatible(definition, record, resuming=resuming)
    return record, decode_snapshot(
        record.snapshot,
        workflow_instance_id=iid,
        revision=revision,
        state_type=definition.state_type,
    )


def _check_compatible(
    definition: WorkflowDefinition[Any], record: StoredRecord, *, resuming: bool
) -> None:
    assert record.snapshot is not None
    stored = decode_snapshot_builtins(
        record.snapshot,
        workflow_instance_id=record.workflow_instance_id,
        revision=record.revision,
    )
    spec = state_spec(definition.state_type)
    missing: list[str] = []
    phase = stored.phase
    if (
        resuming
        and phase not in (None, FINISH, SCHEDULED)
        and phase not in definition.declared
    ):
        missing.append(f"state {phase!r}")
    fields: dict[str, Any] = stored.fields
    missing.extend(f"field {name!r}" for name in sorted(set(fields) - spec.field_set))
    for name in spec.fields:
        if name in fields:
            try:
                msgspec.convert(fields[name], spec.types[name], strict=False)
            except msgspec.ValidationError:
                missing.append(f"field {name!r} as it was stored ({fields[name]!r})")
        elif name in spec.required:
            missing.append(f"a value for the new required field {name!r}")
    if missing:
        stored_version = record.definition_version or "(unversioned)"
        raise DefinitionMismatchError(
            f"workflow instance {record.workflow_instance_id!r} (revision "
            f"{record.revision}) was saved by version {stored_version} of workflow "
            f"{definition.name!r}; this definition ({definition.version}) lacks "
            + ", ".join(missing)
            + ". Keep them in the new version (or add a version that maps them) to "
            "load it",
            stored_version=stored_version,
            version=definition.version,
            missing=tuple(missing),
        )


def cancelled_state(
    definition: WorkflowDefinition[Any], record: StoredRecord | None
) -> State | None:
    """The state a cancel reports for *record*: its stored fields, or, for an instance
    that never saved, the state class's defaults (runs in the store's worker thread).

    Raises:
        InstanceStateError: it never saved and its state class has required fields
            (there is no state to report; nothing was written).
        DefinitionMismatchError: another version saved it with fields this one lacks.
        CorruptRecordError: the snapshot does not decode.
    """
    if record is None:
        return None
    _, decoded = decode_stored(definition, record, resuming=False)
    if decoded is not None:
        fields: State = decoded.fields
        return fields
    try:
        defaults: State = build_state(definition.state_type, {}, None)
    except InvalidInputError as exc:
        raise InstanceStateError(
            f"workflow instance {record.workflow_instance_id!r} never saved a state "
            f"(it is {record.status} at revision 0) and {definition.state_type.__name__} "
            "has required fields, so a cancel has no state to report; nothing was "
            "written",
            instance_id=record.workflow_instance_id,
        ) from exc
    return defaults
