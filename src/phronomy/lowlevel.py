"""The engine underneath the runtime, for code that extends phronomy (as ``trio.lowlevel``).

Most programs never need this module: :func:`phronomy.open_runtime` runs an engine and
the workflow and execution features on it. Here are the parts a new feature is built
from: the engine and its dispatcher, sessions with a terminal gate, receivers with an
admission gate, the admission table, offload pools, timers and cancellation tokens.
"""

from ._portal import ThreadPortal as ThreadPortal
from ._telemetry import TelemetryProviders as TelemetryProviders
from .engine import (
    Admission as Admission,
    AdmissionTable as AdmissionTable,
    CancellationToken as CancellationToken,
    Delivery as Delivery,
    Engine as Engine,
    EngineConfig as EngineConfig,
    EngineStatistics as EngineStatistics,
    Event as Event,
    ExecutionReceiver as ExecutionReceiver,
    GatedSession as GatedSession,
    Host as Host,
    OffloadPool as OffloadPool,
    PoolStatistics as PoolStatistics,
    Receiver as Receiver,
    Session as Session,
    SessionEnded as SessionEnded,
    TerminalDecision as TerminalDecision,
    TerminalPolicy as TerminalPolicy,
    Timer as Timer,
    TimerQueue as TimerQueue,
    open_engine as open_engine,
)

__all__ = [
    "Admission",
    "AdmissionTable",
    "CancellationToken",
    "Delivery",
    "Engine",
    "EngineConfig",
    "EngineStatistics",
    "Event",
    "ExecutionReceiver",
    "GatedSession",
    "Host",
    "OffloadPool",
    "PoolStatistics",
    "Receiver",
    "Session",
    "SessionEnded",
    "TelemetryProviders",
    "TerminalDecision",
    "TerminalPolicy",
    "ThreadPortal",
    "Timer",
    "TimerQueue",
    "open_engine",
]

from ._metadata import fixup_module_metadata

fixup_module_metadata(__name__, globals())
del fixup_module_metadata
