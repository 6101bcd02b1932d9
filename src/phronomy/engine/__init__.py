"""The generic runtime engine: dispatcher, offload pools, result handles, timers, sessions.

The engine knows nothing about workflows or supervised executions; those features
plug in as :class:`ExecutionReceiver` subclasses and :class:`GatedSession` sessions.
"""

from ._batcher import Batcher as Batcher
from ._cancel import CancellationToken as CancellationToken, Deadline as Deadline
from ._engine import (
    Engine as Engine,
    EngineConfig as EngineConfig,
    ShutdownParticipant as ShutdownParticipant,
    open_engine as open_engine,
)
from ._handle import (
    HandleStatus as HandleStatus,
    ResultHandle as ResultHandle,
    Settled as Settled,
)
from ._ids import random_hex as random_hex, random_uuid as random_uuid
from ._messages import (
    SYSTEM_CHANNEL as SYSTEM_CHANNEL,
    DispatcherStatus as DispatcherStatus,
    EngineStatistics as EngineStatistics,
    Event as Event,
    LifecycleState as LifecycleState,
    PoolStatistics as PoolStatistics,
    SessionOutcome as SessionOutcome,
    ShutdownResult as ShutdownResult,
)
from ._pool import OffloadPool as OffloadPool
from ._receiver import ExecutionReceiver as ExecutionReceiver
from ._session import (
    EventSink as EventSink,
    GatedSession as GatedSession,
    Session as Session,
    SessionLifecycle as SessionLifecycle,
    TerminalDecision as TerminalDecision,
    TerminalPolicy as TerminalPolicy,
    TerminalType as TerminalType,
)
from ._timers import Timer as Timer, TimerQueue as TimerQueue

__all__ = [
    "SYSTEM_CHANNEL",
    "Batcher",
    "CancellationToken",
    "Deadline",
    "DispatcherStatus",
    "Engine",
    "EngineConfig",
    "EngineStatistics",
    "Event",
    "EventSink",
    "ExecutionReceiver",
    "GatedSession",
    "HandleStatus",
    "LifecycleState",
    "OffloadPool",
    "PoolStatistics",
    "ResultHandle",
    "Session",
    "SessionLifecycle",
    "SessionOutcome",
    "Settled",
    "ShutdownParticipant",
    "ShutdownResult",
    "TerminalDecision",
    "TerminalPolicy",
    "TerminalType",
    "Timer",
    "TimerQueue",
    "open_engine",
    "random_hex",
    "random_uuid",
]

from phronomy._metadata import fixup_module_metadata

fixup_module_metadata(__name__, globals())
del fixup_module_metadata
