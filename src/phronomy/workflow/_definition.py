"""Workflow definitions: the builder and the immutable compiled definition.

This module is pure Python (no trio): a compiled :class:`WorkflowDefinition` is a value
that any number of runtimes can run.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Mapping
from typing import Any, Generic, Literal, TypeVar, final

import msgspec

from ._state import State, state_spec

__all__ = [
    "AUTO_EVENT",
    "FINISH",
    "FINISH_ALIAS",
    "START_EVENT",
    "Callback",
    "Transition",
    "WorkflowDefinition",
    "fingerprint",
]

logger = logging.getLogger(__name__)

S = TypeVar("S", bound=State)

FINISH = "__end__"
"""The terminal phase (``WorkflowResult.phase`` of a finished workflow)."""
FINISH_ALIAS = "__finish__"
"""Accepted by :meth:`Workflow.transition` as a synonym of :data:`~phronomy.FINISH` (the
Ruby runtime's spelling); results, diagrams and messages always say ``__end__``."""
AUTO_EVENT = "state_completed"
"""The event automatic transitions fire on."""
START_EVENT = "start"
"""The event two-argument entry actions of the initial state receive at a fresh start."""


@final
class Callback(msgspec.Struct, frozen=True, kw_only=True):
    """A user callable with the number of arguments it takes.

    Attributes:
        fn: the callable.
        arity: 1 ``(state)``, 2 ``(state, event)`` or 3 ``(state, event, effects)``.
        label: how messages name it (for example ``entry action of 'draft'``).
    """

    fn: Callable[..., Any]
    arity: int
    label: str


@final
class Transition(msgspec.Struct, frozen=True, kw_only=True):
    """One declared transition.

    Attributes:
        source: the state it leaves.
        target: the state it enters (or :data:`~phronomy.FINISH`).
        event: the external event, or ``state_completed`` for automatic transitions.
        guard: optional condition; the first passing candidate wins.
        action: optional action run between the exit and entry actions.
        automatic: whether this is an automatic transition.
    """

    source: str
    target: str
    event: str
    guard: Callback | None = None
    action: Callback | None = None
    automatic: bool = False

    def describe(self) -> str:
        """``source --event--> target`` (FINISH shown as ``__end__``, the phase of a
        finished instance everywhere)."""
        return f"{self.source} --{self.event}--> {self.target}"


@final
class WorkflowDefinition(msgspec.Struct, Generic[S], frozen=True, kw_only=True):
    """A compiled, immutable workflow (built by :meth:`~phronomy.Workflow.build`).

    Attributes:
        name: the workflow name (stored with durable instances).
        state_type: the :class:`~phronomy.State` subclass.
        entry_point: the initial state.
        states: declared normal states, in declaration order.
        wait_states: declared wait states.
        declared: normal and wait states together.
        entry_actions: state → its entry actions, in declaration order.
        exit_actions: state → its exit actions.
        transitions: every transition, in declaration order.
        by_event: event name → its transitions, in declaration order.
        auto_states: states with at least one automatic transition.
        external_events: external event names, in declaration order.
        events_from: state → the external events declared from it.
        effect_events: the external event names, as a set (what effects may post).
        on_unhandled_event: ``"drop"`` or ``"fail"`` an event the current state does
            not declare.
        version: the definition's version (given, or a fingerprint).
    """

    name: str
    state_type: type[S]
    entry_point: str
    states: tuple[str, ...]
    wait_states: frozenset[str]
    declared: frozenset[str]
    entry_actions: Mapping[str, tuple[Callback, ...]]
    exit_actions: Mapping[str, tuple[Callback, ...]]
    transitions: tuple[Transition, ...]
    by_event: Mapping[str, tuple[Transition, ...]]
    auto_states: frozenset[str]
    external_events: tuple[str, ...]
    events_from: Mapping[str, frozenset[str]]
    effect_events: frozenset[str] = frozenset()
    on_unhandled_event: Literal["drop", "fail"] = "drop"
    version: str = ""

    def has_event(self, event: str) -> bool:
        """Whether *event* is a declared external event."""
        return event in self.by_event and event != AUTO_EVENT

    def external_events_from(self, state: str) -> tuple[str, ...]:
        """The external events declared from *state*, in declaration order."""
        available = self.events_from.get(state, frozenset())
        return tuple(e for e in self.external_events if e in available)

    def to_mermaid(self) -> str:
        """Return the workflow as Mermaid ``stateDiagram-v2`` text.

        Wait states are styled with the ``wait`` class; guarded transitions show
        ``[guard]`` after the event name.
        """
        ids = _diagram_ids(self)
        lines = ["stateDiagram-v2"]
        lines.extend(
            f'    state "{name}" as {ids[name]}'
            for name in (*self.states, *sorted(self.wait_states))
            if ids[name] != name
        )
        lines.append(f"    [*] --> {ids[self.entry_point]}")
        for t in self.transitions:
            target = "[*]" if t.target == FINISH else ids[t.target]
            label = "" if t.automatic else t.event
            if t.guard is not None:
                label = f"{label} [guard]".strip()
            lines.append(
                f"    {ids[t.source]} --> {target}" + (f" : {label}" if label else "")
            )
        if self.wait_states:
            lines.append("    classDef wait fill:#fff3cd,stroke:#b58900")
            lines.extend(f"    class {ids[w]} wait" for w in sorted(self.wait_states))
        return "\n".join(lines) + "\n"

    def to_dot(self) -> str:
        """Return the workflow as Graphviz DOT text (wait states drawn as octagons)."""
        lines = [
            f'digraph "{self.name}" {{',
            "    rankdir=LR;",
            '    "[*]" [shape=point];',
        ]
        lines.extend(
            f'    "{name}" [shape=box, style=rounded];' for name in self.states
        )
        lines.extend(
            f'    "{name}" [shape=octagon];' for name in sorted(self.wait_states)
        )
        lines.append('    "[end]" [shape=doublecircle, label=""];')
        lines.append(f'    "[*]" -> "{self.entry_point}";')
        for t in self.transitions:
            target = "[end]" if t.target == FINISH else t.target
            label = "" if t.automatic else t.event
            if t.guard is not None:
                label = f"{label} [guard]".strip()
            attrs = f' [label="{label}"]' if label else ""
            lines.append(f'    "{t.source}" -> "{target}"{attrs};')
        lines.append("}")
        return "\n".join(lines) + "\n"


def _diagram_ids(definition: WorkflowDefinition[Any]) -> dict[str, str]:
    ids: dict[str, str] = {}
    for name in (*definition.states, *definition.wait_states):
        ident = re.sub(r"[^A-Za-z0-9_]", "_", name)
        while ident in ids.values():
            ident += "_"
        ids[name] = ident
    return ids


def fingerprint(definition: WorkflowDefinition[Any]) -> str:
    """A short hash of what a stored instance depends on: the states (wait states
    marked), the transitions (source, event, target) and the state class's fields with
    their types. Actions and guards are code, not shape: they do not change it."""
    spec = state_spec(definition.state_type)
    shape = {
        "states": sorted(definition.declared),
        "wait": sorted(definition.wait_states),
        "entry": definition.entry_point,
        "transitions": sorted(
            (t.source, t.event, t.target) for t in definition.transitions
        ),
        "fields": sorted((name, repr(spec.types[name])) for name in spec.fields),
    }
    digest = hashlib.sha256(msgspec.json.encode(shape)).hexdigest()
    return f"fp-{digest[:12]}"
