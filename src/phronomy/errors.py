"""The error hierarchy of phronomy.

Every error phronomy raises on purpose derives from :class:`PhronomyError`. Errors
caused by bad input also derive from :class:`ValueError` (or :class:`TypeError`), so
callers that only know the standard library still catch them.

This module imports nothing from phronomy: every layer (storage, engine, workflow,
agent) may raise these classes.
"""

from __future__ import annotations

__all__ = [
    "AdmissionError",
    "AgentBusyError",
    "ApprovalStateError",
    "BackpressureError",
    "CancellationError",
    "ConfigurationError",
    "ConflictError",
    "CorruptRecordError",
    "DeadlineExceededError",
    "DefinitionError",
    "DispatcherOnlyError",
    "EventRejectedError",
    "ExecutionNotFoundError",
    "ExecutionRehydrationRequiredError",
    "InstanceStateError",
    "InvalidActionResultError",
    "InvalidAsyncActionError",
    "InvalidAsyncEntryActionError",
    "InvalidAsyncTransitionActionError",
    "InvalidIdentifierError",
    "NotFoundError",
    "OperationTimeoutError",
    "PayloadTooLargeError",
    "PhronomyError",
    "PhronomyInternalError",
    "PoolShutdownError",
    "RecoveryRequiredError",
    "RecursionLimitError",
    "ReentrancyError",
    "RuntimeShutdownError",
    "SerializationError",
    "StaleAdmissionError",
    "StateValidationError",
    "StorageError",
    "StoreUnavailableError",
    "TransitionError",
    "UnknownEventError",
    "UnsupportedBackendError",
    "WorkflowBusyError",
]


class PhronomyError(Exception):
    """Base class of every error phronomy raises on purpose."""


class PhronomyInternalError(PhronomyError):
    """A bug in phronomy itself: please report it with the traceback."""


# --- runtime lifecycle and concurrency primitives -----------------------------------


class RuntimeShutdownError(PhronomyError):
    """Work was refused or cut off because the runtime is draining, stopping or closed."""


class ReentrancyError(PhronomyError):
    """An API was called from a context where it would deadlock or break ownership.

    For example a thread-only API called on the trio thread, or a blocking wait
    requested from the dispatcher task.
    """


class DispatcherOnlyError(PhronomyError):
    """Live execution state was mutated outside the dispatcher task."""


class BackpressureError(PhronomyError):
    """A bounded queue (an offload pool's) is full and the caller asked not to wait."""


class PoolShutdownError(PhronomyError):
    """An offload pool or the timer queue was used after it was shut down."""


class OperationTimeoutError(PhronomyError, TimeoutError):
    """An operation-wide timeout expired (for example an offloaded operation's)."""


class CancellationError(PhronomyError):
    """An operation or execution was cancelled before it produced its result."""


class DeadlineExceededError(CancellationError):
    """An execution's deadline passed; it was cancelled by the runtime."""


class ConfigurationError(PhronomyError, ValueError):
    """A runtime, pool or store was configured with invalid or missing settings."""


# --- bad input ----------------------------------------------------------------------


class InvalidIdentifierError(PhronomyError, ValueError):
    """An identifier (workflow instance id, agent id, ...) is empty, too long or not text."""


class DefinitionError(PhronomyError, ValueError):
    """A workflow definition or state class is invalid (detected at build time)."""


class StateValidationError(PhronomyError, ValueError):
    """Input or an update does not fit the workflow's state class.

    The message names the offending field (for example ``$.item`` or ``scor``).
    """


class UnknownEventError(PhronomyError, ValueError):
    """An event name is not declared by the workflow."""


class TransitionError(PhronomyError, ValueError):
    """An event cannot fire from the current state (or names no known machine event)."""


class EventRejectedError(PhronomyError):
    """Every guard of the event rejected it at the halted state; nothing changed.

    The segment ended at once without a save: the instance is still halted at *phase*
    (at *revision*) and can take the next event.

    Attributes:
        workflow_instance_id: the instance.
        event: the rejected event.
        phase: the state the instance is still halted at.
        revision: its durable revision (``None`` for ephemeral instances).
    """

    def __init__(
        self,
        message: str,
        *,
        workflow_instance_id: str,
        event: str,
        phase: str,
        revision: int | None,
    ) -> None:
        super().__init__(message)
        self.workflow_instance_id = workflow_instance_id
        self.event = event
        self.phase = phase
        self.revision = revision


class InstanceStateError(PhronomyError, ValueError):
    """The workflow instance is in a state that does not accept the request.

    For example an event sent to a finished instance.
    """


class RecursionLimitError(PhronomyError):
    """A segment made more transitions than its recursion limit allows."""


class InvalidActionResultError(PhronomyError, TypeError):
    """An entry, exit or transition action returned something it must not return.

    Actions return a new state or ``None``. A returned ``dict`` is rejected with this
    error instead of being silently ignored.
    """


class InvalidAsyncActionError(InvalidActionResultError):
    """An action returned an awaitable or a result handle; actions are synchronous."""


class InvalidAsyncEntryActionError(InvalidAsyncActionError):
    """An entry or exit action returned an awaitable or a result handle."""


class InvalidAsyncTransitionActionError(InvalidAsyncActionError):
    """A transition action returned an awaitable or a result handle."""


# --- admission ----------------------------------------------------------------------


class AdmissionError(PhronomyError):
    """Base class of admission failures (a logical identity is already owned)."""


class WorkflowBusyError(AdmissionError):
    """The workflow instance already has a live execution segment."""


class StaleAdmissionError(AdmissionError):
    """An owner token that does not (or no longer) own the admission tried to use it."""


class AgentBusyError(AdmissionError):
    """The agent already has a nonterminal top-level execution."""


class RecoveryRequiredError(PhronomyError):
    """The outcome of a durable write is unknown; an operator must resolve it.

    Attributes:
        instance_id: the workflow instance (or agent key) that needs recovery.
    """

    def __init__(self, message: str, *, instance_id: str | None = None) -> None:
        super().__init__(message)
        self.instance_id = instance_id


# --- supervised executions ------------------------------------------------------------


class ExecutionNotFoundError(PhronomyError, LookupError):
    """No live execution has that execution id in this runtime."""


class ApprovalStateError(PhronomyError):
    """Approve/reject was requested for an execution that is not suspended for approval."""


class ExecutionRehydrationRequiredError(PhronomyError):
    """The live owner of an execution went away (runtime shutdown); reload it to continue."""


# --- storage --------------------------------------------------------------------------


class StorageError(PhronomyError):
    """Base class of the portable storage errors."""


class ConflictError(StorageError):
    """A revision or identity precondition failed (optimistic concurrency)."""


class NotFoundError(StorageError, LookupError):
    """The record does not exist."""


class SerializationError(StorageError, ValueError):
    """A value cannot be stored (outside the JSON domain) or a stored blob cannot be read."""


class PayloadTooLargeError(SerializationError):
    """A snapshot exceeds the configured size limit."""


class CorruptRecordError(SerializationError):
    """A stored record does not decode: truncated, malformed, or of an unknown format.

    Attributes:
        instance_id: the record's workflow instance id.
        revision: the record's revision.
    """

    def __init__(self, message: str, *, instance_id: str, revision: int) -> None:
        super().__init__(message)
        self.instance_id = instance_id
        self.revision = revision


class StoreUnavailableError(StorageError):
    """The store cannot be used: it cannot be opened or written, is not a phronomy
    database, or its disk failed. The message names the store and what to do.

    A save that fails this way has an unknown outcome until it is reconciled; it is
    never reported as a conflict.

    Attributes:
        path: the database file (or address) concerned.
    """

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path


class UnsupportedBackendError(StorageError):
    """The backend lacks a capability or structure (for example an unknown schema)."""
