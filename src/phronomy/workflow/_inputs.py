"""Checking what callers pass to start a workflow: the input and the ``if_exists`` policy."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from phronomy.errors import InvalidInputError

from ._messages import InputOverlay
from ._state import State, validate_fields

if TYPE_CHECKING:
    from ._definition import WorkflowDefinition
    from ._messages import IfExists

__all__ = ["input_overlay", "policy"]

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
