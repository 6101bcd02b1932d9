"""The instance protocol: the lifecycle of one instance in one runtime, sans-IO.

An :class:`Instance` (one per admitted key, kept by :class:`Instances`) takes the
events of :mod:`._events`, checks each against the literal table of :mod:`._table`
(:data:`TRANSITIONS`) and returns the outputs of :mod:`._outputs` for its driver to
carry out: store operations, a session to start, callers to settle, updates to
publish, a lease to hold or drop. It imports no trio, no engine and no feature: a
feature (workflows) supplies its sessions, its store operations and its errors.
"""

from ._events import (
    Admit as Admit,
    AdmitCancel as AdmitCancel,
    Answer as Answer,
    Buffer as Buffer,
    Cancel as Cancel,
    CancelAsked as CancelAsked,
    CancelAwait as CancelAwait,
    CancelDone as CancelDone,
    CancelReload as CancelReload,
    Claim as Claim,
    End as End,
    InstanceEvent as InstanceEvent,
    LeaseLost as LeaseLost,
    Load as Load,
    Persist as Persist,
    Refuse as Refuse,
    Resolve as Resolve,
    Retire as Retire,
    Run as Run,
    Shutdown as Shutdown,
    Withdraw as Withdraw,
)
from ._instance import Instance as Instance
from ._outputs import (
    CancelSession as CancelSession,
    Complete as Complete,
    DropLease as DropLease,
    Fail as Fail,
    FailSession as FailSession,
    FollowUp as FollowUp,
    HoldLease as HoldLease,
    InstanceOutput as InstanceOutput,
    Offer as Offer,
    Publish as Publish,
    Refused as Refused,
    Released as Released,
    Rerun as Rerun,
    Settlement as Settlement,
    ShutDown as ShutDown,
    StartSession as StartSession,
    Submit as Submit,
)
from ._registry import Instances as Instances, Sessions as Sessions
from ._table import (
    ADMITTED as ADMITTED,
    BUSY as BUSY,
    STATUS as STATUS,
    TRANSITIONS as TRANSITIONS,
)

__all__ = [
    "ADMITTED",
    "BUSY",
    "STATUS",
    "TRANSITIONS",
    "Admit",
    "AdmitCancel",
    "Answer",
    "Buffer",
    "Cancel",
    "CancelAsked",
    "CancelAwait",
    "CancelDone",
    "CancelReload",
    "CancelSession",
    "Claim",
    "Complete",
    "DropLease",
    "End",
    "Fail",
    "FailSession",
    "FollowUp",
    "HoldLease",
    "Instance",
    "InstanceEvent",
    "InstanceOutput",
    "Instances",
    "LeaseLost",
    "Load",
    "Offer",
    "Persist",
    "Publish",
    "Refuse",
    "Refused",
    "Released",
    "Rerun",
    "Resolve",
    "Retire",
    "Run",
    "Sessions",
    "Settlement",
    "ShutDown",
    "Shutdown",
    "StartSession",
    "Submit",
    "Withdraw",
]
