"""Sessions whose terminal result waits for a policy: the terminal gate."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Literal, Protocol, final

import msgspec

from phronomy.errors import (
    PhronomyError,
    PhronomyInternalError,
    RecoveryRequiredError,
    RuntimeShutdownError,
)

from ._ids import random_hex
from ._messages import Event, SessionEnded

if TYPE_CHECKING:
    from ._contracts import Host
    from ._messages import SessionOutcome

__all__ = [
    "EventSink",
    "GatedSession",
    "SessionLifecycle",
    "TerminalDecision",
    "TerminalPolicy",
    "TerminalType",
]

logger = logging.getLogger(__name__)

TerminalType = Literal["finished", "halted", "cancelled"]
SessionLifecycle = Literal[
    "running", "awaiting_terminal", "halted", "completed", "error", "retired"
]


@final
class TerminalDecision(msgspec.Struct, frozen=True, kw_only=True):
    """What a terminal policy decided about a pending terminal request.

    Attributes:
        action: ``complete`` (report the result), ``fail`` (report *error*) or
            ``retire`` (outcome unknown: retire the session, leave its caller pending).
        error: the error for ``fail`` and ``retire``.
        revision: for ``complete``, the durable revision the terminal work produced.
    """

    action: Literal["complete", "fail", "retire"]
    error: BaseException | None = None
    revision: int | None = None


class TerminalPolicy(Protocol):
    """Feature code that must run before a session may report its terminal result."""

    def start(
        self, *, terminal_type: TerminalType, value: Any, sink: EventSink
    ) -> None:
        """Begin the terminal work on *value*; its result comes back through *sink*."""
        ...

    def handles(self, event: Event) -> bool:
        """Whether *event* is this policy's terminal result."""
        ...

    def decision_for(self, event: Event) -> TerminalDecision:
        """Interpret a terminal result event."""
        ...


class EventSink:
    """Posts events to exactly one session incarnation.

    Bound once to the session id; a sink of a finished session can never reach a newer
    incarnation, because the engine refuses posts to sessions that are not admitted.
    """

    __slots__ = ("_host", "_session_id")

    def __init__(self, host: Host, session_id: str | None = None) -> None:
        """Create a sink for *host*, bound to *session_id* when given."""
        self._host = host
        self._session_id = session_id

    def bind(self, session_id: str) -> None:
        """Bind the sink to *session_id* (once).

        Raises:
            PhronomyError: the sink is already bound.
        """
        if self._session_id is not None:
            raise PhronomyError(f"EventSink is already bound to {self._session_id!r}")
        self._session_id = session_id

    @property
    def session_id(self) -> str | None:
        """The bound session id."""
        return self._session_id

    def post(self, event_type: str, payload: Any = None) -> bool:
        """Post an event to the bound session; ``False`` if the session is gone.

        Raises:
            PhronomyError: the sink is not bound yet.
        """
        if self._session_id is None:
            raise PhronomyError("EventSink is not bound to a session")
        return self._host.post_nowait(
            Event(type=event_type, target_id=self._session_id, payload=payload)
        )

    def handle_now(self, event_type: str, payload: Any = None) -> bool:
        """As :meth:`post`, but on the dispatcher the session handles the event at
        once: for a result that arrives where it would be queued (a continuation,
        see :meth:`Engine.call_soon <phronomy.lowlevel.Engine.call_soon>`).

        Returns:
            Whether the event was taken (``False``: the session ended, or, off the
            dispatcher, the engine no longer accepts posts).

        Raises:
            PhronomyError: the sink is not bound yet.
        """
        if self._session_id is None:
            raise PhronomyError("EventSink is not bound to a session")
        return self._host.post_nowait(
            Event(type=event_type, target_id=self._session_id, payload=payload),
            at_once=True,
        )


class GatedSession:
    """Base of sessions whose terminal result may wait for a :class:`TerminalPolicy`.

    Subclasses implement :meth:`start`, :meth:`handle_live`, :meth:`terminal_value`
    and :meth:`terminal_result`, and may override :meth:`notify_terminal_stable` and
    :meth:`on_done`.

    Lifecycle: ``running`` → (terminal request) ``awaiting_terminal`` when a policy is
    set → ``halted``/``completed``; or ``error``; or ``retired`` when the policy could
    not decide (the caller stays pending and the owning receiver takes over).

    Attributes:
        id: the session id (fresh per incarnation; an attribute, not a property:
            the dispatcher reads it for every event).
    """

    __slots__ = (
        "_host",
        "_pending_notify",
        "_pending_type",
        "_policy",
        "done",
        "id",
        "lifecycle",
        "sink",
    )

    def __init__(
        self, host: Host, *, terminal_policy: TerminalPolicy | None = None
    ) -> None:
        """Create a session with a fresh random id and a sink bound to it."""
        self._host = host
        self.id: str = random_hex()  # fresh per incarnation; never from domain objects
        self.sink = EventSink(host, self.id)
        self._policy = terminal_policy
        self.lifecycle: SessionLifecycle = "running"
        self.done = False
        self._pending_type: TerminalType | None = None
        self._pending_notify = False

    @property
    def host(self) -> Host:
        """The engine the session runs on."""
        return self._host

    # --- subclass hooks -------------------------------------------------------------

    def start(self) -> None:
        """Begin executing (on the dispatcher)."""
        raise NotImplementedError

    def handle_live(self, event: Event) -> None:
        """Handle an ordinary event while ``running``; exceptions fail the session."""
        raise NotImplementedError

    def terminal_value(self) -> Any:
        """What the terminal policy works on (for example a snapshot to save)."""
        raise NotImplementedError

    def terminal_result(self, revision: int | None) -> Any:
        """The value reported when the session halts or finishes (*revision*: what the
        policy's decision carried)."""
        raise NotImplementedError

    def notify_terminal_stable(self) -> None:
        """Publish the terminal stable state (deferred until the policy completed)."""

    def on_done(self) -> None:
        """The session reached a terminal lifecycle state (release owned work here)."""

    def prepare_terminal(self, terminal_type: TerminalType) -> None:
        """Record terminal metadata before any snapshot is taken."""

    # --- the dispatcher calls these ----------------------------------------------------

    def handle(self, event: Event) -> None:
        """Route *event*: terminal results to the gate, others to :meth:`handle_live`."""
        if self.done:
            _not_taken(event)
            return
        policy = self._policy
        if policy is not None and policy.handles(event):
            self._handle_terminal_event(event)
            return
        if self.lifecycle != "running":
            _not_taken(
                event
            )  # a terminal decision is pending: no continuation authority
            return
        try:
            self.handle_live(event)
        except Exception as exc:  # noqa: BLE001 - the session's failure, reported to its caller
            if event.caller is not None:
                event.caller.fail(exc)
            self.finish_with_error(exc)

    def cut_off(self) -> BaseException:
        """Stop the session at runtime shutdown and return its caller's error."""
        awaiting = self.lifecycle == "awaiting_terminal"
        self.done = True
        self.lifecycle = "error"
        self.on_done()
        if awaiting:
            return RecoveryRequiredError(
                "the runtime shut down while the terminal save was in flight; its "
                "outcome is unknown, inspect the store before retrying",
            )
        return RuntimeShutdownError("the runtime shut down before the session finished")

    # --- the terminal gate ------------------------------------------------------------

    def request_terminal(
        self, terminal_type: TerminalType, *, notify_stable: bool
    ) -> None:
        """Ask to end the session as *terminal_type* (``finished``, ``halted`` or
        ``cancelled``)."""
        if self.lifecycle != "running" or self.done:
            return
        self.prepare_terminal(terminal_type)
        self._pending_type = terminal_type
        self._pending_notify = notify_stable
        if self._policy is None:
            self._complete_terminal()
            return
        self.lifecycle = "awaiting_terminal"
        try:
            self._policy.start(
                terminal_type=terminal_type, value=self.terminal_value(), sink=self.sink
            )
        except Exception as exc:  # noqa: BLE001 - e.g. the save could not be submitted
            self.finish_with_error(exc)

    def finish_with_error(self, error: BaseException) -> None:
        """End the session with *error* (ignored once done)."""
        if self.done:
            return
        self.done = True
        self.lifecycle = "error"
        self.on_done()
        self._end("error", error=error)

    def _handle_terminal_event(self, event: Event) -> None:
        if self.lifecycle != "awaiting_terminal":
            return  # early, duplicate or late policy result
        assert self._policy is not None
        try:
            decision = self._policy.decision_for(event)
        except Exception as exc:  # noqa: BLE001 - reported to the caller
            self.finish_with_error(exc)
            return
        action: str = decision.action  # a user policy may return anything
        match action:
            case "complete":
                self._complete_terminal(decision.revision)
            case "fail":
                self.finish_with_error(
                    decision.error or PhronomyError("terminal persistence failed")
                )
            case "retire":
                self._retire(decision.error)
            case _:
                self.finish_with_error(
                    PhronomyInternalError(f"unknown FSM terminal decision {action!r}")
                )

    def _complete_terminal(self, revision: int | None = None) -> None:
        pending = self._pending_type
        assert pending is not None
        self.lifecycle = "halted" if pending == "halted" else "completed"
        if self._pending_notify:
            # An observer failure here reaches finish_with_error: the caller gets that
            # error even though the record was saved.
            try:
                self.notify_terminal_stable()
            except Exception as exc:  # noqa: BLE001 - reported to the caller
                self.finish_with_error(exc)
                return
        self.done = True
        self.on_done()
        self._end(pending, result=self.terminal_result(revision))

    def _retire(self, error: BaseException | None) -> None:
        self.done = True
        self.lifecycle = "retired"
        self.on_done()
        self._end("retired", error=error)

    def _end(
        self,
        outcome: SessionOutcome,
        *,
        result: Any = None,
        error: BaseException | None = None,
    ) -> None:
        self._host.end_session(
            SessionEnded(
                session_id=self.id, outcome=outcome, result=result, error=error
            )
        )


def _not_taken(event: Event) -> None:
    """The session no longer takes events: tell a waiting caller (``None``)."""
    if event.caller is not None:
        event.caller.complete(None)
