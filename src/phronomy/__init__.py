"""phronomy: durable, resumable state-machine workflows and supervised executions for trio.

The names most programs need are here. The rest of the public API lives in
``phronomy.workflow`` (clients, streams, recovery views), ``phronomy.agent``
(supervised executions), ``phronomy.storage`` (stores and their records),
``phronomy.errors`` (the error tree), ``phronomy.testing`` (fault injection) and
``phronomy.lowlevel`` (the engine underneath, for extending phronomy).
"""

import logging

from .agent import (
    Approval as Approval,
    ApprovalRequest as ApprovalRequest,
    ExecutionResult as ExecutionResult,
)
from .engine import ResultHandle as ResultHandle, ShutdownResult as ShutdownResult
from .errors import (
    AmbiguousEventError as AmbiguousEventError,
    BackpressureError as BackpressureError,
    BusyError as BusyError,
    CancellationError as CancellationError,
    ConflictError as ConflictError,
    CorruptRecordError as CorruptRecordError,
    DeadlineExceededError as DeadlineExceededError,
    DefinitionError as DefinitionError,
    DefinitionMismatchError as DefinitionMismatchError,
    DefinitionWarning as DefinitionWarning,
    EventRejectedError as EventRejectedError,
    InstanceExistsError as InstanceExistsError,
    InstanceStateError as InstanceStateError,
    InvalidActionResultError as InvalidActionResultError,
    InvalidInputError as InvalidInputError,
    LeaseLostError as LeaseLostError,
    NonRetryableError as NonRetryableError,
    NotFoundError as NotFoundError,
    OperatorActionError as OperatorActionError,
    PhronomyError as PhronomyError,
    PhronomyInternalError as PhronomyInternalError,
    RecoveryRequiredError as RecoveryRequiredError,
    ReentrancyError as ReentrancyError,
    RuntimeShutdownError as RuntimeShutdownError,
    SerializationError as SerializationError,
    StoreUnavailableError as StoreUnavailableError,
    TransientError as TransientError,
    TransitionError as TransitionError,
    UsageError as UsageError,
    WorkflowCancelledError as WorkflowCancelledError,
)
from .runtime import Runtime as Runtime, open_runtime as open_runtime
from .storage import (
    MemoryStore as MemoryStore,
    PostgresStore as PostgresStore,
    SQLiteStore as SQLiteStore,
)
from .workflow import (
    APPEND as APPEND,
    CONSUME as CONSUME,
    FINISH as FINISH,
    MERGE as MERGE,
    REPLACE as REPLACE,
    Effects as Effects,
    RetryPolicy as RetryPolicy,
    State as State,
    Step as Step,
    Workflow as Workflow,
    WorkflowDefinition as WorkflowDefinition,
    WorkflowResult as WorkflowResult,
)

__version__ = "0.1.0"

__all__ = [
    "APPEND",
    "CONSUME",
    "FINISH",
    "MERGE",
    "REPLACE",
    "AmbiguousEventError",
    "Approval",
    "ApprovalRequest",
    "BackpressureError",
    "BusyError",
    "CancellationError",
    "ConflictError",
    "CorruptRecordError",
    "DeadlineExceededError",
    "DefinitionError",
    "DefinitionMismatchError",
    "DefinitionWarning",
    "Effects",
    "EventRejectedError",
    "ExecutionResult",
    "InstanceExistsError",
    "InstanceStateError",
    "InvalidActionResultError",
    "InvalidInputError",
    "LeaseLostError",
    "MemoryStore",
    "NonRetryableError",
    "NotFoundError",
    "OperatorActionError",
    "PhronomyError",
    "PhronomyInternalError",
    "PostgresStore",
    "RecoveryRequiredError",
    "ReentrancyError",
    "ResultHandle",
    "RetryPolicy",
    "Runtime",
    "RuntimeShutdownError",
    "SQLiteStore",
    "SerializationError",
    "ShutdownResult",
    "State",
    "Step",
    "StoreUnavailableError",
    "TransientError",
    "TransitionError",
    "UsageError",
    "Workflow",
    "WorkflowCancelledError",
    "WorkflowDefinition",
    "WorkflowResult",
    "__version__",
    "open_runtime",
]

from ._metadata import fixup_module_metadata

fixup_module_metadata(__name__, globals())
del fixup_module_metadata

logging.getLogger(__name__).addHandler(logging.NullHandler())
