"""Workflow definitions: the builder and the immutable compiled definition.

This module is pure Python (no trio): a compiled :class:`WorkflowDefinition` is a value
that any number of runtimes can run.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Generic, Literal, TypeVar, final

import msgspec

from ._diagram import render_svg
from ._state import State, state_spec

__all__ = [
    "AFTER_PREFIX",
    "AUTO_EVENT",
    "FINISH",
    "FINISH_ALIAS",
    "SCHEDULED",
    "START_DUE",
    "START_EVENT",
    "Callback",
    "Transition",
    "WorkflowDefinition",
    "after_event",
    "describe_delay",
    "fingerprint",
    "indexed",
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
SCHEDULED = "__scheduled__"
"""The phase of an instance stored to start later (``start_later``): halted before
its entry point, until its start timer fires (:data:`START_DUE`)."""
START_DUE = "__phronomy.start_due__"
"""The event of a delayed start's timer: the instance starts at its entry point."""
AFTER_PREFIX = "__after_"
"""How the events of timeout transitions begin (``__after_<ms>ms__``): the runtime's
own, never sent by a caller."""


def after_event(delay_ms: int) -> str:
    """The event a timeout transition of *delay_ms* fires on."""
    return f"{AFTER_PREFIX}{delay_ms}ms__"


def describe_delay(delay_ms: int) -> str:
    """*delay_ms* as people write it (``2d``, ``1h30m``, ``90s``, ``250ms``)."""
    if delay_ms % 1000:
        return f"{delay_ms}ms"
    seconds, parts = delay_ms // 1000, []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(parts) or "0s"


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
        after_ms: a timeout transition's delay: taken when nothing else left
            *source* within this many milliseconds of entering it.
    """

    source: str
    target: str
    event: str
    guard: Callback | None = None
    action: Callback | None = None
    automatic: bool = False
    after_ms: int | None = None

    @property
    def label(self) -> str:
        """The trigger as diagrams show it.

        The event, ``after 2d`` for a timeout, nothing for an automatic transition;
        ``[guard]`` follows if it is guarded.
        """
        label = "" if self.automatic else self.event
        if self.after_ms is not None:
            label = f"after {describe_delay(self.after_ms)}"
        return f"{label} [guard]".strip() if self.guard is not None else label

    def describe(self) -> str:
        """``source --event--> target`` (FINISH shown as ``__end__``, the phase of a
        finished instance everywhere)."""
        trigger = self.event
        if self.after_ms is not None:
            trigger = f"after {describe_delay(self.after_ms)}"
        return f"{self.source} --{trigger}--> {self.target}"


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
        routes: state → event → the transitions the event may take from the state,
            in declaration order (what the machine selects from).
        decisions: state (and ``__end__``) → what the machine does on arriving
            there: ``finish``, ``halt``, ``auto``, ``wait`` or ``leaf``.
        effect_events: the external event names, as a set (what effects may post).
        timeouts: state → the delays (ms) of its timeout transitions.
        on_unhandled_event: ``"drop"`` or ``"fail"`` an event the current state does
            not declare.
        version: the definition's version (given, or a fingerprint).
        retention: seconds its closed durable instances are kept (``None``: the
            runtime's default; ``math.inf``: forever).
        checkpoints: checkpoint wait state → the event a durable segment fires there
            once its save of the state is acknowledged (see
            :meth:`~phronomy.Workflow.wait_state`).
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
    routes: Mapping[str, Mapping[str, tuple[Transition, ...]]]
    decisions: Mapping[str, str]
    effect_events: frozenset[str] = frozenset()
    timeouts: Mapping[str, tuple[int, ...]] = msgspec.field(default_factory=dict)
    on_unhandled_event: Literal["drop", "fail"] = "drop"
    version: str = ""
    retention: float | None = None
    checkpoints: Mapping[str, str] = msgspec.field(default_factory=dict)

    def has_event(self, event: str) -> bool:
        """Whether *event* is a declared external event (a timeout's is not)."""
        return (
            event in self.by_event
            and event != AUTO_EVENT
            and not event.startswith(AFTER_PREFIX)
        )

    def external_events_from(self, state: str) -> tuple[str, ...]:
        """The external events declared from *state*, in declaration order."""
        available = self.events_from.get(state, frozenset())
        return tuple(e for e in self.external_events if e in available)

    def timeout_names(self, state: str) -> tuple[str, ...]:
        """The durable timer names of *state*'s timeout transitions."""
        return tuple(f"after:{ms}:{state}" for ms in self.timeouts.get(state, ()))

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
            label = t.label
            lines.append(
                f"    {ids[t.source]} --> {target}" + (f" : {label}" if label else "")
            )
        if self.wait_states:
            lines.append("    classDef wait fill:#fff3cd,stroke:#b58900")
            lines.extend(f"    class {ids[w]} wait" for w in sorted(self.wait_states))
        return "\n".join(lines) + "\n"

    def to_svg(self, *, highlight: str | None = None) -> str:
        """Return the workflow's state diagram as a standalone SVG document.

        Drawn offline by a small layered layout (no network, no Graphviz): states in
        ranks from the initial state, wait states dashed and amber, the end as a
        ringed dot, timeouts dashed; *highlight* (an instance's phase) marks the
        current state. Names are escaped.

        The tutorial's workflow, ``to_svg(highlight="awaiting_manager")``:

        .. workflow-diagram:: examples/tutorial_expenses.py:build
            :highlight: awaiting_manager
        """
        return render_svg(self, highlight=highlight)

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
            label = t.label
            style = ", style=dashed" if t.after_ms is not None else ""
            attrs = f' [label="{label}"{style}]' if label else ""
            lines.append(f'    "{t.source}" -> "{target}"{attrs};')
        lines.append("}")
        return "\n".join(lines) + "\n"


def indexed(
    transitions: tuple[Transition, ...], states: Any, wait_states: Any
) -> dict[str, Any]:
    """What a definition derives from its *transitions*, as its fields: ``by_event``,
    ``auto_states``, ``external_events``, ``effect_events``, ``events_from``,
    ``timeouts``, ``routes`` and ``decisions`` (of *states* and *wait_states*)."""
    by_event: dict[str, list[Transition]] = {}
    events_from: dict[str, set[str]] = {}
    external: list[str] = []
    timeouts: dict[str, list[int]] = {}
    routes: dict[str, dict[str, list[Transition]]] = {}
    for t in transitions:
        by_event.setdefault(t.event, []).append(t)
        routes.setdefault(t.source, {}).setdefault(t.event, []).append(t)
        if t.after_ms is not None:
            events_from.setdefault(t.source, set()).add(t.event)
            delays = timeouts.setdefault(t.source, [])
            if t.after_ms not in delays:
                delays.append(t.after_ms)
        elif not t.automatic:
            events_from.setdefault(t.source, set()).add(t.event)
            if t.event not in external:
                external.append(t.event)
    auto = frozenset(t.source for t in transitions if t.automatic)
    decisions = {FINISH: "finish"}
    for state in (*states, *wait_states):
        decisions[state] = (
            "halt"
            if state in wait_states
            else "auto"
            if state in auto
            else "wait"
            if state in events_from
            else "leaf"
        )
    return {
        "by_event": MappingProxyType({k: tuple(v) for k, v in by_event.items()}),
        "auto_states": auto,
        "external_events": tuple(external),
        "effect_events": frozenset(external),
        "events_from": MappingProxyType(
            {k: frozenset(v) for k, v in events_from.items()}
        ),
        "timeouts": MappingProxyType(
            {k: tuple(sorted(v)) for k, v in timeouts.items()}
        ),
        "routes": MappingProxyType(
            {
                source: MappingProxyType({e: tuple(ts) for e, ts in by.items()})
                for source, by in routes.items()
            }
        ),
        "decisions": MappingProxyType(decisions),
    }


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
