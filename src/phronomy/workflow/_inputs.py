"""Checking what callers pass to start or resume a workflow: the input, the
``if_exists`` policy and which instance an event resumes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from phronomy.errors import InvalidInputError
from phronomy.storage import validate_instance_id

from ._events import RESUME, resolve_event
from ._messages import InputOverlay
from ._state import State, validate_fields

if TYPE_CHECKING:
    from ._definition import WorkflowDefinition
    from ._messages import IfExists, WorkflowResult

__all__ = ["input_overlay", "policy", "resume_target"]

_NO_INPUT = InputOverlay()
"""No input (frozen, and its empty fields are never changed: one will do)."""


def policy(value: object) -> IfExists:
    if value not in ("refuse", "return", "restart", "restart_closed"):
        raise InvalidInputError(
            "if_exists must be 'refuse', 'return', 'restart' or 'restart_closed', got "
            f"{value!r}"
        )
    return value


def input_overlay(workflow: WorkflowDefinition[Any], value: Any) -> InputOverlay:
    if value is None:
        return _NO_INPUT
    if isinstance(value, workflow.state_type):
        return InputOverlay(state=value)
    if isinstance(value, State):
        raise InvalidInputError(
            f"input is a {type(value).__name__}; workflow {workflow.name!r} runs "
            f"{workflow.state_type.__name__}"
        )
    if not isinstance(value, Mapping):
        raise InvalidInputError(
            f"input must be a mapping of {workflow.state_type.__name__} fields or a "
            f"{workflow.state_type.__name__}, got {type(value).__name__}"
        )
    return InputOverlay(fields=validate_fields(workflow.state_type, value))


def resume_target(
    workflow: WorkflowDefinition[Any],
    event: object,
    halted: WorkflowResult[Any] | None,
    workflow_instance_id: str | None,
    *,
    durable: bool,
) -> tuple[str, str]:
    """The instance id and the event a ``start_event`` resumes (the event resolved
    from the halted phase).

    Raises:
        InvalidInputError: what is wrong with the arguments.
    """
    if not isinstance(event, str):
        raise InvalidInputError(
            f"send_event needs the event's name (a string), got {event!r}"
        )
    if halted is None:
        if workflow_instance_id is None:
            raise InvalidInputError(
                f"send_event({workflow.name!r} workflow, {event!r}) needs to know "
                "which instance: pass workflow_instance_id=... (resume by id from "
                "the store) or halted=... (a halted WorkflowResult)"
            )
        iid = validate_instance_id(workflow_instance_id, workflow=workflow.name)
        if not durable:
            raise InvalidInputError(
                f"resuming workflow instance {iid!r} by id needs a store (open_runtime(store=...))"
            )
        if event != RESUME and not workflow.has_event(event):
            raise InvalidInputError(
                f"Unknown event {event!r}. Valid events: {list(workflow.external_events)}"
            )
        return iid, event
    iid = validate_instance_id(
        halted.workflow_instance_id,
        what="Halted WorkflowResult has no workflow_instance_id",
        workflow=workflow.name,
    )
    if workflow_instance_id is not None and workflow_instance_id != iid:
        raise InvalidInputError(
            f"workflow_instance_id {workflow_instance_id!r} differs from the halted "
            f"result's {iid!r}"
        )
    if not isinstance(halted.state, workflow.state_type):
        raise InvalidInputError(
            f"the halted state is a {type(halted.state).__name__}; workflow "
            f"{workflow.name!r} runs {workflow.state_type.__name__}"
        )
    return iid, resolve_event(workflow, halted.phase, event, iid)
