"""Supervised executions: one live execution per key, approval suspension, and
cancellation that waits for physical quiescence."""

from .client import (
    ExecutionHandle as ExecutionHandle,
    Executions as Executions,
    Step as Step,
)
from .context import StepContext as StepContext
from .coordinator import ExecutionCoordinator as ExecutionCoordinator
from .messages import (
    Approval as Approval,
    ApprovalRequest as ApprovalRequest,
    ExecutionOwner as ExecutionOwner,
    ExecutionRecord as ExecutionRecord,
    ExecutionResult as ExecutionResult,
)
