"""The workflow builder: declare states and transitions, then build()."""

from __future__ import annotations

import inspect
import math
import re
import warnings
from datetime import timedelta
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Generic, Literal, Self, TypeVar, final

import msgspec

from phronomy.errors import DefinitionError, DefinitionWarning, InvalidInputError
from phronomy.storage import MAX_DELAY_MS
from phronomy.storage._retention import check_retention

from ._definition import (
    AUTO_EVENT,
    FINISH,
    FINISH_ALIAS,
    Callback,
    Transition,
    WorkflowDefinition,
    after_event,
    fingerprint,
    indexed,
)
from ._state import State, state_spec

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = ["Workflow"]

S = TypeVar("S", bound=State)

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]*$")


def _arity(fn: Callable[..., Any], *, max_args: int, what: str) -> int:
    if not callable(fn):
        raise DefinitionError(f"{what} must be callable, got {fn!r}")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return 1  # builtins without a signature take the state only
    positional = [
        p
        for p in signature.parameters.values()
        if p.kind
        in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    if any(
        p.kind is inspect.Parameter.VAR_POSITIONAL
        for p in signature.parameters.values()
    ):
        return max_args
    required = sum(p.default is inspect.Parameter.empty for p in positional)
    if required > max_args:
        raise DefinitionError(
            f"{what} takes {required} required arguments; it may take at most {max_args} "
            f"({', '.join(('state', 'event', 'effects')[:max_args])})"
        )
    if not positional:
        raise DefinitionError(f"{what} must accept the state as its first argument")
    # Only required parameters count: ``lambda s, name=name: ...`` (closure capture)
    # takes the state alone, and parameters with defaults are never filled.
    return max(required, 1)


@final
class Workflow(Generic[S]):
    """Builder of a workflow definition.

    Example::

        wf = phronomy.Workflow(Order, name="orders")
        wf.state("draft", entry=draft)
        wf.wait_state("awaiting_approval")
        wf.state("ship", entry=ship)
        wf.transition("draft", "awaiting_approval")                   # automatic
        wf.transition("awaiting_approval", "ship", on="approve")      # external event
        wf.transition("ship", phronomy.FINISH)
        order_flow = wf.build()

    Methods return the builder, so calls can be chained. Nothing is validated until
    :meth:`build`, which returns an immutable :class:`WorkflowDefinition`.

    Actions take ``(state)``, ``(state, event)`` or ``(state, event, effects)`` and
    return a new state or ``None``; guards take ``(state)`` or ``(state, event)``. Only
    required positional parameters count: parameters with defaults (for example a
    ``lambda s, name=name: ...`` closure capture) are never filled.
    """

    def __init__(
        self,
        state_type: type[S],
        *,
        name: str | None = None,
        version: str | None = None,
        on_unhandled_event: Literal["drop", "fail"] = "drop",
        retention: float | None = None,
    ) -> None:
        """Start a definition.

        Args:
            state_type: the :class:`~phronomy.State` subclass of this workflow.
            name: the workflow name (default: the state class name); durable instances
                record it and refuse to be resumed by another workflow.
            version: the definition's version, saved with every durable save
                (default: a fingerprint of its states, transitions and state fields).
            on_unhandled_event: what a live segment does with an event its current
                state does not declare: ``"drop"`` it (with a warning, counted in
                ``runtime.workflows.statistics()``), or ``"fail"`` the segment with
                :class:`~phronomy.TransitionError`.
            retention: seconds a closed (finished or cancelled) durable instance is
                kept, with its history, before a runtime serving this workflow purges
                it (``math.inf``: forever; ``None``: the runtime's ``retention``).

        Raises:
            DefinitionError: *state_type* is not a State subclass, *name* is empty or
                starts with ``phronomy.`` (reserved), *version* is empty, or
                *on_unhandled_event* is neither ``"drop"`` nor ``"fail"``, or
                *retention* is not a number of seconds >= 0.
        """
        given: object = version  # checked at run time: callers are not typed
        if given is not None and (not isinstance(given, str) or not given):
            raise DefinitionError(
                f"version must be a non-empty string, got {version!r}"
            )
        if on_unhandled_event not in ("drop", "fail"):
            raise DefinitionError(
                "on_unhandled_event must be 'drop' or 'fail', got "
                f"{on_unhandled_event!r}"
            )
        try:
            self._retention = check_retention(retention)
        except InvalidInputError as exc:
            raise DefinitionError(str(exc)) from None
        self._version = version
        self._on_unhandled: Literal["drop", "fail"] = on_unhandled_event
        state_spec(state_type)
        self._state_type = state_type
        self._name = name if name is not None else state_type.__name__
        if not self._name:
            raise DefinitionError("a workflow name must not be empty")
        if self._name.startswith("phronomy."):
            raise DefinitionError(
                f"workflow name {self._name!r} is reserved: names starting with "
                "'phronomy.' belong to the runtime's own records"
            )
        self._initial: str | None = None
        self._declared: list[str] = []  # every state, in declaration order
        self._states: list[str] = []
        self._wait_states: list[str] = []
        self._checkpoints: dict[str, str] = {}
        self._entry: dict[str, list[Callback]] = {}
        self._exit: dict[str, list[Callback]] = {}
        self._transitions: list[Transition] = []

    def initial(self, name: str) -> Self:
        """Set the entry point (default: the first state declared, by :meth:`state`
        or :meth:`wait_state`)."""
        self._initial = _check_name(name)
        return self

    def state(
        self,
        name: str,
        *,
        entry: Callable[..., Any] | Sequence[Callable[..., Any]] | None = None,
        exit: Callable[..., Any] | Sequence[Callable[..., Any]] | None = None,  # noqa: A002
    ) -> Self:
        """Declare a normal state, optionally with entry and exit actions.

        Declaring the same state again adds its actions after the earlier ones.
        """
        _check_name(name)
        if name in self._wait_states:
            raise DefinitionError(f"{name!r} is already declared as a wait state")
        if name not in self._states:
            self._states.append(name)
            self._declared.append(name)
        for fn in _as_list(entry):
            self.entry(name, fn)
        for fn in _as_list(exit):
            self.exit(name, fn)
        return self

    def entry(self, name: str, fn: Callable[..., Any]) -> Self:
        """Append an entry action of *name* (actions run in declaration order)."""
        label = f"entry action of {name!r}"
        self._entry.setdefault(name, []).append(
            Callback(fn=fn, arity=_arity(fn, max_args=3, what=label), label=label)
        )
        return self

    def exit(self, name: str, fn: Callable[..., Any]) -> Self:
        """Append an exit action of *name* (run when a transition leaves it)."""
        label = f"exit action of {name!r}"
        self._exit.setdefault(name, []).append(
            Callback(fn=fn, arity=_arity(fn, max_args=3, what=label), label=label)
        )
        return self

    def wait_state(self, name: str, *, checkpoint: str | None = None) -> Self:
        """Declare a wait state: reaching it halts the segment until an event resumes it.

        A workflow whose entry point is a wait state halts at once (after the state's
        entry actions) and waits for its first event.

        Args:
            name: the state.
            checkpoint: a *checkpoint*: a durable segment saves the state here, keeps
                its lease and fires this event (declared from the state) once the save
                is acknowledged (events that came meanwhile first). A crash after the
                acknowledgement resumes the instance here (its timeouts are armed), one
                before it where the previous save left it. Without a store, when
                cancelling, or with inbox entries applied, it halts here as usual.

        Raises:
            DefinitionError: a bad name, or one already declared as a normal state.
        """
        _check_name(name)
        if name in self._states:
            raise DefinitionError(f"{name!r} is already declared as a normal state")
        if checkpoint is not None:
            self._checkpoints[name] = checkpoint
        if name not in self._wait_states:
            self._wait_states.append(name)
            self._declared.append(name)
        return self

    def transition(
        self,
        source: str,
        target: str,
        *,
        on: str | None = None,
        after: timedelta | float | None = None,
        guard: Callable[..., Any] | None = None,
        action: Callable[..., Any] | None = None,
    ) -> Self:
        """Declare a transition from *source* to *target* (or :data:`~phronomy.FINISH`).

        Args:
            source: the state the transition leaves.
            target: the state it enters, or :data:`~phronomy.FINISH`.
            on: the external event that fires it; without it (and without *after*)
                the transition is automatic (taken as soon as *source*'s entry actions
                ran).
            after: a timeout (a :class:`~datetime.timedelta`, or seconds): the
                transition is taken when the instance is still in *source* this long
                after entering it. At a wait state of a durable instance the timer is
                stored with the save that halts there (it survives restarts and fires
                in whichever runtime then serves the instance); at other states it
                runs in the segment. Leaving *source* by any other transition
                disarms it; it never fires into a later visit of *source*.
            guard: ``(state)`` or ``(state, event)`` → bool; candidates are tried in
                declaration order and the first passing one wins (a timeout whose
                guards all reject leaves the instance where it is).
            action: run after *source*'s exit actions and before *target*'s entry actions.

        Raises:
            DefinitionError: both *on* and *after*, or a delay that is not positive
                or longer than 100 years.
        """
        after_ms = None if after is None else _delay_ms(after, source, target)
        if on is not None and after_ms is not None:
            raise DefinitionError(
                f"transition {source!r} -> {target!r}: give on= (an event) or after= "
                "(a timeout), not both"
            )
        if after_ms is not None:
            event = after_event(after_ms)
        else:
            event = AUTO_EVENT if on is None else _check_name(on)
        if on is not None and on == AUTO_EVENT:
            raise DefinitionError(
                f"{AUTO_EVENT!r} is reserved for automatic transitions"
            )
        target = FINISH if target == FINISH_ALIAS else target
        where = Transition(
            source=source, target=target, event=event, after_ms=after_ms
        ).describe()
        self._transitions.append(
            Transition(
                source=source,
                target=target,
                event=event,
                automatic=on is None and after_ms is None,
                after_ms=after_ms,
                guard=None
                if guard is None
                else Callback(
                    fn=guard,
                    arity=_arity(guard, max_args=2, what=f"guard of {where}"),
                    label=f"guard of {where}",
                ),
                action=None
                if action is None
                else Callback(
                    fn=action,
                    arity=_arity(action, max_args=3, what=f"transition action {where}"),
                    label=f"transition action {where}",
                ),
            )
        )
        return self

    def build(self) -> WorkflowDefinition[S]:
        """Validate and compile the definition.

        Returns:
            An immutable :class:`WorkflowDefinition`.

        The entry point is the state named by :meth:`initial`, else the first state
        declared (by :meth:`state` or :meth:`wait_state`, whichever came first).

        Raises:
            DefinitionError: no states declared, transitions from or to undefined
                states, actions of undefined states, an automatic transition from a wait
                state (it could never fire).

        Warns:
            DefinitionWarning: states that no transition from the entry point reaches
                (shown by default; they are almost always a mistake).
        """
        entry_point = self._initial or (self._declared[0] if self._declared else None)
        if entry_point is None:
            raise DefinitionError(
                "Workflow has no states declared — call state(...) or wait_state(...) "
                "at least once"
            )
        known = set(self._states) | set(self._wait_states)
        if entry_point not in known:
            raise DefinitionError(f"initial state {entry_point!r} is not declared")
        missing_targets = sorted(
            {t.target for t in self._transitions if t.target != FINISH} - known
        )
        if missing_targets:
            raise DefinitionError(
                f"Workflow transition(s) reference undefined state(s): {missing_targets}"
            )
        missing_sources = sorted({t.source for t in self._transitions} - known)
        if missing_sources:
            raise DefinitionError(
                f"Workflow transition(s) originate from undefined state(s): {missing_sources}"
            )
        missing_actions = sorted((set(self._entry) | set(self._exit)) - known)
        if missing_actions:
            raise DefinitionError(
                f"actions declared for undefined state(s): {missing_actions}"
            )
        dead = sorted(
            {
                t.source
                for t in self._transitions
                if t.automatic and t.source in self._wait_states
            }
        )
        if dead:
            raise DefinitionError(
                f"automatic transition(s) from wait state(s) {dead} can never fire; "
                "give them an event with on=..."
            )
        transitions = tuple(self._transitions)
        derived = indexed(transitions, self._states, frozenset(self._wait_states))
        timed = sorted(set(derived["timeouts"]) & derived["auto_states"])
        if timed:
            raise DefinitionError(
                f"state(s) {timed} have an automatic transition and a timeout (after=): "
                "an automatic transition leaves at once, so the timeout could never fire"
            )
        self._warn_unreachable(entry_point, known)
        for state, event in self._checkpoints.items():
            if event not in derived["events_from"].get(state, ()):
                raise DefinitionError(
                    f"checkpoint {state!r} fires {event!r}, which it does not declare"
                )
        definition = WorkflowDefinition(
            name=self._name,
            state_type=self._state_type,
            entry_point=entry_point,
            states=tuple(self._states),
            wait_states=frozenset(self._wait_states),
            declared=frozenset(known),
            entry_actions=MappingProxyType(
                {k: tuple(v) for k, v in self._entry.items()}
            ),
            exit_actions=MappingProxyType({k: tuple(v) for k, v in self._exit.items()}),
            transitions=transitions,
            on_unhandled_event=self._on_unhandled,
            retention=self._retention,
            checkpoints=MappingProxyType(dict(self._checkpoints)),
            **derived,
        )
        version = self._version or fingerprint(definition)
        versioned: WorkflowDefinition[S] = msgspec.structs.replace(
            definition, version=version
        )
        return versioned

    def _warn_unreachable(self, entry_point: str, known: set[str]) -> None:
        reachable = {entry_point}
        frontier = [entry_point]
        while frontier:
            state = frontier.pop()
            for t in self._transitions:
                if (
                    t.source == state
                    and t.target != FINISH
                    and t.target not in reachable
                ):
                    reachable.add(t.target)
                    frontier.append(t.target)
        unreachable = sorted(known - reachable)
        if unreachable:
            warnings.warn(
                f"workflow {self._name!r} has unreachable state(s) {unreachable}: no "
                f"transition from its entry point {entry_point!r} leads to them (the "
                "entry point is the first state declared, or the one initial() names)",
                DefinitionWarning,
                stacklevel=3,  # the caller of build()
            )


def _delay_ms(after: object, source: str, target: str) -> int:
    """*after* (a timedelta, or seconds) in whole milliseconds.

    Raises:
        DefinitionError: not a duration, not positive, or above 100 years.
    """
    if isinstance(after, timedelta):
        seconds = after.total_seconds()
    elif isinstance(after, (int, float)) and not isinstance(after, bool):
        seconds = float(after)
    else:
        raise DefinitionError(
            f"transition {source!r} -> {target!r}: after= must be a timedelta or "
            f"seconds, got {after!r}"
        )
    delay_ms = math.ceil(seconds * 1000) if math.isfinite(seconds) else -1
    if not 0 < delay_ms <= MAX_DELAY_MS:
        raise DefinitionError(
            f"transition {source!r} -> {target!r}: after= must be more than 0 and at "
            f"most 100 years, got {after!r}"
        )
    return delay_ms


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise DefinitionError(
            f"invalid state or event name {name!r}: use letters, digits, '_', '.', ':' or '-'"
        )
    if name in (FINISH, FINISH_ALIAS) or name.startswith("__"):
        raise DefinitionError(
            f"{name!r} is reserved: names starting with '__' belong to phronomy "
            "(use FINISH only as a transition target)"
        )
    return name


def _as_list(
    value: Callable[..., Any] | Sequence[Callable[..., Any]] | None,
) -> list[Callable[..., Any]]:
    if value is None:
        return []
    if callable(value):
        return [value]
    return list(value)
