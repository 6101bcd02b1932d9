"""The errors phronomy raises on purpose, as one small tree grouped by what the caller
does about them.

::

    PhronomyError                           (every error: .instance_id when one instance
    │                                        is concerned, else None)
    ├── UsageError                          FIX THE CALL: nothing ran, nothing changed
    │   ├── InvalidInputError (ValueError)  an argument is wrong: an id, an event name,
    │   │   │                               a state field, a setting (the message names it)
    │   │   ├── AmbiguousEventError         resume() at a state with several events
    │   │   └── SerializationError          a value cannot be stored faithfully
    │   ├── DefinitionError (ValueError)    a workflow definition is invalid (at build)
    │   │   └── DefinitionMismatchError     a stored instance needs what the definition
    │   │                                   lacks (another version saved it)
    │   ├── TransitionError (ValueError)    an event cannot fire from the current state,
    │   │                                   or a chain of automatic transitions ran away
    │   ├── InvalidActionResultError (TypeError)  an action returned what it must not
    │   ├── InstanceStateError (ValueError) the instance or execution is not in a state
    │   │   │                               that accepts the request (finished, ...)
    │   │   └── InstanceExistsError         a start names an instance the store holds
    │   ├── EventRejectedError              every guard rejected the event; nothing changed
    │   ├── NotFoundError (LookupError)     nothing is stored (or live) under that id
    │   └── ReentrancyError                 called from a thread or task that may not
    ├── TransientError                      RETRY LATER: nothing was done, or what was
    │   │                                   done is settled by the runtime
    │   ├── BusyError                       the id has a live segment or execution
    │   ├── BackpressureError               a bounded queue is full
    │   ├── ConflictError                   the stored revision moved on: reload, retry
    │   │   └── LeaseLostError              another runtime took the instance over
    │   ├── StoreUnavailableError           the store cannot be opened, read or written
    │   └── RuntimeShutdownError            refused or cut off: the runtime is closing
    ├── CancellationError                   CANCELLED before it produced its result
    │   ├── DeadlineExceededError (TimeoutError)  ... because its deadline passed
    │   └── WorkflowCancelledError          ... a workflow instance, by cancel()
    ├── OperatorActionError                 AN OPERATOR MUST ACT before it runs again
    │   ├── RecoveryRequiredError           a durable write's outcome is unknown
    │   └── CorruptRecordError              a stored record does not decode
    └── PhronomyInternalError               A BUG in phronomy: please report it

    DefinitionWarning (UserWarning)         a definition builds but is probably wrong
    NonRetryableError                       raised by an effect (the application's, no
                                            PhronomyError): it is not tried again

Errors caused by bad input also derive from :class:`ValueError` (or
:class:`TypeError`, :class:`LookupError`), so callers that only know the standard
library still catch them.

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
    "DefinitionWarning",
    "EventRejectedError",
    "InstanceExistsError",
    "InstanceStateError",
    "InvalidActionResultError",
    "InvalidInputError",
    "LeaseLostError",
    "NonRetryableError",
    "NotFoundError",
    "OperatorActionError",
    "PhronomyError",
    "PhronomyInternalError",
    "RecoveryRequiredError",
    "ReentrancyError",
    "RuntimeShutdownError",
    "SerializationError",
    "StoreUnavailableError",
    "TransientError",
    "TransitionError",
    "UsageError",
    "WorkflowCancelledError",
]


class NonRetryableError(Exception):
    """Raise it (or a subclass) from an effect to end its retries at once: its
    ``on_error`` event fires with it (see :class:`~phronomy.RetryPolicy`).

    It is the application's error, not one phronomy raises: it is no
    :class:`PhronomyError`.
    """


class PhronomyError(Exception):
    """Base class of every error phronomy raises on purpose.

    Attributes:
        instance_id: the workflow instance (or execution key) the error concerns, or
            ``None`` when it concerns no single instance.
    """

    def __init__(self, *args: object, instance_id: str | None = None) -> None:
        super().__init__(*args)
        self.instance_id = instance_id


# --- the groups: what the caller does -------------------------------------------------


class UsageError(PhronomyError):
    """Fix the call (or the definition): nothing ran and nothing changed."""


class TransientError(PhronomyError):
    """Retry later: nothing was done, or what was done is settled by the runtime (an
    unknown write outcome is reconciled, a stopped runtime's instances are put back)."""


class OperatorActionError(PhronomyError):
    """An operator must act (inspect, resolve, repair) before the instance runs again."""


class PhronomyInternalError(PhronomyError):
    """A bug in phronomy itself: please report it with the traceback."""


class DefinitionWarning(UserWarning):
    """A workflow definition builds but is probably wrong (for example states that no
    transition from the entry point reaches). Shown by default, as every
    :class:`UserWarning`; turn it into an error with
    ``-W error::phronomy.DefinitionWarning``.
    """


# --- fix the call ----------------------------------------------------------------------


class InvalidInputError(UsageError, ValueError):
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

    def __init__(
        self,
        message: str,
        *,
        candidates: tuple[str, ...],
        instance_id: str | None = None,
    ) -> None:
        super().__init__(message, instance_id=instance_id)
        self.candidates = candidates


class SerializationError(InvalidInputError):
    """A value cannot be stored faithfully (outside the JSON domain, a type that would
    not come back as itself, nested too deeply, or larger than the size limit); nothing
    was written."""


class DefinitionError(UsageError, ValueError):
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
        instance_id: str | None = None,
    ) -> None:
        super().__init__(message, instance_id=instance_id)
        self.stored_version = stored_version
        self.version = version
        self.missing = missing


class TransitionError(UsageError, ValueError):
    """An event cannot fire from the current state.

    Also raised when every automatic transition's guard rejects (the state could never
    be left) and when a segment exceeds its recursion limit.
    """


class InvalidActionResultError(UsageError, TypeError):
    """An action, guard or hook returned something it must not return.

    Actions return a new state or ``None``: a returned ``dict`` is rejected instead of
    being silently ignored, and so is an awaitable or a result handle (callbacks are
    synchronous; start async work with effects).
    """


class InstanceStateError(UsageError, ValueError):
    """The instance or execution is not in a state that accepts the request.

    For example an event sent to a finished or cancelled instance, an approval for an
    execution that is not waiting for one, or an effect started after its segment
    ended. The message says what state it is in and what would work instead.
    """


class InstanceExistsError(InstanceStateError):
    """A start names an instance the store holds (with a durable state).

    Continue it with ``send_event``, or start with ``if_exists="return"`` (its stored
    result) or ``if_exists="restart"``.

    Attributes:
        status: its stored status.
        phase: its stored phase.
        revision: its stored revision.
    """

    def __init__(
        self,
        message: str,
        *,
        instance_id: str,
        status: str,
        phase: str | None,
        revision: int,
    ) -> None:
        super().__init__(message, instance_id=instance_id)
        self.status = status
        self.phase = phase
        self.revision = revision


class EventRejectedError(UsageError):
    """Every guard of the event rejected it at the halted state; nothing changed.

    The segment ended at once without a save: the instance is still halted at *phase*
    (at *revision*) and can take the next event.

    Attributes:
        event: the rejected event.
        phase: the state the instance is still halted at.
        revision: its durable revision (``None`` for ephemeral instances).
    """

    def __init__(
        self,
        message: str,
        *,
        instance_id: str,
        event: str,
        phase: str,
        revision: int | None,
    ) -> None:
        super().__init__(message, instance_id=instance_id)
        self.event = event
        self.phase = phase
        self.revision = revision


class NotFoundError(UsageError, LookupError):
    """Nothing is stored (or, for executions, live) under that id."""


class ReentrancyError(UsageError):
    """An API was called from a thread or task where it would deadlock or break
    ownership: a runtime API from a foreign thread, a blocking wait on the runtime's
    thread, live state mutated off the dispatcher task."""


# --- retry later -----------------------------------------------------------------------


class BusyError(TransientError):
    """The id already has a live execution segment (a workflow instance) or a
    nonterminal top-level execution (an agent), in this runtime or in another one."""


class BackpressureError(TransientError):
    """A bounded queue is full and the caller asked not to wait; try again later."""


class ConflictError(TransientError):
    """A revision or identity precondition failed (optimistic concurrency): the stored
    instance moved on; reload it and decide again."""


class LeaseLostError(ConflictError):
    """Another runtime took the instance over: this runtime's lease on it expired (it
    could not renew it in time) and was claimed with a newer epoch. Nothing this
    runtime writes for that segment is accepted any more; its caller gets this error.
    """


class StoreUnavailableError(TransientError):
    """The store cannot be used: it cannot be opened or written, is not a phronomy
    database (or one from a newer version), or its disk failed. The message names the
    store and what to do.

    A save that fails this way has an unknown outcome until it is reconciled; it is
    never reported as a conflict.

    Attributes:
        path: the database file (or address) concerned.
    """

    def __init__(
        self, message: str, *, path: str, instance_id: str | None = None
    ) -> None:
        super().__init__(message, instance_id=instance_id)
        self.path = path


class RuntimeShutdownError(TransientError):
    """Work was refused or cut off because the runtime (or one of its pools) is
    draining, stopping or closed; what was durable stays resumable."""


# --- cancelled -------------------------------------------------------------------------


class CancellationError(PhronomyError):
    """An operation or execution was cancelled before it produced its result."""


class DeadlineExceededError(CancellationError, TimeoutError):
    """A deadline or timeout passed (an execution's, an offloaded operation's)."""


class WorkflowCancelledError(CancellationError):
    """The workflow instance was cancelled (its segment's caller gets this).

    Attributes:
        reason: the reason given to ``cancel``.
    """

    def __init__(self, message: str, *, instance_id: str, reason: str | None) -> None:
        super().__init__(message, instance_id=instance_id)
        self.reason = reason


# --- an operator must act --------------------------------------------------------------


class RecoveryRequiredError(OperatorActionError):
    """The outcome of a durable write is unknown; an operator must resolve it
    (``runtime.recovery.resolve`` or ``python -m phronomy instances resolve``)."""


class CorruptRecordError(OperatorActionError):
    """A stored record does not decode: truncated, malformed, or of an unknown format.

    Attributes:
        revision: the record's revision.
    """

    def __init__(self, message: str, *, instance_id: str, revision: int) -> None:
        super().__init__(message, instance_id=instance_id)
        self.revision = revision
