"""Supervised executions: one live execution per key, approval suspension, and
cancellation that waits for physical quiescence, each run as an instance of its plan's
generated workflow (leases, the inbox, durable timers and the recovery sweep)."""

from ._client import Executions as Executions
from ._context import StepContext as StepContext
from ._handle import ExecutionHandle as ExecutionHandle
from ._messages import (
    Approval as Approval,
    ApprovalRequest as ApprovalRequest,
    ExecutionDescription as ExecutionDescription,
    ExecutionLease as ExecutionLease,
    ExecutionOwner as ExecutionOwner,
    ExecutionPage as ExecutionPage,
    ExecutionRecord as ExecutionRecord,
    ExecutionResult as ExecutionResult,
    ExecutionStatus as ExecutionStatus,
    RecordStatus as RecordStatus,
)
from ._plan import (
    ExecutionState as ExecutionState,
    Step as Step,
    execution_plan as execution_plan,
)

__all__ = [
    "Approval",
    "ApprovalRequest",
    "ExecutionDescription",
    "ExecutionHandle",
    "ExecutionLease",
    "ExecutionOwner",
    "ExecutionPage",
    "ExecutionRecord",
    "ExecutionResult",
    "ExecutionState",
    "ExecutionStatus",
    "Executions",
    "RecordStatus",
    "Step",
    "StepContext",
    "execution_plan",
]

from phronomy._metadata import fixup_module_metadata

fixup_module_metadata(__name__, globals())
del fixup_module_metadata
