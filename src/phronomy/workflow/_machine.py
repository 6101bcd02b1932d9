"""The workflow state machine core: pure, synchronous and sans-IO (it imports no trio).

:class:`WorkflowMachine` owns where one segment of an instance is (its current state,
its state value, its phase, the transitions it made) and, in the h11 style, returns
what should happen instead of doing it: each call gives a :class:`MachineStep` with the
effects the callbacks asked for, the stable state to publish, and whether the segment
waits, moves on automatically, or ends. The session carries the step out.

The rules (given a :class:`~phronomy.WorkflowDefinition`):

* candidates for an event are the transitions declared for it *from the current
  state*, in declaration order; the first whose guard passes (no guard = pass) is
  taken, and later guards are not evaluated;
* callbacks of a transition S → T run in the order: exit actions of S, the
  transition's action, entry actions of T; an exception aborts the rest (and the
  effects they requested are dropped);
* callables take ``(state)``, ``(state, event)`` or ``(state, event, effects)``;
* an action returns a new state (adopted) or ``None`` (state unchanged). Returning a
  ``dict``, an awaitable or a result handle raises
  :class:`~phronomy.InvalidActionResultError`.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, final

import msgspec

from phronomy.errors import InvalidActionResultError, TransitionError

from ._callbacks import CONSUME, adopt, apply_hook, invoke, is_async_result
from ._definition import (
    AUTO_EVENT,
    FINISH,
    SCHEDULED,
    START_DUE,
    START_EVENT,
    Transition,
)
from ._intents import Effects, Intent
from ._state import State

if TYPE_CHECKING:
    from ._callbacks import EventLike
    from ._definition import Callback, WorkflowDefinition

__all__ = [
    "CONSUME",
    "Decision",
    "Fired",
    "MachineStep",
    "WorkflowMachine",
    "decide",
    "enter",
    "fire",
    "select",
]

S = TypeVar("S", bound=State)

_NO_ROUTES: dict[str, tuple[Transition, ...]] = {}
"""The routes of a state no transition leaves."""

Decision = Literal["finish", "halt", "auto", "wait", "leaf"]
"""What to do after arriving in a state."""

Next = Literal[
    "finish", "halt", "auto", "wait", "leaf", "consumed", "rejected", "dropped"
]
"""What the session does after a :class:`MachineStep`."""


@final
class Fired(msgspec.Struct, frozen=True, kw_only=True):
    """A transition that happened, and the state after its callbacks.

    Attributes:
        transition: the transition taken.
        state: the state after exit actions, the transition action and entry actions.
    """

    transition: Transition
    state: Any


def decide(definition: WorkflowDefinition[Any], current: str) -> Decision:
    """Decide what to do after arriving in *current* (the first rule that applies).

    Raises:
        TransitionError: *current* is not a declared state.
    """
    decision = definition.decisions.get(current)  # (the rules, computed once)
    if decision is None:
        raise TransitionError(f"State {current!r} is not defined")
    return decision  # type: ignore[return-value]


def enter(
    definition: WorkflowDefinition[Any],
    name: str,
    state: State,
    event: EventLike,
    effects: Any,
) -> State:
    """Run the entry actions of *name* in declaration order; return the resulting state."""
    actions = definition.entry_actions.get(name)
    return (
        _run_actions(definition, actions, state, event, effects) if actions else state
    )


def _run_actions(
    definition: WorkflowDefinition[Any],
    actions: tuple[Callback, ...],
    state: State,
    event: EventLike,
    effects: Any,
) -> State:
    for callback in actions:
        state = adopt(
            definition,
            invoke(definition, callback, state, event, effects),
            state,
            callback,
        )
    return state


def select(
    definition: WorkflowDefinition[Any],
    current: str,
    state: State,
    event: EventLike,
    candidates: tuple[Transition, ...] | None,
) -> Transition | None:
    """Pick the transition *event* takes from *current* among *candidates* (the
    state's route for the event), or ``None`` if every guard of an external event
    rejects.

    Raises:
        TransitionError: the machine does not know the event at all ("Unknown FSM
            event"), or the event is not declared from *current* ("Transition from").
        InvalidActionResultError: a guard returned an awaitable.
    """
    if candidates is None:
        if event.type not in definition.by_event:
            raise TransitionError(
                f"Unknown FSM event {event.type!r} for state {current!r}"
            )
        raise TransitionError(
            f"Transition from {current!r} via event {event.type!r} failed. "
            "The event is not declared for the current state."
        )
    for transition in candidates:
        guard = transition.guard
        if guard is None:
            return transition
        verdict = invoke(definition, guard, state, event, None)
        if type(verdict) is not bool and is_async_result(verdict):
            if inspect.iscoroutine(verdict):
                verdict.close()
            raise InvalidActionResultError(
                f"{guard.label} returned an awaitable; guards are synchronous"
            )
        if verdict:
            return transition
    if event.type == AUTO_EVENT:
        # Only external events may be ignored when every guard rejects; a state whose
        # automatic guards all reject could never leave.
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
    """Fire *event* from *current*: select, then exit → action → entry.

    Returns:
        The transition taken and the resulting state, or ``None`` when every guard
        rejected (nothing ran).

    Raises:
        TransitionError: see :func:`select`.
        Exception: whatever a callback raised (later callbacks do not run).
    """
    candidates = definition.routes.get(current, _NO_ROUTES).get(event.type)
    if candidates and candidates[0].guard is None:  # (most: the first, unguarded)
        transition = candidates[0]
    else:
        selected = select(definition, current, state, event, candidates)
        if selected is None:
            return None
        transition = selected
    if exits := definition.exit_actions.get(current):  # (most states have none)
        state = _run_actions(definition, exits, state, event, effects)
    if transition.action is not None:
        state = adopt(
            definition,
            invoke(definition, transition.action, state, event, effects),
            state,
            transition.action,
        )
    if transition.target != FINISH and (
        entries := definition.entry_actions.get(transition.target)
    ):
        state = _run_actions(definition, entries, state, event, effects)
    return Fired(transition=transition, state=state)


@final
class _Started(msgspec.Struct, frozen=True, gc=False):
    """The event the entry actions of a delayed start see (as at any start)."""

    type: str = START_EVENT
    payload: Any = None


@final
class MachineStep(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What one call of the machine decided.

    Attributes:
        next: ``auto`` (publish, then call :meth:`WorkflowMachine.advance`), ``wait``
            (publish and wait for an event), ``halt`` / ``finish`` / ``leaf`` (end the
            segment: halted at a wait state, at ``__end__``, or at a state with no
            way out), ``consumed`` (the state's hook dropped the event),
            ``rejected`` (every guard of an external event rejected it; nothing ran)
            or ``dropped`` (the current state does not declare the event and the
            workflow drops such events).
        intents: the effects the callbacks asked for, in order.
        current: the state the machine is in afterwards.
    """

    next: Next
    intents: tuple[Intent, ...] = ()
    current: str = ""


@final
class WorkflowMachine(Generic[S]):
    """One segment of one instance, as a machine that returns what should happen.

    Fresh segments begin with :meth:`start` (the entry point's entry actions); resumed
    ones with :meth:`resume` (the resume event, fired from the halted phase). Each call
    returns a :class:`MachineStep`; after ``auto`` the caller publishes the stable
    state and calls :meth:`advance`, which fires the automatic transitions inline.

    Attributes:
        definition: the compiled workflow.
        state: the current state value.
        current: the current state's name.
        transitions: transitions made since the last external event (the recursion
            limit bounds them).
        entered: states entered in this segment (each entry is a new visit: a
            timeout armed for an earlier one is stale).
    """

    __slots__ = (
        "_effects",
        "current",
        "definition",
        "entered",
        "recursion_limit",
        "state",
        "transitions",
    )

    def __init__(
        self,
        definition: WorkflowDefinition[S],
        state: S,
        *,
        recursion_limit: int,
        phase: str | None = None,
    ) -> None:
        """Position the machine at the entry point, or at the halted *phase*."""
        self.definition = definition
        self.state = state
        self.current = phase if phase is not None else definition.entry_point
        self.recursion_limit = recursion_limit
        self.transitions = 0
        self.entered = 0
        self._effects = Effects(
            workflow=definition.name, events=definition.effect_events
        )

    def start(self, event: EventLike) -> MachineStep:
        """Run the entry point's entry actions (they see *event*), then decide.

        Raises:
            Exception: what a callback raised (the segment fails with it).
        """
        effects = self._effects
        effects.open()
        try:
            entered = enter(self.definition, self.current, self.state, event, effects)
        except BaseException:
            effects.discard()
            raise
        self.state = entered  # type: ignore[assignment]
        self.entered += 1
        return self._arrived(effects.take())

    def handle(self, event: EventLike) -> MachineStep:
        """Handle an external event: the state's hook, then the transition.

        Raises:
            TransitionError: the event is unknown, not declared from the current state,
                or the recursion limit is reached.
            Exception: what a callback raised.
        """
        definition = self.definition
        hook = apply_hook(definition, self.current, self.state, event)
        if hook is not None:
            self.state = hook.state
            if hook.consumed:
                return MachineStep(next="consumed", current=self.current)
        if (
            definition.on_unhandled_event == "drop"
            and event.type in definition.by_event
            and event.type not in definition.events_from.get(self.current, ())
        ):
            return MachineStep(next="dropped", current=self.current)
        self.transitions = 0  # the recursion limit bounds chains between events
        return self._fire(event)

    def resume(self, event: EventLike) -> MachineStep:
        """Fire the resume event from the halted phase (the state's hook does not run);
        an instance stored to start later starts at its entry point (the entry
        actions see the ``start`` event).

        Raises:
            TransitionError: the event is not declared from the halted phase.
            Exception: what a callback raised.
        """
        self.transitions = 0
        if self.current == SCHEDULED and event.type == START_DUE:
            self.current = self.definition.entry_point
            return self.start(_Started())
        return self._fire(event)

    def advance(self, event: EventLike) -> MachineStep:
        """Fire the automatic transitions of the current state (after ``auto``); the
        callbacks see *event*, whose type must be ``state_completed``.

        Raises:
            TransitionError: every automatic guard rejected, or the recursion limit.
            Exception: what a callback raised.
        """
        return self._fire(event)

    def _fire(self, event: EventLike) -> MachineStep:
        if self.transitions >= self.recursion_limit:
            raise TransitionError(
                f"Recursion limit ({self.recursion_limit}) exceeded at state "
                f"{self.current!r} of workflow {self.definition.name!r}"
            )
        effects = self._effects
        effects.open()
        try:
            fired = fire(self.definition, self.current, self.state, event, effects)
        except BaseException:
            effects.discard()
            raise
        if fired is None:
            effects.discard()
            return MachineStep(next="rejected", current=self.current)
        self.state = fired.state
        self.current = current = fired.transition.target
        self.transitions += 1
        self.entered += 1
        decision = self.definition.decisions.get(current)  # (decide's table, inline)
        if decision is None:
            return self._arrived(effects.take())  # (it raises: no such state)
        return MachineStep(
            next=decision,  # type: ignore[arg-type]
            intents=effects.take(),
            current=current,
        )

    def _arrived(self, intents: tuple[Intent, ...]) -> MachineStep:
        current = self.current
        return MachineStep(
            next=decide(self.definition, current), intents=intents, current=current
        )
