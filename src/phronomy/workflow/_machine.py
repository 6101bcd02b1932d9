"""The workflow state machine core: pure, synchronous and sans-IO (it imports no trio).

Given a :class:`~phronomy.WorkflowDefinition`, a current state name, a state value and an
event, these functions compute what happens (spec §3.2):

* candidates for an event are the transitions declared for it *from the current
  state*, in declaration order; the first whose guard passes (no guard = pass) is
  taken, and later guards are not evaluated;
* callbacks of a transition S → T run in the order: exit actions of S, the
  transition's action, entry actions of T; an exception aborts the rest;
* callables take ``(state)``, ``(state, event)`` or ``(state, event, effects)``;
* an action returns a new state (adopted) or ``None`` (state unchanged). Returning a
  ``dict`` raises :class:`~phronomy.InvalidActionResultError` (a deliberate deviation
  from the Ruby runtime, which silently ignored it); returning an awaitable or a result
  handle raises :class:`~phronomy.InvalidActionResultError`.

The dispatcher-side session (``session.py``) is only the I/O adapter around this module.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast, final

import msgspec

from phronomy.errors import (
    InvalidActionResultError,
    TransitionError,
)

from ._definition import AUTO_EVENT, FINISH, Transition

if TYPE_CHECKING:
    from ._definition import Callback, WorkflowDefinition
    from ._state import State

__all__ = [
    "CONSUME",
    "Decision",
    "EventLike",
    "Fired",
    "HookOutcome",
    "apply_hook",
    "decide",
    "enter",
    "fire",
    "select",
]

Decision = Literal["finish", "halt", "auto", "wait", "leaf"]
"""What to do after arriving in a state (spec §2.8.6)."""


@final
class _Consume:
    __slots__ = ()

    def __repr__(self) -> str:
        return "phronomy.CONSUME"


CONSUME: Any = _Consume()
"""Returned by ``State.handle_event`` to drop an event (for example a stale result)."""


class EventLike(Protocol):
    """What the machine reads from an event."""

    @property
    def type(self) -> str:
        """The event name."""
        ...

    @property
    def payload(self) -> Any:
        """The application payload."""
        ...


@final
class Fired(msgspec.Struct, frozen=True, kw_only=True):
    """A transition that happened, and the state after its callbacks.

    Attributes:
        transition: the transition taken.
        state: the state after exit actions, the transition action and entry actions.
    """

    transition: Transition
    state: Any


@final
class HookOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What ``State.handle_event`` decided.

    Attributes:
        state: the (possibly replaced) state.
        consumed: drop the event.
        handled: the hook handled the event (drop it if no transition exists).
    """

    state: Any
    consumed: bool = False
    handled: bool = False


def decide(definition: WorkflowDefinition[Any], current: str) -> Decision:
    """Decide what to do after arriving in *current* (spec §2.8.6, in order).

    Raises:
        TransitionError: *current* is not a declared state.
    """
    if current == FINISH:
        return "finish"
    if current in definition.wait_states:
        return "halt"
    if current in definition.auto_states:
        return "auto"
    if current in definition.events_from:
        return "wait"
    if current not in definition.declared:
        raise TransitionError(f"State {current!r} is not defined")
    return "leaf"


def _invoke(
    definition: WorkflowDefinition[Any],
    callback: Callback,
    state: Any,
    event: EventLike,
    effects: Any,
) -> Any:
    """Call a user callable; what it raises carries a note saying where it ran."""
    try:
        match callback.arity:
            case 1:
                return callback.fn(state)
            case 2:
                return callback.fn(state, event)
            case _:
                return callback.fn(state, event, effects)
    except Exception as exc:
        exc.add_note(
            f"phronomy: raised by the {callback.label} of workflow "
            f"{definition.name!r} (event {event.type!r})"
        )
        raise


def _is_async_result(value: Any) -> bool:
    # Result handles are recognised by shape: this module must not import the engine.
    return inspect.isawaitable(value) or (
        callable(getattr(value, "on_complete", None))
        and callable(getattr(value, "result_nowait", None))
    )


def _adopt(
    definition: WorkflowDefinition[Any],
    result: Any,
    state: State,
    callback: Callback,
    async_error: type[InvalidActionResultError],
) -> State:
    if result is None:
        return state
    if isinstance(result, definition.state_type):
        return cast("State", result)
    if _is_async_result(result):
        if inspect.iscoroutine(result):
            result.close()  # never awaited: close it to avoid a RuntimeWarning
        raise async_error(
            f"{callback.label} returned {type(result).__name__}; actions are synchronous: "
            "start async or blocking work with effects.start_soon/offload and deliver its "
            "result as an event"
        )
    if isinstance(result, dict):
        raise InvalidActionResultError(
            f"{callback.label} returned a dict; return state.merge(...) or None instead "
            "(phronomy does not merge returned dicts)"
        )
    raise InvalidActionResultError(
        f"{callback.label} returned {type(result).__name__}; actions must return a "
        f"{definition.state_type.__name__} or None"
    )


def enter(
    definition: WorkflowDefinition[Any],
    name: str,
    state: State,
    event: EventLike,
    effects: Any,
) -> State:
    """Run the entry actions of *name* in declaration order; return the resulting state."""
    return _run_actions(
        definition, definition.entry_actions.get(name, ()), state, event, effects
    )


def _exit(
    definition: WorkflowDefinition[Any],
    name: str,
    state: State,
    event: EventLike,
    effects: Any,
) -> State:
    return _run_actions(
        definition, definition.exit_actions.get(name, ()), state, event, effects
    )


def _run_actions(
    definition: WorkflowDefinition[Any],
    actions: tuple[Callback, ...],
    state: State,
    event: EventLike,
    effects: Any,
) -> State:
    for callback in actions:
        state = _adopt(
            definition,
            _invoke(definition, callback, state, event, effects),
            state,
            callback,
            InvalidActionResultError,
        )
    return state


def select(
    definition: WorkflowDefinition[Any], current: str, state: State, event: EventLike
) -> Transition | None:
    """Pick the transition *event* takes from *current*, or ``None`` if every guard of an
    external event rejects.

    Raises:
        TransitionError: the machine does not know the event at all ("Unknown FSM
            event"), or the event is not declared from *current* ("Transition from").
        InvalidActionResultError: a guard returned an awaitable.
    """
    candidates = definition.by_event.get(event.type)
    if candidates is None:
        raise TransitionError(f"Unknown FSM event {event.type!r} for state {current!r}")
    matched = False
    for transition in candidates:
        if transition.source != current:
            continue
        matched = True
        guard = transition.guard
        if guard is None:
            return transition
        verdict = _invoke(definition, guard, state, event, None)
        if _is_async_result(verdict):
            if inspect.iscoroutine(verdict):
                verdict.close()
            raise InvalidActionResultError(
                f"{guard.label} returned an awaitable; guards are synchronous"
            )
        if verdict:
            return transition
    if not matched:
        raise TransitionError(
            f"Transition from {current!r} via event {event.type!r} failed. "
            "The event is not declared for the current state."
        )
    if event.type == AUTO_EVENT:
        # Only external events may be ignored when every guard rejects; a state whose
        # automatic guards all reject could never leave (spec §2.8.4, scenario 134).
        raise TransitionError(
            f"Transition from {current!r} via event {AUTO_EVENT!r} failed: "
            "every automatic transition's guard rejected"
        )
    return None


def fire(
    definition: WorkflowDefinition[Any],
    current: str,
    state: State,
    event: EventLike,
    effects: Any,
) -> Fired | None:
    """Fire *event* from *current*: select, then exit → action → entry (spec §3.2).

    Returns:
        The transition taken and the resulting state, or ``None`` when every guard
        rejected (nothing ran).

    Raises:
        TransitionError: see :func:`select`.
        Exception: whatever a callback raised (later callbacks do not run).
    """
    transition = select(definition, current, state, event)
    if transition is None:
        return None
    state = _exit(definition, current, state, event, effects)
    if transition.action is not None:
        state = _adopt(
            definition,
            _invoke(definition, transition.action, state, event, effects),
            state,
            transition.action,
            InvalidActionResultError,
        )
    if transition.target != FINISH:
        state = enter(definition, transition.target, state, event, effects)
    return Fired(transition=transition, state=state)


def apply_hook(
    definition: WorkflowDefinition[Any], current: str, state: State, event: EventLike
) -> HookOutcome:
    """Run ``state.handle_event(event)`` if the state class defines it (spec §2.8.3)."""
    hook = getattr(state, "handle_event", None)
    if hook is None or event.type == AUTO_EVENT:
        return HookOutcome(state=state)
    try:
        verdict = hook(event)
    except Exception as exc:
        exc.add_note(
            f"phronomy: raised by {type(state).__name__}.handle_event in state "
            f"{current!r} of workflow {definition.name!r} (event {event.type!r})"
        )
        raise
    if verdict is CONSUME:
        return HookOutcome(state=state, consumed=True)
    if isinstance(verdict, definition.state_type):
        state, handled = verdict, True
    else:
        if _is_async_result(verdict):
            raise InvalidActionResultError(
                f"{type(state).__name__}.handle_event returned an awaitable; hooks are synchronous"
            )
        handled = bool(verdict)
    if handled and event.type not in definition.events_from.get(current, ()):
        return HookOutcome(state=state, consumed=True, handled=True)
    return HookOutcome(state=state, handled=handled)
