"""Supervised executions: one live execution per key, approval suspension, and
cancellation that waits for physical quiescence."""

from ._client import Executions as Executions, Step as Step
from ._context import StepContext as StepContext
from ._coordinator import ExecutionCoordinator as ExecutionCoordinator
from ._handle import ExecutionHandle as ExecutionHandle
from ._messages import (
    Approval as Approval,
    ApprovalRequest as ApprovalRequest,
    ExecutionOwner as ExecutionOwner,
    ExecutionRecord as ExecutionRecord,
    ExecutionResult as ExecutionResult,
)
from ._records import StaleExecution as StaleExecution

__all__ = [
    "Approval",
    "ApprovalRequest",
    "ExecutionCoordinator",
    "ExecutionHandle",
    "ExecutionOwner",
    "ExecutionRecord",
    "ExecutionResult",
    "Executions",
    "StaleExecution",
    "Step",
    "StepContext",
]

from phronomy._metadata import fixup_module_metadata

fixup_module_metadata(__name__, globals())
del fixup_module_metadata
