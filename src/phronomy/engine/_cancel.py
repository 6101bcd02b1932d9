"""Cancellation tokens (with an optional deadline on the trio clock)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, final

import trio

from phronomy.errors import CancellationError

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["CancellationToken"]

logger = logging.getLogger(__name__)


@final
class CancellationToken:
    """A cooperative cancellation flag with callbacks.

    :meth:`cancel` is idempotent: the first call marks the token cancelled, detaches
    the callback list and runs each callback once (a raising callback is logged and
    does not stop the others). A token may carry a deadline on the trio clock: once it
    has passed, :attr:`cancelled` is true, but callbacks only run when something calls
    :meth:`cancel` (an offload pool does, through its timer, for the operations that
    watch the token).

    Cancelling a token never interrupts running code; it only settles the results of
    the operations that watch it.
    """

    __slots__ = ("_callbacks", "_cancelled", "_deadline", "reason")

    def __init__(self, *, deadline: float | None = None) -> None:
        """Create a token.

        Args:
            deadline: optional absolute deadline on the trio clock
                (:func:`trio.current_time`).
        """
        self._cancelled = False
        self._deadline = deadline
        self._callbacks: list[Callable[[], object]] | None = []
        self.reason: str | None = None

    @classmethod
    def after(cls, seconds: float) -> CancellationToken:
        """Return a token whose deadline is *seconds* from now (trio clock)."""
        return cls(deadline=trio.current_time() + seconds)

    @property
    def deadline(self) -> float | None:
        """The absolute deadline on the trio clock, or ``None``."""
        return self._deadline

    @property
    def cancelled(self) -> bool:
        """Whether :meth:`cancel` was called or the deadline has passed."""
        if self._cancelled:
            return True
        return self._deadline is not None and trio.current_time() >= self._deadline

    def remaining(self) -> float | None:
        """Seconds until the deadline (floor 0), or ``None`` without a deadline."""
        if self._deadline is None:
            return None
        return max(self._deadline - trio.current_time(), 0.0)

    def cancel(self, reason: str = "cancelled") -> bool:
        """Cancel the token; returns whether this call changed it."""
        if self._cancelled:
            return False
        self._cancelled = True
        self.reason = reason
        callbacks, self._callbacks = self._callbacks, None
        for callback in callbacks or ():
            try:
                callback()
            except Exception:
                logger.exception("cancellation callback failed")
        return True

    def on_cancel(self, callback: Callable[[], object]) -> None:
        """Run *callback* once when the token is cancelled (at once if it already is).

        Callbacks must be idempotent: a concurrent :meth:`cancel` may already have taken
        the list when :meth:`remove_callback` runs.
        """
        if self._callbacks is None:
            callback()
        else:
            self._callbacks.append(callback)

    def remove_callback(self, callback: Callable[[], object]) -> None:
        """Detach *callback* if it is still registered."""
        if self._callbacks is not None and callback in self._callbacks:
            self._callbacks.remove(callback)

    def raise_if_cancelled(self, message: str = "operation cancelled") -> None:
        """Raise :class:`~phronomy.CancellationError` when the token is cancelled."""
        if self.cancelled:
            raise CancellationError(message)
