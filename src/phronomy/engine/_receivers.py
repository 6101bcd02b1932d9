"""The receiver table: feature receivers, their queued deliveries, the admission gate."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, final

from phronomy.errors import PhronomyError, RuntimeShutdownError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from ._contracts import Delivery, Receiver
    from ._handle import ResultHandle
    from ._lifecycle import Lifecycle

__all__ = ["ReceiverTable"]

logger = logging.getLogger(__name__)


@final
class ReceiverTable:
    """Receivers registered once per key, and the deliveries queued for them.

    It tracks every caller's handle given with a delivery until that handle settles:
    the engine settles whatever is still pending before it exits, even when the work
    behind it was waiting for storage rather than sitting in the queue.
    """

    def __init__(self, lifecycle: Lifecycle, enqueue: Callable[[Any], None]) -> None:
        """Create an empty table; *enqueue* queues deliveries."""
        self._lifecycle = lifecycle
        self._enqueue = enqueue
        self._receivers: dict[object, Receiver] = {}
        self._known: set[int] = set()
        self._pending: set[Delivery] = set()
        self._dispatching: Delivery | None = None
        self._callers: set[ResultHandle[Any]] = set()
        self._untrack = self._callers.discard  # bound once: every caller's callback
        self._shut_down = False

    def __len__(self) -> int:
        """Deliveries queued or dispatching."""
        return len(self._pending)

    def get(self, key: object) -> Receiver | None:
        """The receiver registered under *key*."""
        return self._receivers.get(key)

    def register(self, key: object, receiver: Receiver) -> Receiver:
        """Register *receiver* under *key*; the first registration per key wins.

        Raises:
            RuntimeShutdownError: the engine is not running.
        """
        existing = self._receivers.get(key)
        if existing is not None:
            return existing
        if self._lifecycle.state != "running":
            raise RuntimeShutdownError(
                f"the runtime is {self._lifecycle.state}; execution receivers cannot "
                "be registered"
            )
        self._receivers[key] = receiver
        self._known.add(id(receiver))
        return receiver

    def known(self, receiver: Receiver) -> bool:
        """Whether *receiver* is registered here."""
        return id(receiver) in self._known

    def post(self, delivery: Delivery) -> bool:
        """Queue *delivery*; ``False`` when the engine does not accept it."""
        if not self._lifecycle.accepting or id(delivery.receiver) not in self._known:
            return False
        if delivery.admission and self._lifecycle.state != "running":
            return False
        if delivery.caller is not None:
            self.track(delivery.caller)
        self._pending.add(delivery)
        self._enqueue(delivery)
        return True

    def track(self, caller: ResultHandle[Any]) -> None:
        """Settle *caller* at shutdown if nothing else has (see :meth:`settle_callers`)."""
        if caller not in self._callers and not caller.done:
            self._callers.add(caller)
            caller.on_complete(self._untrack)

    def deliver(self, delivery: Delivery) -> None:
        """Hand *delivery* to its receiver (on the dispatcher); errors fail the dispatcher."""
        self._dispatching = delivery
        try:
            delivery.receiver.deliver(delivery.message)
        except Exception as exc:
            if delivery.caller is not None:
                delivery.caller.fail(exc)
            raise
        finally:
            self._dispatching = None
            self._pending.discard(delivery)

    def admit(self, receiver: Receiver) -> None:
        """The admission gate for a new execution (call from ``receiver.deliver``).

        Open while running, and while draining for a request that *receiver* queued
        with ``admission=True`` before draining began.

        Raises:
            RuntimeShutdownError: new executions are no longer accepted.
        """
        state = self._lifecycle.state
        if state == "running":
            return
        current = self._dispatching
        if (
            state == "draining"
            and current is not None
            and current.admission
            and current.receiver is receiver
        ):
            return
        raise self._lifecycle.refusal("new work")

    @property
    def idle(self) -> bool:
        """No delivery is pending and every receiver is idle."""
        return not self._pending and all(r.idle() for r in self._receivers.values())

    def describe_live(self) -> list[str]:
        """What keeps the receivers busy (for the shutdown report)."""
        described: list[str] = []
        for receiver in self._receivers.values():
            try:
                described.extend(receiver.describe_live())
            except Exception:
                logger.exception("describe_live failed")
        return described

    def fail_pending(self, queued: Iterable[Any], error: BaseException) -> None:
        """Fail the callers of deliveries that will never be dispatched."""
        for delivery in [*queued, *self._pending]:
            caller = getattr(delivery, "caller", None)
            if caller is not None:
                caller.fail(error)
        self._pending.clear()

    def shutdown(self, error: BaseException | None) -> None:
        """Shut every receiver down once (*error* on dispatcher failure)."""
        if self._shut_down:
            return
        self._shut_down = True
        for receiver in list(self._receivers.values()):
            try:
                receiver.shutdown(error)
            except Exception as exc:
                logger.exception("receiver cleanup failed")
                failure = PhronomyError(f"receiver cleanup failed: {exc!r}")
                failure.__cause__ = exc
                self._lifecycle.errors.append(failure)

    async def flush(self) -> None:
        """Let receivers finish the writes they owe (the caller's scope bounds it).

        Cancellation:
            The caller's scope bounds it; a receiver cut short is not retried.
        """
        for receiver in list(self._receivers.values()):
            try:
                await receiver.flush()
            except Exception as exc:
                logger.exception("receiver flush failed")
                exc.add_note("phronomy: raised while flushing a receiver at shutdown")
                self._lifecycle.errors.append(exc)

    def settle_callers(
        self, error_for: Callable[[ResultHandle[Any]], BaseException]
    ) -> None:
        """Fail every caller's handle still pending (the last safety net)."""
        for caller in list(self._callers):  # settling discards it from the set
            caller.fail(error_for(caller))
