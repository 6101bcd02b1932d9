"""Refuse calls from threads that do not own the runtime, before any trio object is touched.

trio objects (memory channels, events, parking lots, cancel scopes) may only be used
from the thread running their trio loop. From any other thread they fail *half way*: a
channel's ``send_nowait`` removes the waiting dispatcher from its wait queue and then
raises, and the dispatcher never wakes again. Every public entry point therefore checks
the calling thread first and raises :class:`~phronomy.ReentrancyError` with a message
that says how to call it from a thread instead.
"""

from __future__ import annotations

import threading

from phronomy.errors import ReentrancyError

__all__ = ["check_thread", "foreign_thread_error"]


def foreign_thread_error(what: str) -> ReentrancyError:
    """The error for *what* (for example ``"runtime.workflows.signal()"``) called from a foreign thread."""
    return ReentrancyError(
        f"{what} was called from a thread that does not run the runtime's trio loop "
        f"(thread {threading.current_thread().name!r}). Call it from a trio task of the "
        "runtime; from another thread use runtime.from_thread (for example "
        "runtime.from_thread.signal(...)), or trio.from_thread.run_sync(fn, *args, "
        "trio_token=runtime.trio_token)"
    )


def check_thread(owner: int, what: str) -> None:
    """Raise unless the calling thread is *owner* (a ``threading.get_ident()`` value).

    Raises:
        ReentrancyError: called from another thread.
    """
    if threading.get_ident() != owner:
        raise foreign_thread_error(what)
