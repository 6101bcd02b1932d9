"""The session table: registered sessions, their waiters and their owners."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, TypeAlias, final

from phronomy.errors import PhronomyError, RecoveryRequiredError, RuntimeShutdownError

from ._handle import ResultHandle
from ._messages import SessionEnded, SessionStart

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._contracts import Receiver, Session
    from ._lifecycle import Lifecycle

__all__ = ["SessionTable"]

Waiter: TypeAlias = "ResultHandle[Any] | Callable[[SessionEnded], object]"
"""Who learns how a session ended: a handle to settle, or a callback."""

logger = logging.getLogger(__name__)


@final
class SessionTable:
    """Every session from registration to its end, and who waits for it.

    A session is *admitted* from registration until it ends: only then do events
    posted to it get queued. Its ``SessionStart`` and ``SessionEnded`` messages go
    through the FIFO like every event, so a session starts after what was queued
    before it, and ends after the events it already received.
    """

    def __init__(
        self,
        lifecycle: Lifecycle,
        enqueue: Callable[[Any], None],
        at_batch_end: Callable[[Callable[[], object]], None],
    ) -> None:
        """Create an empty table; *enqueue* queues management messages, *at_batch_end*
        defers a call to the end of the dispatcher's batch."""
        self._lifecycle = lifecycle
        self._enqueue = enqueue
        self._at_batch_end = at_batch_end
        self.live: dict[str, Session] = {}  # started sessions (the dispatcher's lookup)
        self.admitted: set[str] = set()
        self._starting: dict[str, tuple[Session, Waiter]] = {}
        # registered on the dispatcher in its current batch: started at its end, in
        # order (one batch-end call for them all, not one per session)
        self._to_start: list[str] = []
        self._ending: list[SessionEnded] = []  # likewise, the ends
        self._waiters: dict[str, Waiter] = {}
        self._owners: dict[str, Receiver] = {}

    @property
    def idle(self) -> bool:
        """No session is starting or live."""
        return not self.live and not self._starting

    def __len__(self) -> int:
        return len(self.live) + len(self._starting)

    def register(
        self, session: Session, waiter: Waiter, owner: Receiver | None
    ) -> None:
        """Admit *session* and queue its start; *waiter* learns how it ends.

        Raises:
            RuntimeShutdownError: the engine no longer accepts sessions.
            PhronomyError: a session with that id is already registered.
        """
        if not self._lifecycle.accepting:
            raise RuntimeShutdownError(
                f"the runtime is {self._lifecycle.state}; new sessions are not accepted"
            )
        sid = session.id
        if sid in self.admitted or sid in self.live or sid in self._starting:
            raise PhronomyError(f"session {sid!r} is already registered")
        self.admitted.add(sid)
        self._starting[sid] = (session, waiter)
        if owner is not None:
            self._owners[sid] = owner
        if self._lifecycle.is_dispatcher():
            # Registered by a receiver on the dispatcher: started after the current
            # batch, before the dispatcher awaits anything (no queue hop).
            self._to_start.append(sid)
            if len(self._to_start) == 1:  # (appended first: the call may run at once)
                self._at_batch_end(self._start_registered)
        else:
            self._enqueue(SessionStart(session_id=sid))

    def start(self, message: SessionStart) -> None:
        """Start a registered session (on the dispatcher)."""
        self.start_pending(message.session_id)

    def _start_registered(self) -> None:
        """Start the sessions registered on the dispatcher in its batch, in order."""
        registered, self._to_start = self._to_start, []
        for sid in registered:
            self.start_pending(sid)

    def start_pending(self, session_id: str) -> Session | None:
        """Start *session_id* now if it is registered and not started yet (an event
        for it arrived first); return it, or ``None``."""
        entry = self._starting.pop(session_id, None)
        if entry is None:
            return None
        session, waiter = entry
        self.live[session_id] = session
        self._waiters[session_id] = waiter
        session.start()
        return session

    def end_soon(self, ended: SessionEnded) -> None:
        """Settle *ended* at the end of the dispatcher's current batch (on it), after
        the events it already received, in order."""
        self._ending.append(ended)
        if len(self._ending) == 1:  # (appended first: the call may run at once)
            self._at_batch_end(self._end_ended)

    def _end_ended(self) -> None:
        ending, self._ending = self._ending, []
        for ended in ending:
            self.end(ended)

    def end(self, ended: SessionEnded) -> None:
        """Forget an ended session and settle its waiter (on the dispatcher).

        A retired session's waiter goes to its owner, which decides when its caller
        settles; without an owner it fails with :class:`~phronomy.RecoveryRequiredError`.
        """
        sid = ended.session_id
        self.admitted.discard(sid)
        self.live.pop(sid, None)
        owner = self._owners.pop(sid, None)
        waiter = self._waiters.pop(sid, None)
        if ended.outcome == "retired":
            if owner is not None:
                handle = waiter if type(waiter) is ResultHandle else None
                owner.session_retired(sid, waiter=handle, error=ended.error)
            elif waiter is not None:
                error = RecoveryRequiredError(
                    f"session {sid} retired: the outcome of its terminal work is "
                    f"unknown ({ended.error!r})"
                )
                error.__cause__ = ended.error
                _settle(waiter, sid, error=error)
        elif waiter is not None:
            if type(waiter) is ResultHandle:
                if ended.error is not None:
                    waiter.fail(ended.error)
                else:
                    waiter.complete(ended.result)
            else:
                waiter(ended)

    def cut_off(self) -> list[str]:
        """The dispatcher stopped with sessions live: end each; describe the unowned."""
        described: list[str] = []
        for sid, session in list(self.live.items()):
            waiter = self._waiters.pop(sid, None)
            try:
                error = session.cut_off()
            except Exception as exc:  # noqa: BLE001 - the session's own failure
                error = exc
            if sid not in self._owners:
                described.append(f"session {sid}")  # owners describe their own
            if waiter is not None:
                _settle(waiter, sid, error=error)
        for sid, (_, waiter) in self._starting.items():
            _settle(
                waiter,
                sid,
                error=RuntimeShutdownError(
                    "the runtime shut down before the session started"
                ),
            )
        self._clear()
        return described

    def fail(self, error: BaseException) -> None:
        """The dispatcher failed: every waiter fails with *error*."""
        for sid, (_, waiter) in self._starting.items():
            _settle(waiter, sid, error=error)
        for sid, waiter in self._waiters.items():
            _settle(waiter, sid, error=error)
        self._clear()

    def _clear(self) -> None:
        self.live.clear()
        self.admitted.clear()
        self._starting.clear()
        self._to_start.clear()
        self._ending.clear()
        self._waiters.clear()
        self._owners.clear()


def _settle(waiter: Waiter, session_id: str, *, error: BaseException) -> None:
    """Tell *waiter* its session failed with *error* (cut off, or never started)."""
    if type(waiter) is ResultHandle:
        waiter.fail(error)
    else:
        waiter(SessionEnded(session_id=session_id, outcome="error", error=error))
