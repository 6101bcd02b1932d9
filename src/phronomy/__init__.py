"""phronomy: durable, resumable state-machine workflows and supervised executions for trio.

The public API is re-exported here; implementation lives in the layered packages
``phronomy.storage``, ``phronomy.engine``, ``phronomy.workflow`` and ``phronomy.agent``.
"""

import logging

from ._portal import ThreadPortal as ThreadPortal
from .agent import (
    Approval as Approval,
    ApprovalRequest as ApprovalRequest,
    ExecutionHandle as ExecutionHandle,
    ExecutionOwner as ExecutionOwner,
    ExecutionRecord as ExecutionRecord,
    ExecutionResult as ExecutionResult,
    Executions as Executions,
    StaleExecution as StaleExecution,
    StepContext as StepContext,
)
from .engine import (
    CancellationToken as CancellationToken,
    Engine as Engine,
    EngineStatistics as EngineStatistics,
    OffloadPool as OffloadPool,
    PoolStatistics as PoolStatistics,
    ResultHandle as ResultHandle,
    ShutdownResult as ShutdownResult,
    open_engine as open_engine,
)
from .errors import (
    BackpressureError as BackpressureError,
    BusyError as BusyError,
    CancellationError as CancellationError,
    ConflictError as ConflictError,
    CorruptRecordError as CorruptRecordError,
    DeadlineExceededError as DeadlineExceededError,
    DefinitionError as DefinitionError,
    EventRejectedError as EventRejectedError,
    InstanceStateError as InstanceStateError,
    InvalidActionResultError as InvalidActionResultError,
    InvalidInputError as InvalidInputError,
    NotFoundError as NotFoundError,
    PhronomyError as PhronomyError,
    PhronomyInternalError as PhronomyInternalError,
    RecoveryRequiredError as RecoveryRequiredError,
    ReentrancyError as ReentrancyError,
    RuntimeShutdownError as RuntimeShutdownError,
    SerializationError as SerializationError,
    StorageError as StorageError,
    StoreUnavailableError as StoreUnavailableError,
    TransitionError as TransitionError,
)
from .runtime import Runtime as Runtime, open_runtime as open_runtime
from .storage import (
    InstanceStatus as InstanceStatus,
    MemoryStore as MemoryStore,
    SQLiteStore as SQLiteStore,
    StoredRecord as StoredRecord,
    WorkflowStore as WorkflowStore,
)
from .workflow import (
    APPEND as APPEND,
    CONSUME as CONSUME,
    FINISH as FINISH,
    MERGE as MERGE,
    REPLACE as REPLACE,
    Effects as Effects,
    InstanceView as InstanceView,
    RecoveryEntry as RecoveryEntry,
    State as State,
    Step as Step,
    Workflow as Workflow,
    WorkflowDefinition as WorkflowDefinition,
    WorkflowResult as WorkflowResult,
    WorkflowStream as WorkflowStream,
)

__version__ = "0.1.0"

__all__ = [
    "APPEND",
    "CONSUME",
    "FINISH",
    "MERGE",
    "REPLACE",
    "Approval",
    "ApprovalRequest",
    "BackpressureError",
    "BusyError",
    "CancellationError",
    "CancellationToken",
    "ConflictError",
    "CorruptRecordError",
    "DeadlineExceededError",
    "DefinitionError",
    "Effects",
    "Engine",
    "EngineStatistics",
    "EventRejectedError",
    "ExecutionHandle",
    "ExecutionOwner",
    "ExecutionRecord",
    "ExecutionResult",
    "Executions",
    "InstanceStateError",
    "InstanceStatus",
    "InstanceView",
    "InvalidActionResultError",
    "InvalidInputError",
    "MemoryStore",
    "NotFoundError",
    "OffloadPool",
    "PhronomyError",
    "PhronomyInternalError",
    "PoolStatistics",
    "RecoveryEntry",
    "RecoveryRequiredError",
    "ReentrancyError",
    "ResultHandle",
    "Runtime",
    "RuntimeShutdownError",
    "SQLiteStore",
    "SerializationError",
    "ShutdownResult",
    "StaleExecution",
    "State",
    "Step",
    "StepContext",
    "StorageError",
    "StoreUnavailableError",
    "StoredRecord",
    "ThreadPortal",
    "TransitionError",
    "Workflow",
    "WorkflowDefinition",
    "WorkflowResult",
    "WorkflowStore",
    "WorkflowStream",
    "__version__",
    "open_engine",
    "open_runtime",
]

from ._metadata import fixup_module_metadata

fixup_module_metadata(__name__, globals())
del fixup_module_metadata

logging.getLogger(__name__).addHandler(logging.NullHandler())
