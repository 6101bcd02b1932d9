"""Calling user callbacks: arities, result adoption, and the state's event hook (pure)."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Protocol, final

import msgspec

from phronomy.errors import InvalidActionResultError

from ._definition import AUTO_EVENT

if TYPE_CHECKING:
    from ._definition import Callback, WorkflowDefinition
    from ._state import State

__all__ = [
    "CONSUME",
    "EventLike",
    "HookOutcome",
    "adopt",
    "apply_hook",
    "invoke",
    "is_async_result",
    "is_awaitable",
]


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


def invoke(
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


_NEVER_AWAITABLE = frozenset({bool, int, float, str, bytes, tuple, list, dict})
"""Types of values that are never awaitable (checked before the ABC check)."""


def is_awaitable(value: Any) -> bool:
    """:func:`inspect.isawaitable`, without its ABC check for the frequent plain
    values (``None``, numbers, strings, containers)."""
    return (
        value is not None
        and type(value) not in _NEVER_AWAITABLE
        and inspect.isawaitable(value)
    )


def is_async_result(value: Any) -> bool:
    # Result handles are recognised by shape: this module must not import the engine.
    return is_awaitable(value) or (
        callable(getattr(value, "on_complete", None))
        and callable(getattr(value, "result_nowait", None))
    )


def adopt(
    definition: WorkflowDefinition[Any],
    result: Any,
    state: State,
    callback: Callback,
) -> State:
    if result is None:
        return state
    if isinstance(result, definition.state_type):
        return result  # type: ignore[no-any-return]
    if is_async_result(result):
        if inspect.iscoroutine(result):
            result.close()  # never awaited: close it to avoid a RuntimeWarning
        raise InvalidActionResultError(
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


def apply_hook(
    definition: WorkflowDefinition[Any], current: str, state: State, event: EventLike
) -> HookOutcome | None:
    """Run ``state.handle_event(event)`` if the state class defines it.

    Returns:
        What it decided, or ``None`` when nothing changed (no hook ran, or it
        answered ``None`` or ``False``: the frequent answers, without an object).
    """
    hook = getattr(state, "handle_event", None)
    if hook is None or event.type == AUTO_EVENT:
        return None
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
    if verdict is False or verdict is None:  # the frequent answer: not handled
        return None
    if isinstance(verdict, definition.state_type):
        state, handled = verdict, True
    else:
        if is_async_result(verdict):
            raise InvalidActionResultError(
                f"{type(state).__name__}.handle_event returned an awaitable; hooks are synchronous"
            )
        handled = bool(verdict)
    if handled and event.type not in definition.events_from.get(current, ()):
        return HookOutcome(state=state, consumed=True, handled=True)
    return HookOutcome(state=state, handled=handled)
