"""Durable storage: the store contract, the codec and the stores (memory, SQLite, PostgreSQL).

This layer is synchronous and imports no trio: the runtime calls stores from worker
threads.
"""

from ._base import BaseStore as BaseStore
from ._cancel import cancellation as cancellation
from ._codec import (
    DEFAULT_MAX_SNAPSHOT_BYTES as DEFAULT_MAX_SNAPSHOT_BYTES,
    FINISH_PHASE as FINISH_PHASE,
    RECORD_TYPE as RECORD_TYPE,
    SNAPSHOT_FORMAT as SNAPSHOT_FORMAT,
    DecodedSnapshot as DecodedSnapshot,
    check_json_domain as check_json_domain,
    decode_snapshot as decode_snapshot,
    decode_snapshot_builtins as decode_snapshot_builtins,
    encode_snapshot as encode_snapshot,
    normalize as normalize,
)
from ._inbox import (
    EVENT_OUTCOMES as EVENT_OUTCOMES,
    Claimed as Claimed,
    InboxEntry as InboxEntry,
    Posting as Posting,
    PostOutcome as PostOutcome,
    validate_event_id as validate_event_id,
)
from ._memory import MemoryStore as MemoryStore
from ._ops import (
    READ_OPS as READ_OPS,
    BeginOp as BeginOp,
    ClaimOp as ClaimOp,
    DeleteOp as DeleteOp,
    EntryOp as EntryOp,
    FindWriteOp as FindWriteOp,
    HistoryOp as HistoryOp,
    InboxOp as InboxOp,
    ListOp as ListOp,
    LoadOp as LoadOp,
    MarkOp as MarkOp,
    PollOp as PollOp,
    PostOp as PostOp,
    RecoverOp as RecoverOp,
    RenewOp as RenewOp,
    RequestCancelOp as RequestCancelOp,
    SaveOp as SaveOp,
    StoreOp as StoreOp,
    op_name as op_name,
)
from ._postgres import PostgresStore as PostgresStore
from ._quarantine import (
    quarantine as quarantine,
    quarantined as quarantined,
    quarantined_instances as quarantined_instances,
    release_quarantine as release_quarantine,
)
from ._records import (
    EXECUTION_KEY_PREFIX as EXECUTION_KEY_PREFIX,
    EXECUTION_KIND as EXECUTION_KIND,
    MAX_INSTANCE_ID_LENGTH as MAX_INSTANCE_ID_LENGTH,
    OPEN_STATUSES as OPEN_STATUSES,
    Consumption as Consumption,
    InboxStatus as InboxStatus,
    InstancePage as InstancePage,
    InstanceStatus as InstanceStatus,
    Lease as Lease,
    SaveLogEntry as SaveLogEntry,
    SaveOutcome as SaveOutcome,
    SaveRequest as SaveRequest,
    StoredRecord as StoredRecord,
    validate_instance_id as validate_instance_id,
)
from ._recovery import (
    resolution as resolution,
    resolve_stored as resolve_stored,
)
from ._shortcuts import MAX_LIMIT as MAX_LIMIT, check_limit as check_limit
from ._sqlite import SCHEMA_VERSION as SCHEMA_VERSION, SQLiteStore as SQLiteStore
from ._store import (
    KNOWN_FAILURES as KNOWN_FAILURES,
    SAVE_LOG_DEPTH as SAVE_LOG_DEPTH,
    WorkflowStore as WorkflowStore,
    check_not_quarantined as check_not_quarantined,
    check_startable as check_startable,
    check_workflow as check_workflow,
    classify_uncertain_save as classify_uncertain_save,
    run_op as run_op,
)

__all__ = [
    "DEFAULT_MAX_SNAPSHOT_BYTES",
    "EVENT_OUTCOMES",
    "EXECUTION_KEY_PREFIX",
    "EXECUTION_KIND",
    "FINISH_PHASE",
    "KNOWN_FAILURES",
    "MAX_INSTANCE_ID_LENGTH",
    "MAX_LIMIT",
    "OPEN_STATUSES",
    "READ_OPS",
    "RECORD_TYPE",
    "SAVE_LOG_DEPTH",
    "SCHEMA_VERSION",
    "SNAPSHOT_FORMAT",
    "BaseStore",
    "BeginOp",
    "ClaimOp",
    "Claimed",
    "Consumption",
    "DecodedSnapshot",
    "DeleteOp",
    "EntryOp",
    "FindWriteOp",
    "HistoryOp",
    "InboxEntry",
    "InboxOp",
    "InboxStatus",
    "InstancePage",
    "InstanceStatus",
    "Lease",
    "ListOp",
    "LoadOp",
    "MarkOp",
    "MemoryStore",
    "PollOp",
    "PostOp",
    "PostOutcome",
    "PostgresStore",
    "Posting",
    "RecoverOp",
    "RenewOp",
    "RequestCancelOp",
    "SQLiteStore",
    "SaveLogEntry",
    "SaveOp",
    "SaveOutcome",
    "SaveRequest",
    "StoreOp",
    "StoredRecord",
    "WorkflowStore",
    "cancellation",
    "check_json_domain",
    "check_limit",
    "check_not_quarantined",
    "check_startable",
    "check_workflow",
    "classify_uncertain_save",
    "decode_snapshot",
    "decode_snapshot_builtins",
    "encode_snapshot",
    "normalize",
    "op_name",
    "quarantine",
    "quarantined",
    "quarantined_instances",
    "release_quarantine",
    "resolution",
    "resolve_stored",
    "run_op",
    "validate_event_id",
    "validate_instance_id",
]

from phronomy._metadata import fixup_module_metadata

fixup_module_metadata(__name__, globals())
del fixup_module_metadata
