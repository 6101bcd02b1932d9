"""Result handles: the caller-facing completion value of every asynchronous operation."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeVar, final

import trio

from phronomy.errors import CancellationError

from ._thread_guard import foreign_thread_error

if TYPE_CHECKING:
    from collections.abc import Callable

    _Callback = Callable[["ResultHandle[T]"], object]

__all__ = ["Caller", "HandleStatus", "ResultHandle", "tracked"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
T_contra = TypeVar("T_contra", contravariant=True)

HandleStatus = Literal["pending", "completed", "failed", "cancelled"]


class Caller(Protocol[T_contra]):
    """Whoever waits for a request's outcome: settled once, the first settlement wins.

    A :class:`ResultHandle` is one. A feature that owns its requests' callers may
    pass a lighter object of its own instead (the executions' driver does, for the
    first segment of each execution); such a caller is not tracked by the engine (see
    :func:`tracked`), so its owner must settle it, or stop waiting for it, when the
    runtime shuts down.
    """

    @property
    def done(self) -> bool:
        """Whether it is settled."""
        ...

    def complete(self, value: T_contra) -> bool:
        """Settle it with *value*; returns whether this call settled it."""
        ...

    def fail(self, error: BaseException) -> bool:
        """Settle it with *error*; returns whether this call settled it."""
        ...

    def cancel(self, error: BaseException | None = None) -> bool:
        """Settle it as cancelled; returns whether this call settled it."""
        ...


def tracked(caller: Caller[Any]) -> ResultHandle[Any] | None:
    """*caller* as the engine's deliveries take it: a handle, which shutdown settles if
    nothing else has, or ``None`` for a stand-in its owner settles."""
    return caller if type(caller) is ResultHandle else None


@final
class ResultHandle(Generic[T]):
    """A completion handle: pending, then settled exactly once.

    The first settlement (:meth:`complete`, :meth:`fail` or :meth:`cancel`) wins;
    later ones return ``False`` and change nothing. Callbacks registered with
    :meth:`on_complete` run once, in registration order, on whatever task settles the
    handle; a callback that raises is logged and does not affect the others.

    Trio tasks wait with ``await handle.wait()`` or ``await handle.result()``. Waiting
    is waiter-local: put a ``trio.fail_after`` around it to bound the wait; the handle
    itself is not changed when the waiter gives up.

    Handles returned by offload pools also track *physical* completion: the worker
    thread may still be running after the handle was settled by a timeout or a
    cancellation. :attr:`physically_complete` and :meth:`wait_physical` report it.

    Thread-safety: settle, wait and register callbacks only on the thread that created
    the handle (the runtime's trio thread); from any other thread these raise
    :class:`~phronomy.ReentrancyError` before changing anything. :attr:`status` and
    :attr:`done` may be read from any thread.
    """

    __slots__ = (
        "_callbacks",
        "_children",
        "_error",
        "_event",
        "_name",
        "_physical_callbacks",
        "_physical_done",
        "_physical_event",
        "_status",
        "_thread",
        "_tracks_physical",
        "_value",
    )

    def __init__(
        self,
        name: str = "result",
        *,
        parent: ResultHandle[Any] | None = None,
        tracks_physical: bool = False,
    ) -> None:
        """Create a pending handle.

        Args:
            name: shown in messages and ``repr``.
            parent: cancelling *parent* (when it changes state) cancels this handle.
            tracks_physical: ``True`` when physical completion is reported separately
                (by the offload pool) instead of coinciding with settlement.
        """
        self._name = name
        self._thread = threading.get_ident()
        self._status: HandleStatus = "pending"
        self._value: Any = None
        self._error: BaseException | None = None
        # () until a callback comes, then the callback itself, a list from the second
        # on; None once settled: most handles get one callback or none, and a list
        # each was an object more for the cyclic GC
        self._callbacks: _Callback[T] | list[_Callback[T]] | tuple[()] | None = ()
        self._event: trio.Event | None = None
        self._children: list[ResultHandle[Any]] | None = None
        self._tracks_physical = tracks_physical
        self._physical_done = False
        self._physical_callbacks: (
            list[Callable[[ResultHandle[T]], object]] | tuple[()] | None
        ) = () if tracks_physical else None
        self._physical_event: trio.Event | None = None
        if parent is not None:
            parent._add_child(self)  # noqa: SLF001 - same class

    # --- factories -----------------------------------------------------------------

    @classmethod
    def completed(cls, value: T, name: str = "result") -> ResultHandle[T]:
        """Return a handle already completed with *value*."""
        handle: ResultHandle[T] = cls(name)
        handle.complete(value)
        return handle

    @classmethod
    def failed(cls, error: BaseException, name: str = "result") -> ResultHandle[T]:
        """Return a handle already failed with *error*.

        Raises:
            TypeError: *error* is not an exception instance.
        """
        handle: ResultHandle[T] = cls(name)
        handle.fail(error)
        return handle

    # --- reading -------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The handle's name."""
        return self._name

    @property
    def status(self) -> HandleStatus:
        """``pending``, ``completed``, ``failed`` or ``cancelled``."""
        return self._status

    @property
    def done(self) -> bool:
        """Whether the handle is settled."""
        return self._status != "pending"

    @property
    def error(self) -> BaseException | None:
        """The error of a failed or cancelled handle, else ``None``."""
        return self._error

    @property
    def physically_complete(self) -> bool:
        """Whether the work behind the handle has really finished (threads included)."""
        return (
            self._physical_done if self._tracks_physical else self._status != "pending"
        )

    def result_nowait(self) -> T:
        """Return the value, or raise the stored error, without waiting.

        Raises:
            trio.WouldBlock: the handle is still pending.
            BaseException: the stored error of a failed or cancelled handle.
        """
        if self._status == "completed":
            return self._value  # type: ignore[no-any-return]
        if self._status == "pending":
            raise trio.WouldBlock
        assert self._error is not None
        raise self._error

    async def wait(self) -> None:
        """Wait until the handle is settled (it does not raise the stored error).

        Cancellation:
            Cancelling the waiter leaves the handle untouched.
        """
        event = self._pending_event("ResultHandle.wait()")
        if event is None:
            await trio.lowlevel.checkpoint()
        else:
            await event.wait()

    async def result(self) -> T:
        """Wait for settlement, then return the value or raise the stored error.

        Returns:
            The completed value.

        Raises:
            BaseException: the stored error of a failed handle, or the
                :class:`~phronomy.CancellationError` of a cancelled one.

        Cancellation:
            Cancelling the waiter leaves the handle untouched.
        """
        event = self._pending_event("ResultHandle.result()")  # wait(), without its
        if event is None:  # coroutine: one less per awaited result
            await trio.lowlevel.checkpoint()
        else:
            await event.wait()
        return self.result_nowait()

    async def wait_physical(self) -> None:
        """Wait until the work behind the handle has physically finished.

        Cancellation:
            Cancelling the waiter leaves the handle and the work untouched.
        """
        self._check_thread("wait_physical")
        if not self._tracks_physical:
            await self.wait()
            return
        if self._physical_done:
            await trio.lowlevel.checkpoint()
            return
        if self._physical_event is None:
            self._physical_event = trio.Event()
        await self._physical_event.wait()

    # --- settling ------------------------------------------------------------------

    def complete(self, value: T) -> bool:
        """Complete with *value*; returns whether this call settled the handle."""
        if threading.get_ident() != self._thread:
            raise foreign_thread_error("ResultHandle.complete()")
        if self._status != "pending":
            return False
        self._value = value
        self._settle("completed")
        return True

    def fail(self, error: BaseException) -> bool:
        """Fail with *error*; returns whether this call settled the handle.

        Raises:
            TypeError: *error* is not an exception instance.
        """
        if not isinstance(error, BaseException):
            raise TypeError(f"error is required (got {error!r})")
        if threading.get_ident() != self._thread:
            raise foreign_thread_error("ResultHandle.fail()")
        if self._status != "pending":
            return False
        self._error = error
        self._settle("failed")
        return True

    def cancel(self, error: BaseException | None = None) -> bool:
        """Cancel the handle (and, if it changed state, its children).

        Args:
            error: what waiters receive; defaults to a :class:`~phronomy.CancellationError`.

        Returns:
            Whether this call settled the handle.
        """
        self._check_thread("cancel")
        if self._status != "pending":
            return False
        self._error = error or CancellationError(f"{self._name} cancelled")
        self._settle("cancelled")
        children, self._children = self._children, None
        for child in children or ():
            child.cancel(self._error)
        return True

    def settle_like(self, source: ResultHandle[T]) -> bool:
        """Adopt the outcome of the settled handle *source*."""
        match source.status:
            case "completed":
                return self.complete(source._value)
            case "failed":
                assert source._error is not None
                return self.fail(source._error)
            case "cancelled":
                return self.cancel(source._error)
            case _:
                raise ValueError(f"{source!r} is not settled")

    def on_complete(self, callback: Callable[[ResultHandle[T]], object]) -> None:
        """Run ``callback(handle)`` once the handle is settled (at once if it is)."""
        if threading.get_ident() != self._thread:
            raise foreign_thread_error("ResultHandle.on_complete()")
        callbacks = self._callbacks
        if callbacks is None:
            _run_callback(callback, self)
        elif type(callbacks) is list:
            callbacks.append(callback)
        elif type(callbacks) is tuple:  # by type: a callback may well be falsy
            self._callbacks = callback
        else:
            self._callbacks = [callbacks, callback]  # type: ignore[list-item]

    def on_physical_complete(
        self, callback: Callable[[ResultHandle[T]], object]
    ) -> None:
        """Run ``callback(handle)`` once the work has physically finished."""
        self._check_thread("on_physical_complete")
        if not self._tracks_physical:
            self.on_complete(callback)
        elif self._physical_callbacks is None:
            _run_callback(callback, self)
        elif self._physical_callbacks:
            self._physical_callbacks.append(callback)
        else:
            self._physical_callbacks = [callback]

    def mark_physically_complete(self) -> None:
        """Record that the work behind the handle has physically finished (pool use)."""
        if threading.get_ident() != self._thread:
            raise foreign_thread_error("ResultHandle.mark_physically_complete()")
        if self._physical_done or not self._tracks_physical:
            return
        self._physical_done = True
        if self._physical_event is not None:
            self._physical_event.set()
        callbacks, self._physical_callbacks = self._physical_callbacks, None
        for callback in callbacks or ():
            _run_callback(callback, self)

    # --- internals -----------------------------------------------------------------

    def _pending_event(self, what: str) -> trio.Event | None:
        """The event a waiter for settlement waits on (``None``: settled already)."""
        if threading.get_ident() != self._thread:
            raise foreign_thread_error(what)
        if self._status != "pending":
            return None
        if self._event is None:
            self._event = trio.Event()
        return self._event

    def _check_thread(self, what: str) -> None:
        # (the hottest methods, complete, fail, on_complete, wait and
        # mark_physically_complete, test the thread inline: a call less per use)
        if threading.get_ident() != self._thread:
            raise foreign_thread_error(f"ResultHandle.{what}()")

    def _add_child(self, child: ResultHandle[Any]) -> None:
        if self._status == "cancelled":
            child.cancel(self._error)
        elif self._status == "pending":
            if self._children is None:
                self._children = []
            self._children.append(child)

    def _settle(self, status: HandleStatus) -> None:
        self._status = status
        if status != "cancelled":
            self._children = None
        if self._event is not None:
            self._event.set()
        callbacks, self._callbacks = self._callbacks, None
        if type(callbacks) is list:  # by type: a callback may be a falsy list subclass
            for callback in callbacks:
                _run_callback(callback, self)
        elif callbacks is not None and type(callbacks) is not tuple:  # a lone one
            _run_callback(callbacks, self)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"<ResultHandle {self._name!r} {self._status}>"


def _run_callback(
    callback: Callable[[ResultHandle[Any]], object], handle: ResultHandle[Any]
) -> None:
    try:
        callback(handle)
    except Exception:
        logger.exception("result handle callback failed for %r", handle)
