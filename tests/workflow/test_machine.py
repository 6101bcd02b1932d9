"""The sans-IO machine (spec §3.2): unit tests and a property test against a reference."""

from __future__ import annotations

import ast
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import msgspec
import pytest
from hypothesis import given, settings, strategies as st

import phronomy
from phronomy.engine import ResultHandle
from phronomy.workflow import _machine as machine
from phronomy.workflow._callbacks import apply_hook
from phronomy.workflow._definition import AUTO_EVENT, FINISH
from phronomy.workflow._intents import Offload


class Ctx(phronomy.State):
    value: int = 0
    trace: Annotated[list[str], phronomy.APPEND] = []  # noqa: RUF012


class Ev(msgspec.Struct, frozen=True):
    type: str
    payload: Any = None


def test_machine_module_is_sans_io() -> None:
    source = Path(machine.__file__).read_text(encoding="utf-8")
    imported: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & {"trio", "sqlite3", "psycopg", "anyio", "asyncio"}


def _flow() -> phronomy.WorkflowDefinition[Ctx]:
    wf = phronomy.Workflow(Ctx)
    wf.state("source", exit=lambda s: s.merge(trace=["exit"]))
    wf.state("target", entry=lambda s: s.merge(trace=["entry"]))
    wf.transition("source", "target", action=lambda s: s.merge(trace=["action"]))
    wf.transition("target", FINISH)
    return wf.build()


def test_callback_order_exit_action_entry() -> None:
    # scenario 22
    fired = machine.fire(_flow(), "source", Ctx(), Ev(AUTO_EVENT), None)
    assert fired is not None
    assert fired.state.trace == ["exit", "action", "entry"]
    assert fired.transition.target == "target"


def test_first_passing_guard_wins_and_later_guards_do_not_run() -> None:
    # scenario 23
    ran: list[str] = []

    def guard(name: str, result: bool) -> Any:
        def check(state: Ctx) -> bool:
            ran.append(name)
            return result

        return check

    def build(first: bool) -> phronomy.WorkflowDefinition[Ctx]:
        wf = phronomy.Workflow(Ctx).state("routing").state("a").state("b")
        wf.transition(
            "routing",
            "a",
            guard=guard("first", first),
            action=lambda s: s.merge(trace=["first"]),
        )
        wf.transition(
            "routing",
            "b",
            guard=guard("second", True),
            action=lambda s: s.merge(trace=["second"]),
        )
        return wf.build()

    fired = machine.fire(build(True), "routing", Ctx(), Ev(AUTO_EVENT), None)
    assert fired is not None
    assert (fired.transition.target, fired.state.trace, ran) == (
        "a",
        ["first"],
        ["first"],
    )
    ran.clear()
    fired = machine.fire(build(False), "routing", Ctx(), Ev(AUTO_EVENT), None)
    assert fired is not None
    assert (fired.transition.target, fired.state.trace, ran) == (
        "b",
        ["second"],
        ["first", "second"],
    )


def test_one_two_and_three_argument_callables() -> None:
    # scenarios 24, 25
    seen: dict[str, Any] = {}

    class OneArg:
        def __call__(self, state: Ctx) -> None:
            seen["one"] = True

    def two(state: Ctx, event: Any) -> None:
        seen["event"] = (event.type, event.payload)

    def three(state: Ctx, event: Any, effects: Any) -> None:
        seen["effects"] = effects

    wf = phronomy.Workflow(Ctx).state("a", entry=three).state("b").state("c")
    wf.transition("a", "b", action=OneArg())
    wf.transition("b", "c", on="advance", action=two)
    d = wf.build()
    machine.fire(d, "a", Ctx(), Ev(AUTO_EVENT), "FX")
    machine.fire(d, "b", Ctx(), Ev("advance", {"value": 42}), "FX")
    machine.enter(d, "a", Ctx(), Ev("start"), "FX")
    assert seen == {"one": True, "event": ("advance", {"value": 42}), "effects": "FX"}


def test_action_results_none_state_dict_and_other() -> None:
    wf = phronomy.Workflow(Ctx).state("a").state("b")
    wf.transition("a", "b", action=lambda s: None)
    fired = machine.fire(wf.build(), "a", Ctx(value=5), Ev(AUTO_EVENT), None)
    assert fired is not None
    assert fired.state == Ctx(value=5)
    wf = phronomy.Workflow(Ctx).state("a").state("b")
    wf.transition("a", "b", action=lambda s: {"value": 1})
    with pytest.raises(
        phronomy.InvalidActionResultError, match=r"returned a dict; return state\.merge"
    ):
        machine.fire(wf.build(), "a", Ctx(), Ev(AUTO_EVENT), None)
    wf = phronomy.Workflow(Ctx).state("a", entry=lambda s: 42)
    with pytest.raises(
        phronomy.InvalidActionResultError, match="must return a Ctx or None"
    ):
        machine.enter(wf.build(), "a", Ctx(), Ev("start"), None)


@pytest.mark.parametrize(
    "make",
    [
        lambda: ResultHandle(),
        lambda: ResultHandle.completed(1),
        lambda: ResultHandle.failed(OSError("x")),
    ],
    ids=["pending", "completed", "failed"],
)
def test_transition_action_returning_a_handle_is_refused(make: Any) -> None:
    # scenario 28
    wf = phronomy.Workflow(Ctx).state("source")
    wf.transition("source", FINISH, action=lambda s: make())
    with pytest.raises(
        phronomy.InvalidActionResultError,
        match="source --state_completed--> __end__",
    ):
        machine.fire(wf.build(), "source", Ctx(), Ev(AUTO_EVENT), None)


def test_entry_action_returning_a_coroutine_is_refused_and_closed() -> None:
    # scenario 29
    async def later() -> None: ...

    wf = phronomy.Workflow(Ctx).state("a", entry=lambda s: later())
    with pytest.raises(phronomy.InvalidActionResultError, match="entry action of 'a'"):
        machine.enter(wf.build(), "a", Ctx(), Ev("start"), None)


def test_action_error_stops_later_callbacks() -> None:
    # scenario 30
    trace: list[str] = []

    def boom(state: Ctx) -> None:
        trace.append("action")
        raise RuntimeError("action failed")

    wf = phronomy.Workflow(Ctx)
    wf.state("s", exit=lambda s: trace.append("exit"))
    wf.state("t", entry=lambda s: trace.append("entry"))
    wf.transition("s", "t", action=boom)
    with pytest.raises(RuntimeError, match="action failed"):
        machine.fire(wf.build(), "s", Ctx(), Ev(AUTO_EVENT), None)
    assert trace == ["exit", "action"]


def test_unknown_event_and_event_not_from_current_state() -> None:
    # scenarios 34, 134, 135
    wf = phronomy.Workflow(Ctx).state("state_a").state("state_b")
    wf.transition("state_a", "state_b", on="go_to_b").transition(
        "state_b", FINISH, on="finish"
    )
    d = wf.build()
    with pytest.raises(
        phronomy.TransitionError, match="Unknown FSM event 'nope' for state 'state_a'"
    ):
        machine.fire(d, "state_a", Ctx(), Ev("nope"), None)
    with pytest.raises(
        phronomy.TransitionError,
        match="Transition from 'state_a' via event 'finish' failed",
    ):
        machine.fire(d, "state_a", Ctx(), Ev("finish"), None)


def test_all_guards_rejecting_is_a_no_op() -> None:
    # scenario 31 (machine part)
    wf = phronomy.Workflow(Ctx).state("waiting")
    wf.transition(
        "waiting",
        "waiting",
        on="ignored",
        guard=lambda s: False,
        action=lambda s: s.merge(value=100),
    )
    assert machine.fire(wf.build(), "waiting", Ctx(), Ev("ignored"), None) is None


def test_self_transition_runs_exit_and_entry() -> None:
    wf = phronomy.Workflow(Ctx)
    wf.state(
        "loop",
        entry=lambda s: s.merge(trace=["entry"]),
        exit=lambda s: s.merge(trace=["exit"]),
    )
    wf.transition("loop", "loop", on="again")
    fired = machine.fire(wf.build(), "loop", Ctx(), Ev("again"), None)
    assert fired is not None
    assert fired.state.trace == ["exit", "entry"]


def test_decision_table() -> None:
    wf = (
        phronomy.Workflow(Ctx)
        .state("auto")
        .wait_state("wait")
        .state("live")
        .state("leaf")
    )
    wf.transition("auto", "wait").transition("wait", "live", on="go").transition(
        "live", "leaf", on="done"
    )
    d = wf.build()
    assert [machine.decide(d, s) for s in (FINISH, "wait", "auto", "live", "leaf")] == [
        "finish",
        "halt",
        "auto",
        "wait",
        "leaf",
    ]
    with pytest.raises(phronomy.TransitionError, match="State 'ghost' is not defined"):
        machine.decide(d, "ghost")


class Hooked(phronomy.State):
    value: int = 0
    fresh: str = "ok"

    def handle_event(self, event: Any) -> Any:
        if event.type == "stale":
            return phronomy.CONSUME
        if event.type == "bump":
            return self.merge(value=self.value + 100)
        return event.type == "handled"


def test_context_hook_consume_adopt_and_handled() -> None:
    # scenarios 36-38 (machine part)
    wf = phronomy.Workflow(Hooked).state("w")
    for e in ("stale", "bump", "handled", "plain"):
        wf.transition("w", FINISH, on=e)
    d = wf.build()

    def hook(definition: Any, state: Hooked, event: str) -> Any:
        outcome = apply_hook(definition, "w", state, Ev(event))
        assert outcome is not None
        return outcome

    assert hook(d, Hooked(), "stale").consumed
    bumped = hook(d, Hooked(value=1), "bump")
    assert (bumped.state.value, bumped.handled, bumped.consumed) == (101, True, False)
    assert hook(d, Hooked(), "handled").handled
    # not handled (or no hook runs): nothing changes, and no outcome is made
    assert apply_hook(d, "w", Hooked(), Ev("plain")) is None
    assert apply_hook(d, "w", Hooked(), Ev(AUTO_EVENT)) is None
    # handled, but no transition for it from the current state: dropped
    d2 = (
        phronomy.Workflow(Hooked).state("w").transition("w", FINISH, on="other").build()
    )
    assert hook(d2, Hooked(), "handled").consumed


# --- property: the machine agrees with a tiny reference interpreter ------------------------


@dataclass
class Spec:
    states: list[str]
    waits: set[str]
    transitions: list[
        tuple[str, str, str, int]
    ]  # source, target, event, guard modulus (0: none)
    events: list[str] = field(default_factory=list)


def _definition(spec: Spec) -> phronomy.WorkflowDefinition[Ctx]:
    wf = phronomy.Workflow(Ctx)
    for name in spec.states:
        if name in spec.waits:
            wf.wait_state(name)
        else:
            wf.state(
                name,
                entry=lambda s, n=name: s.merge(
                    trace=[f"entry:{n}"], value=s.value + 3
                ),
                exit=lambda s, n=name: s.merge(trace=[f"exit:{n}"], value=s.value + 1),
            )
    for index, (source, target, event, modulus) in enumerate(spec.transitions):
        guard = None if modulus == 0 else (lambda s, m=modulus: s.value % m != 0)
        wf.transition(
            source,
            target,
            on=None if event == AUTO_EVENT else event,
            guard=guard,
            action=lambda s, i=index: s.merge(
                trace=[f"action:{i}"], value=(s.value * 2) % 97
            ),
        )
    wf.initial(spec.states[0])
    with warnings.catch_warnings():  # random definitions may leave states unreachable
        warnings.simplefilter("ignore", phronomy.DefinitionWarning)
        return wf.build()


def _reference_fire(
    spec: Spec, current: str, value: int, event: str
) -> tuple[str, int, list[str]] | str | None:
    """An independent, naive reading of spec §3.2 and §2.8.4."""
    if event not in {t[2] for t in spec.transitions}:
        return "unknown"
    candidates = [
        (i, t)
        for i, t in enumerate(spec.transitions)
        if t[2] == event and t[0] == current
    ]
    if not candidates:
        return "not-declared"
    for index, (source, target, _, modulus) in candidates:
        if modulus and value % modulus == 0:
            continue
        trace: list[str] = []
        if source not in spec.waits:
            trace.append(f"exit:{source}")
            value += 1
        trace.append(f"action:{index}")
        value = (value * 2) % 97
        if target != FINISH and target not in spec.waits:
            trace.append(f"entry:{target}")
            value += 3
        return target, value, trace
    return "auto-rejected" if event == AUTO_EVENT else None


@st.composite
def specs(draw: st.DrawFn) -> Spec:
    count = draw(st.integers(2, 5))
    states = [f"s{i}" for i in range(count)]
    waits = set(draw(st.lists(st.sampled_from(states[1:]), max_size=2)))
    events = [AUTO_EVENT, "e0", "e1", "e2"]
    transitions = draw(
        st.lists(
            st.tuples(
                st.sampled_from(states),
                st.sampled_from([*states, FINISH]),
                st.sampled_from(events),
                st.sampled_from([0, 0, 2, 3]),
            ),
            min_size=1,
            max_size=10,
        )
    )
    # automatic transitions from wait states are refused at build time
    transitions = [
        t for t in transitions if not (t[2] == AUTO_EVENT and t[0] in waits)
    ] or [(states[0], FINISH, "e0", 0)]
    return Spec(states=states, waits=waits, transitions=transitions, events=events)


@settings(max_examples=300, deadline=None)
@given(
    spec=specs(),
    start=st.integers(0, 50),
    events=st.lists(st.sampled_from([AUTO_EVENT, "e0", "e1", "e2", "zz"]), max_size=8),
)
def test_machine_agrees_with_the_reference(
    spec: Spec, start: int, events: list[str]
) -> None:
    definition = _definition(spec)
    current, state = spec.states[0], Ctx(value=start)
    for event in events:
        expected = _reference_fire(spec, current, state.value, event)
        try:
            fired = machine.fire(definition, current, state, Ev(event), None)
        except phronomy.TransitionError as exc:
            message = str(exc)
            if "Unknown FSM event" in message:
                assert expected == "unknown"
            elif "every automatic" in message:
                assert expected == "auto-rejected"
            else:
                assert expected == "not-declared"
            continue
        if expected is None:
            assert fired is None
            continue
        assert fired is not None
        assert isinstance(expected, tuple)
        target, value, trace = expected
        assert fired.transition.target == target
        assert fired.state.value == value
        assert fired.state.trace == [*state.trace, *trace]
        current, state = target, fired.state
        if current == FINISH:
            break


# --- the machine object: it returns what should happen ------------------------------


def _machine_flow() -> phronomy.WorkflowDefinition[Ctx]:
    def request(s: Ctx, e: Any, effects: phronomy.Effects) -> None:
        effects.offload(print, "x", on_done="approve")

    wf = phronomy.Workflow(Ctx, name="steps")
    wf.state("a", entry=lambda s: s.merge(trace=["a"]))
    wf.state("b", entry=request)
    wf.state("live")
    wf.wait_state("parked")
    wf.transition("a", "b")
    wf.transition("b", "live")
    wf.transition("live", "parked", on="park")
    wf.transition("live", "live", on="noop", guard=lambda s: False)
    wf.transition("parked", FINISH, on="approve")
    return wf.build()


def test_the_machine_returns_steps_and_intents_without_doing_io() -> None:
    m = machine.WorkflowMachine(_machine_flow(), Ctx(), recursion_limit=10)
    first = m.start(Ev("start"))
    assert (first.next, first.current, first.intents) == ("auto", "a", ())
    second = m.advance(Ev(AUTO_EVENT))
    assert (second.next, second.current) == ("auto", "b")
    (intent,) = second.intents
    assert isinstance(intent, Offload)
    assert (intent.fn, intent.args, intent.on_done) == (print, ("x",), "approve")
    third = m.advance(Ev(AUTO_EVENT))
    assert (third.next, third.intents) == ("wait", ())
    assert m.handle(Ev("noop")).next == "rejected"
    assert m.handle(Ev("park")).next == "halt"
    # one transition since the last external event (the count the limit bounds)
    assert (m.current, m.state.trace, m.transitions) == ("parked", ["a"], 1)
    resumed = machine.WorkflowMachine(
        _machine_flow(), m.state, recursion_limit=10, phase="parked"
    )
    assert resumed.resume(Ev("approve")).next == "finish"


def test_the_machine_drops_the_requests_of_a_failed_step() -> None:
    def request_then_fail(s: Ctx, e: Any, effects: phronomy.Effects) -> None:
        effects.schedule(1, "go")
        raise KeyError("boom")

    wf = phronomy.Workflow(Ctx, name="fails").state("a")
    wf.state("b", entry=request_then_fail)
    wf.transition("a", "b", on="go")
    wf.transition("b", FINISH, on="go")
    m = machine.WorkflowMachine(wf.build(), Ctx(), recursion_limit=5)
    assert m.start(Ev("start")).next == "wait"
    with pytest.raises(KeyError):
        m.handle(Ev("go"))
    assert m.current == "a"  # the failed transition did not move the machine


def test_the_recursion_limit_stops_a_runaway_chain() -> None:
    wf = phronomy.Workflow(Ctx, name="loop").state("spin")
    wf.transition("spin", "spin", action=lambda s: s.merge(value=s.value + 1))
    m = machine.WorkflowMachine(wf.build(), Ctx(), recursion_limit=3)
    assert m.start(Ev("start")).next == "auto"
    for _ in range(3):
        assert m.advance(Ev(AUTO_EVENT)).next == "auto"
    with pytest.raises(
        phronomy.TransitionError,
        match="Recursion limit \\(3\\) exceeded at state 'spin'",
    ):
        m.advance(Ev(AUTO_EVENT))
    assert m.state.value == 3
