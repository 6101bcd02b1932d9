"""Workflows: definitions, the sans-IO machine, live sessions, admission and durability."""

from ._builder import Workflow as Workflow
from ._client import WorkflowClient as WorkflowClient
from ._coordinator import WorkflowCoordinator as WorkflowCoordinator
from ._definition import (
    AUTO_EVENT as AUTO_EVENT,
    FINISH as FINISH,
    Callback as Callback,
    Transition as Transition,
    WorkflowDefinition as WorkflowDefinition,
)
from ._inbox import EventReceipt as EventReceipt
from ._intents import Effects as Effects
from ._machine import CONSUME as CONSUME
from ._messages import (
    EventOutcome as EventOutcome,
    EventStatus as EventStatus,
    IfExists as IfExists,
    InstanceUpdate as InstanceUpdate,
    LiveSegment as LiveSegment,
    RecoveryEntry as RecoveryEntry,
    SegmentStatus as SegmentStatus,
    Step as Step,
    WorkflowResult as WorkflowResult,
    WorkflowStatistics as WorkflowStatistics,
)
from ._poller import poll_inbox as poll_inbox
from ._reading import (
    InstanceDescription as InstanceDescription,
    InstanceLease as InstanceLease,
)
from ._recovery import InstanceView as InstanceView, RecoveryClient as RecoveryClient
from ._retries import RetryPolicy as RetryPolicy
from ._schedule_client import ScheduleClient as ScheduleClient
from ._state import APPEND as APPEND, MERGE as MERGE, REPLACE as REPLACE, State as State
from ._stream import WorkflowStream as WorkflowStream
from ._watch import InstanceWatch as InstanceWatch

__all__ = [
    "APPEND",
    "AUTO_EVENT",
    "CONSUME",
    "FINISH",
    "MERGE",
    "REPLACE",
    "Callback",
    "Effects",
    "EventOutcome",
    "EventReceipt",
    "EventStatus",
    "IfExists",
    "InstanceDescription",
    "InstanceLease",
    "InstanceUpdate",
    "InstanceView",
    "InstanceWatch",
    "LiveSegment",
    "RecoveryClient",
    "RecoveryEntry",
    "RetryPolicy",
    "ScheduleClient",
    "SegmentStatus",
    "State",
    "Step",
    "Transition",
    "Workflow",
    "WorkflowClient",
    "WorkflowCoordinator",
    "WorkflowDefinition",
    "WorkflowResult",
    "WorkflowStatistics",
    "WorkflowStream",
    "poll_inbox",
]

from phronomy._metadata import fixup_module_metadata

fixup_module_metadata(__name__, globals())
del fixup_module_metadata
