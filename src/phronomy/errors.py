"""The errors phronomy raises on purpose, as one small tree.

::

    PhronomyError
    ├── InvalidInputError (ValueError)      an argument is wrong: an id, an event name,
    │   │                                   a state field, a setting (the message names it)
    │   └── AmbiguousEventError             resume() at a state with several events
    ├── DefinitionError (ValueError)        a workflow definition is invalid (at build)
    │   └── DefinitionMismatchError         a stored instance needs what the definition
    │                                       lacks (another version saved it)
    ├── TransitionError (ValueError)        an event cannot fire from the current state,
    │                                       or a chain of automatic transitions ran away
    ├── EventRejectedError                  every guard rejected the event; nothing changed
    ├── InvalidActionResultError (TypeError) an action or hook returned what it must not
    ├── InstanceStateError (ValueError)     the instance or execution is not in a state
    │   │                                   that accepts the request
    │   └── InstanceExistsError             a start names an open instance
    ├── BusyError                           the id already has a live segment or execution
    ├── RecoveryRequiredError               a durable write's outcome is unknown; an
    │                                       operator must resolve it
    ├── CancellationError                   cancelled before it produced its result
    │   ├── DeadlineExceededError (TimeoutError)  ... because its deadline passed
    │   └── WorkflowCancelledError          ... a workflow instance, by runtime.cancel
    ├── RuntimeShutdownError                refused or cut off: the runtime is closing
    ├── ReentrancyError                     called from a thread or task that may not
    ├── BackpressureError                   a bounded queue is full
    ├── StorageError
    │   ├── ConflictError                   the stored revision moved on
    │   │   └── LeaseLostError              another runtime took the instance over
    │   ├── NotFoundError (LookupError)     nothing is stored (or live) under that id
    │   ├── SerializationError (ValueError) a value cannot be stored faithfully
    │   │   └── CorruptRecordError          a stored record does not decode
    │   └── StoreUnavailableError           the store cannot be opened, read or written
    └── PhronomyInternalError               a bug in phronomy: please report it

Errors caused by bad input also derive from :class:`ValueError` (or
:class:`TypeError`), so callers that only know the standard library still catch them.

This module imports nothing from phronomy: every layer (storage, engine, workflow,
agent) may raise these classes.
"""

from __future__ import annotations

__all__ = [
    "AmbiguousEventError",
    "BackpressureError",
    "BusyError",
    "CancellationError",
    "ConflictError",
    "CorruptRecordError",
    "DeadlineExceededError",
    "DefinitionError",
    "DefinitionMismatchError",
    "EventRejectedError",
    "InstanceExistsError",
    "InstanceStateError",
    "InvalidActionResultError",
    "InvalidInputError",
    "LeaseLostError",
    "NotFoundError",
    "PhronomyError",
    "PhronomyInternalError",
    "RecoveryRequiredError",
    "ReentrancyError",
    "RuntimeShutdownError",
    "SerializationError",
    "StorageError",
    "StoreUnavailableError",
    "TransitionError",
    "WorkflowCancelledError",
]


class PhronomyError(Exception):
    """Base class of every error phronomy raises on purpose."""


class PhronomyInternalError(PhronomyError):
    """A bug in phronomy itself: please report it with the traceback."""


# --- bad input and definitions ---------------------------------------------------------


class InvalidInputError(PhronomyError, ValueError):
    """An argument is wrong; the message names it.

    For example an empty or over-long instance id, an event name the workflow does not
    declare, input or an update that does not fit the state class (the message names
    the field, such as ``$.item``), or invalid runtime, pool or store settings.
    """


class AmbiguousEventError(InvalidInputError):
    """``resume()`` at a state that declares several external events: name the event.

    Attributes:
        candidates: the events the state declares, in declaration order.
    """

    def __init__(self, message: str, *, candidates: tuple[str, ...]) -> None:
        super().__init__(message)
        self.candidates = candidates


class DefinitionError(PhronomyError, ValueError):
    """A workflow definition or state class is invalid (detected at build time)."""


class DefinitionMismatchError(DefinitionError):
    """A stored instance was saved by another version of the workflow definition and
    needs a state or fields this definition lacks.

    Attributes:
        stored_version: the version that saved the instance.
        version: this definition's version.
        missing: what this definition lacks (``"state 'x'"``, ``"field 'y'"``, ...).
    """

    def __init__(
        self,
        message: str,
        *,
        stored_version: str,
        version: str,
        missing: tuple[str, ...],
    ) -> None:
        super().__init__(message)
        self.stored_version = stored_version
        self.version = version
        self.missing = missing


# --- running a workflow -------------------------------------------------------------------


class TransitionError(PhronomyError, ValueError):
    """An event cannot fire from the current state.

    Also raised when every automatic transition's guard rejects (the state could never
    be left) and when a segment exceeds its recursion limit.
    """


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


class InvalidActionResultError(PhronomyError, TypeError):
    """An action, guard or hook returned something it must not return.

    Actions return a new state or ``None``: a returned ``dict`` is rejected instead of
    being silently ignored, and so is an awaitable or a result handle (callbacks are
    synchronous; start async work with effects).
    """


class InstanceStateError(PhronomyError, ValueError):
    """The instance or execution is not in a state that accepts the request.

    For example an event sent to a finished instance, an approval for an execution
    that is not waiting for one, or an effect started after its segment ended.
    """


class InstanceExistsError(InstanceStateError):
    """A start names an instance that is open (halted, running, recovery_required).

    Continue it with ``send_event``, or start with ``if_exists="return"`` (its stored
    result) or ``if_exists="restart"``.

    Attributes:
        workflow_instance_id: the instance.
        status: its stored status.
        phase: its stored phase.
        revision: its stored revision.
    """

    def __init__(
        self,
        message: str,
        *,
        workflow_instance_id: str,
        status: str,
        phase: str | None,
        revision: int,
    ) -> None:
        super().__init__(message)
        self.workflow_instance_id = workflow_instance_id
        self.status = status
        self.phase = phase
        self.revision = revision


# --- admission and recovery ----------------------------------------------------------------


class BusyError(PhronomyError):
    """The id already has a live execution segment (a workflow instance) or a
    nonterminal top-level execution (an agent), in this runtime or in the store."""


class RecoveryRequiredError(PhronomyError):
    """The outcome of a durable write is unknown; an operator must resolve it.

    Attributes:
        instance_id: the workflow instance (or agent key) that needs recovery.
    """

    def __init__(self, message: str, *, instance_id: str | None = None) -> None:
        super().__init__(message)
        self.instance_id = instance_id


# --- the runtime and its primitives ---------------------------------------------------------


class CancellationError(PhronomyError):
    """An operation or execution was cancelled before it produced its result."""


class DeadlineExceededError(CancellationError, TimeoutError):
    """A deadline or timeout passed (an execution's, an offloaded operation's)."""


class WorkflowCancelledError(CancellationError):
    """The workflow instance was cancelled (its segment's caller gets this).

    Attributes:
        workflow_instance_id: the instance.
        reason: the reason given to ``cancel``.
    """

    def __init__(
        self, message: str, *, workflow_instance_id: str, reason: str | None
    ) -> None:
        super().__init__(message)
        self.workflow_instance_id = workflow_instance_id
        self.reason = reason


class RuntimeShutdownError(PhronomyError):
    """Work was refused or cut off because the runtime (or one of its pools) is
    draining, stopping or closed."""


class ReentrancyError(PhronomyError):
    """An API was called from a thread or task where it would deadlock or break
    ownership: a runtime API from a foreign thread, a blocking wait on the runtime's
    thread, live state mutated off the dispatcher task."""


class BackpressureError(PhronomyError):
    """A bounded queue is full and the caller asked not to wait; try again later."""


# --- storage ----------------------------------------------------------------------------


class StorageError(PhronomyError):
    """Base class of the portable storage errors."""


class ConflictError(StorageError):
    """A revision or identity precondition failed (optimistic concurrency)."""


class LeaseLostError(ConflictError):
    """Another runtime took the instance over: this runtime's lease on it expired (it
    could not renew it in time) and was claimed with a newer epoch. Nothing this
    runtime writes for that segment is accepted any more; its caller gets this error.
    """


class NotFoundError(StorageError, LookupError):
    """Nothing is stored (or, for executions, live) under that id."""


class SerializationError(StorageError, ValueError):
    """A value cannot be stored faithfully (outside the JSON domain, a type that would
    not come back as itself, nested too deeply, or larger than the size limit)."""


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
    database (or one from a newer version), or its disk failed. The message names the
    store and what to do.

    A save that fails this way has an unknown outcome until it is reconciled; it is
    never reported as a conflict.

    Attributes:
        path: the database file (or address) concerned.
    """

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path
