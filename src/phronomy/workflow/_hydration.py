"""Hydration: the state a segment starts from, and what its durable base says (pure)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast, final

import msgspec

from phronomy.errors import ConflictError, NotFoundError
from phronomy.storage import InstanceStatus, normalize

from ._definition import FINISH
from ._state import build_state

if TYPE_CHECKING:
    from phronomy.storage import StoredRecord

    from ._definition import WorkflowDefinition
    from ._messages import InputOverlay, ResumeCommand
    from ._state import State

__all__ = [
    "DurableBase",
    "check_unchanged",
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
        return cls(
            expected=record.revision,
            status="finished" if record.phase == FINISH else "halted",
        )


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
