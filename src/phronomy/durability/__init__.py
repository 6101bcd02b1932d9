"""Durability: the runtime's one service between its features and its store."""

from ._leases import (
    HeldLease as HeldLease,
    LeaseListener as LeaseListener,
    Leases as Leases,
    LeaseSettings as LeaseSettings,
)
from ._service import (
    DurabilityService as DurabilityService,
    DurabilityStatistics as DurabilityStatistics,
    RecordKind as RecordKind,
    kind_of as kind_of,
    mark_op as mark_op,
    queued as queued,
    save_outcome as save_outcome,
)

__all__ = [
    "DurabilityService",
    "DurabilityStatistics",
    "HeldLease",
    "LeaseListener",
    "LeaseSettings",
    "Leases",
    "RecordKind",
    "kind_of",
    "mark_op",
    "queued",
    "save_outcome",
]

from phronomy._metadata import fixup_module_metadata

fixup_module_metadata(__name__, globals())
del fixup_module_metadata
