"""The continuations of the workflow coordinator: messages that bring a store
operation's outcome (or a lease's news) back to the dispatcher, each naming the
instance protocol object it continues."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias, final

import msgspec
import outcome

from phronomy.instance import Instance, InstanceOutput, Instances
from phronomy.storage import StoredRecord

from ._claims import Loaded
from ._messages import CancelCommand, ResumeCommand, StartCommand

if TYPE_CHECKING:
    from phronomy.engine import Caller
    from phronomy.storage import DeleteOp, InboxEntry, MarkOp

    from ._session import WorkflowSession

__all__ = [
    "CancelAsked",
    "CancelLoaded",
    "CancelRequested",
    "CancelSaved",
    "LeaseLost",
    "LoadReady",
    "WorkflowInstance",
    "WorkflowInstances",
    "WorkflowOutput",
]

WorkflowInstance: TypeAlias = Instance[
    "Caller[Any]",
    "WorkflowSession[Any]",
    "MarkOp | DeleteOp",
    "InboxEntry",
    CancelCommand,
]
"""The protocol object of one workflow instance."""

WorkflowInstances: TypeAlias = Instances[
    "Caller[Any]",
    "WorkflowSession[Any]",
    "MarkOp | DeleteOp",
    "InboxEntry",
    CancelCommand,
]
"""The workflow instances of one runtime."""

WorkflowOutput: TypeAlias = InstanceOutput[
    "WorkflowSession[Any]",
    "InboxEntry",
    "Caller[Any]",
    "MarkOp | DeleteOp",
    CancelCommand,
]
"""What the coordinator carries out for a workflow instance."""


@final
class LoadReady(msgspec.Struct, frozen=True, kw_only=True):
    """The durable load of a start or resume came back."""

    command: StartCommand | ResumeCommand
    instance: WorkflowInstance
    loaded: outcome.Outcome[Loaded]
    sent: float
    """When the load (and its claim) was sent, in trio time."""


@final
class LeaseLost(msgspec.Struct, frozen=True, kw_only=True):
    """A live segment's lease was lost: it must stop without writing."""

    instance: WorkflowInstance
    error: BaseException


@final
class CancelAsked(msgspec.Struct, frozen=True, kw_only=True):
    """Another runtime asked for a live segment's instance to be cancelled."""

    instance: WorkflowInstance
    reason: str | None


@final
class CancelLoaded(msgspec.Struct, frozen=True, kw_only=True):
    """The row of an instance to cancel was read (and its state decoded)."""

    command: CancelCommand
    instance: WorkflowInstance
    loaded: outcome.Outcome[tuple[StoredRecord | None, Any]]


@final
class CancelRequested(msgspec.Struct, frozen=True, kw_only=True):
    """The request to cancel an instance live in another runtime ran: ``(epoch,
    written)`` of the lease it found, or ``None`` (see
    :class:`~phronomy.storage.RequestCancelOp`)."""

    command: CancelCommand
    instance: WorkflowInstance
    requested: outcome.Outcome[tuple[int, bool] | None]


@final
class CancelSaved(msgspec.Struct, frozen=True, kw_only=True):
    """The cancelling write came back."""

    command: CancelCommand
    instance: WorkflowInstance
    saved: outcome.Outcome[Any]
