"""What the engine's parts and its features expect of each other.

Sessions and receivers are written by features (workflows, supervised executions); the
engine only sees these shapes, and features only reach the engine through
:class:`Host`. Keeping both directions here leaves the engine's modules free of import
cycles.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Protocol, final

import msgspec

from ._handle import ResultHandle

if TYPE_CHECKING:
    from collections.abc import Callable

    from phronomy.errors import RuntimeShutdownError

    from ._messages import Event, SessionEnded
    from ._pool import OffloadPool
    from ._timers import TimerQueue

__all__ = ["Delivery", "Host", "Receiver", "Session"]


class Session(Protocol):
    """One incarnation of a state machine, run by the dispatcher."""

    @property
    def id(self) -> str:
        """The session's id (fresh per incarnation)."""
        ...

    def start(self) -> None:
        """Called once on the dispatcher when the session starts (FIFO order)."""
        ...

    def handle(self, event: Event) -> None:
        """Called on the dispatcher for every event targeted at the session."""
        ...

    def cut_off(self) -> BaseException:
        """The runtime is closing with the session still live.

        Stop the session (later events are ignored) and return the error its waiter
        fails with.
        """
        ...


class Receiver(Protocol):
    """Feature-owned live state retained by one engine (see ``ExecutionReceiver``)."""

    def idle(self) -> bool:
        """Whether nothing of the receiver must finish before shutdown."""
        ...

    def deliver(self, message: Any) -> None:
        """Handle a message on the dispatcher; an exception fails the dispatcher."""
        ...

    def shutdown(self, error: BaseException | None) -> None:
        """Settle and clear everything (*error* on dispatcher failure, else ``None``)."""
        ...

    async def flush(self) -> None:
        """Finish the store writes it owes, before the pools close (at shutdown).

        Cancellation:
            Bounded by the shutdown's grace deadline.
        """
        ...

    def session_retired(
        self,
        session_id: str,
        *,
        waiter: ResultHandle[Any] | None,
        error: BaseException | None,
    ) -> None:
        """A session it owns retired: its outcome is unknown (it takes over *waiter*)."""
        ...

    def describe_live(self) -> list[str]:
        """Live work that keeps it busy (for the shutdown report)."""
        ...


class Host(Protocol):
    """What sessions and receivers may ask of the engine (one direction only)."""

    @property
    def timers(self) -> TimerQueue:
        """The dispatcher-driven timer queue."""
        ...

    @property
    def default_pool(self) -> OffloadPool:
        """The default offload pool."""
        ...

    def post_nowait(self, item: Event | Delivery, *, at_once: bool = False) -> bool:
        """Queue *item* for the dispatcher (*at_once*: on it, hand an event over
        now); ``False`` when it is not accepted."""
        ...

    def at_batch_end(self, callback: Callable[[], object]) -> None:
        """Run *callback* after the dispatcher's current batch (at once elsewhere)."""
        ...

    def call_soon(self, call: Callable[[], object]) -> bool:
        """Queue *call* for the dispatcher, in FIFO order; ``False`` when not accepted."""
        ...

    def is_dispatcher(self) -> bool:
        """Whether the calling code runs on the dispatcher task."""
        ...

    def end_session(self, ended: SessionEnded) -> None:
        """A session reached its end (settles its waiter, FIFO after queued events)."""
        ...

    def admit(self, receiver: Receiver) -> None:
        """Pass the admission gate for a new execution (raises when closed)."""
        ...

    def register_session(
        self,
        session: Session,
        *,
        completion: ResultHandle[Any] | None = None,
        receiver: Receiver | None = None,
    ) -> ResultHandle[Any]:
        """Register *session*; the dispatcher starts it in FIFO order."""
        ...

    def run_session(
        self,
        session: Session,
        *,
        on_end: Callable[[SessionEnded], object],
        receiver: Receiver | None = None,
    ) -> None:
        """Register *session*; *on_end* learns how it ended (no handle)."""
        ...

    def check_thread(self, what: str) -> None:
        """Raise unless called on the runtime's trio thread."""
        ...

    def refusal(self, what: str) -> RuntimeShutdownError:
        """The error for a request (*what*) the engine no longer takes."""
        ...

    def assert_dispatcher(self) -> None:
        """Raise unless called on the dispatcher task."""
        ...

    def start_task(
        self, fn: Any, *args: Any, name: str | None = None
    ) -> ResultHandle[Any]:
        """Run ``await fn(*args)`` as a supervised trio task."""
        ...


@final
class Delivery(msgspec.Struct, frozen=True, kw_only=True, eq=False):
    """A message for a receiver, delivered by the dispatcher in FIFO order.

    Attributes:
        receiver: the registered receiver (its ``deliver`` gets *message*).
        message: any value.
        admission: whether the message may establish a new admission (refused once
            the engine drains; those queued before still run).
        caller: the handle of the caller waiting on the message's work: failed when
            the delivery fails or is cut off, and settled before the engine exits.
    """

    target_id: ClassVar[str] = ""  # never a session's id: the dispatcher routes it

    receiver: Receiver
    message: Any
    admission: bool = False
    caller: ResultHandle[Any] | None = None
