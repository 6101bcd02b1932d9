"""The generic runtime engine: dispatcher, sessions, receivers, supervision, shutdown.

The engine knows nothing about workflows or supervised executions; those features
plug in as :class:`ExecutionReceiver` subclasses and :class:`GatedSession` sessions,
and reach the engine only through :class:`Host`. Its public face is
:mod:`phronomy.lowlevel`.
"""

from ._admissions import Admission as Admission, AdmissionTable as AdmissionTable
from ._batcher import Batcher as Batcher
from ._cancel import CancellationToken as CancellationToken
from ._config import EngineConfig as EngineConfig
from ._contracts import (
    Delivery as Delivery,
    Host as Host,
    Receiver as Receiver,
    Session as Session,
)
from ._engine import Engine as Engine
from ._handle import (
    Caller as Caller,
    HandleStatus as HandleStatus,
    ResultHandle as ResultHandle,
    tracked as tracked,
)
from ._ids import random_hex as random_hex, random_uuid as random_uuid
from ._messages import (
    DispatcherStatus as DispatcherStatus,
    EngineStatistics as EngineStatistics,
    Event as Event,
    LifecycleState as LifecycleState,
    PoolStatistics as PoolStatistics,
    SessionEnded as SessionEnded,
    SessionOutcome as SessionOutcome,
    ShutdownResult as ShutdownResult,
)
from ._open import open_engine as open_engine
from ._pool import OffloadPool as OffloadPool
from ._receiver import ExecutionReceiver as ExecutionReceiver
from ._session import (
    EventSink as EventSink,
    GatedSession as GatedSession,
    SessionLifecycle as SessionLifecycle,
    TerminalDecision as TerminalDecision,
    TerminalPolicy as TerminalPolicy,
    TerminalType as TerminalType,
)
from ._timers import Timer as Timer, TimerQueue as TimerQueue

__all__ = [
    "Admission",
    "AdmissionTable",
    "Batcher",
    "Caller",
    "CancellationToken",
    "Delivery",
    "DispatcherStatus",
    "Engine",
    "EngineConfig",
    "EngineStatistics",
    "Event",
    "EventSink",
    "ExecutionReceiver",
    "GatedSession",
    "HandleStatus",
    "Host",
    "LifecycleState",
    "OffloadPool",
    "PoolStatistics",
    "Receiver",
    "ResultHandle",
    "Session",
    "SessionEnded",
    "SessionLifecycle",
    "SessionOutcome",
    "ShutdownResult",
    "TerminalDecision",
    "TerminalPolicy",
    "TerminalType",
    "Timer",
    "TimerQueue",
    "open_engine",
    "random_hex",
    "random_uuid",
    "tracked",
]

from phronomy._metadata import fixup_module_metadata

fixup_module_metadata(__name__, globals())
del fixup_module_metadata
