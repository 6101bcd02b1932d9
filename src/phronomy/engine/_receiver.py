"""The execution-receiver base: feature-owned live state retained by one engine."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import trio

from ._contracts import Delivery

if TYPE_CHECKING:
    from ._contracts import Host
    from ._handle import ResultHandle

__all__ = ["ExecutionReceiver"]


class ExecutionReceiver:
    """Base class of features' coordinators (workflows, supervised executions).

    A receiver is registered once per key on an engine (:meth:`Engine.receiver
    <phronomy.lowlevel.Engine.receiver>`). The engine delivers its messages on the
    dispatcher task (:meth:`deliver`), counts them for idleness, asks :meth:`idle`
    before shutting down, and calls :meth:`shutdown` exactly once: on the failing
    dispatcher (with the error) or after the dispatcher stopped (with ``None``); then
    :meth:`flush` before its pools close.

    Subclasses mutate their state only on the dispatcher; :meth:`assert_dispatcher`
    enforces it. They reach the engine only through its :class:`Host` interface.

    Attributes:
        engine: the engine this receiver is bound to (an attribute: features read
            it on every request).
    """

    def __init__(self, engine: Host) -> None:
        """Bind the receiver to *engine* (registration is separate)."""
        self.engine: Final[Host] = engine

    # --- required ----------------------------------------------------------------------

    def idle(self) -> bool:
        """Whether nothing of this receiver must finish before shutdown (short, pure)."""
        raise NotImplementedError

    def deliver(self, message: Any) -> None:
        """Handle *message* on the dispatcher. An exception here fails the dispatcher."""
        raise NotImplementedError

    def shutdown(self, error: BaseException | None) -> None:
        """Settle and clear everything: *error* on dispatcher failure, else ``None``."""
        raise NotImplementedError

    # --- optional ----------------------------------------------------------------------

    async def flush(self) -> None:
        """Finish the writes the receiver owes before the runtime's pools close.

        Called once at shutdown, after :meth:`shutdown` and before the offload pools
        close (for example status marks of work that was cut off). The runtime's
        cancel scope bounds the wait with the shutdown's grace deadline.

        Cancellation:
            The runtime's cancel scope bounds the wait (the shutdown's grace deadline).
        """
        await trio.lowlevel.checkpoint()

    def session_retired(
        self,
        session_id: str,
        *,
        waiter: ResultHandle[Any] | None,
        error: BaseException | None,
    ) -> None:
        """A session owned by this receiver retired: its terminal outcome is unknown.

        The engine hands over the session's unsettled *waiter* and the *error* that made
        the outcome unknown; the receiver decides when (and how) its caller settles.
        """

    def describe_live(self) -> list[str]:
        """Describe live work that keeps the receiver busy (for shutdown reports)."""
        return []

    # --- helpers -----------------------------------------------------------------------

    def post_message(
        self,
        message: Any,
        *,
        admission: bool = False,
        completion: ResultHandle[Any] | None = None,
    ) -> bool:
        """Queue *message* for :meth:`deliver` (see ``Engine.post_nowait``).

        Args:
            message: any value.
            admission: ``True`` for requests that may establish a new admission.
            completion: the caller's handle, failed if the delivery fails or is cut off.

        Returns:
            Whether the message was queued.
        """
        return self.engine.post_nowait(
            Delivery(
                receiver=self, message=message, admission=admission, caller=completion
            )
        )

    def admit(self) -> None:
        """Pass the engine's admission gate (see ``Engine.admit``)."""
        self.engine.admit(self)

    def assert_dispatcher(self) -> None:
        """Raise :class:`~phronomy.ReentrancyError` off the dispatcher task."""
        self.engine.assert_dispatcher()
