"""Definition building, validation and diagrams (spec §3.1, scenarios 1-4)."""

from __future__ import annotations

from typing import Any

import pytest

import phronomy
from phronomy.workflow._definition import AUTO_EVENT, FINISH


class S(phronomy.State):
    value: int = 0


def test_no_states_declared() -> None:
    # scenario 1
    with pytest.raises(phronomy.DefinitionError, match="no states declared"):
        phronomy.Workflow(S).build()


def test_undefined_target_and_source() -> None:
    # scenarios 2, 3
    wf = phronomy.Workflow(S).state("step").transition("step", "missing")
    with pytest.raises(phronomy.DefinitionError, match=r"undefined state.*missing"):
        wf.build()
    wf = phronomy.Workflow(S).state("step").transition("ghost", phronomy.FINISH)
    with pytest.raises(phronomy.DefinitionError, match=r"undefined state.*ghost"):
        wf.build()


def test_unreachable_states_warn_loudly() -> None:
    # scenario 4; before: a logging warning that nobody sees (the library installs a
    # NullHandler), now a warning class of its own that Python shows by default
    wf = (
        phronomy.Workflow(S)
        .state("start")
        .state("orphan")
        .transition("start", phronomy.FINISH)
    )
    with pytest.warns(phronomy.DefinitionWarning, match=r"unreachable.*'orphan'") as w:
        definition = wf.build()
    assert definition.entry_point == "start"
    assert w[0].filename == __file__  # it points at the caller of build()
    assert issubclass(phronomy.DefinitionWarning, UserWarning)  # shown by default


def test_a_first_declared_wait_state_is_the_entry_point() -> None:
    # Before: the first wf.state() was the entry point, so a workflow declaring its
    # wait state first never waited (invoke finished at once or hung).
    wf = phronomy.Workflow(S).wait_state("awaiting").state("shipping")
    wf.transition("awaiting", "shipping", on="approve")
    wf.transition("shipping", phronomy.FINISH)
    assert wf.build().entry_point == "awaiting"
    definition = phronomy.Workflow(S).wait_state("w").build()  # no initial() needed
    assert definition.entry_point == "w"
    with pytest.raises(phronomy.DefinitionError, match="no states declared"):
        phronomy.Workflow(S).build()


def test_initial_names_the_entry_point_and_must_be_declared() -> None:
    wf = phronomy.Workflow(S).wait_state("w").state("first").state("second")
    wf.transition("first", "second").transition("second", "w").initial("first")
    assert wf.build().entry_point == "first"
    with pytest.raises(phronomy.DefinitionError, match="initial state 'nope'"):
        phronomy.Workflow(S).state("a").initial("nope").build()


async def test_a_workflow_that_starts_at_a_wait_state_halts_there(
    runtime: phronomy.Runtime,
) -> None:
    wf = phronomy.Workflow(S, name="wait-first").wait_state("awaiting")
    wf.state("shipping").transition("awaiting", "shipping", on="approve")
    wf.transition("shipping", phronomy.FINISH)
    flow = wf.build()
    halted = await runtime.workflows.invoke(flow)
    assert (halted.halted, halted.phase) == (True, "awaiting")
    done = await runtime.workflows.send_event(flow, "approve", halted=halted)
    assert done.phase == phronomy.FINISH


def test_state_kinds_cannot_be_mixed_and_names_are_checked() -> None:
    with pytest.raises(phronomy.DefinitionError, match="wait state"):
        phronomy.Workflow(S).wait_state("x").state("x")
    with pytest.raises(phronomy.DefinitionError, match="normal state"):
        phronomy.Workflow(S).state("x").wait_state("x")
    for bad in ("", "has space", "__end__", "__finish__", "__private"):
        with pytest.raises(phronomy.DefinitionError):
            phronomy.Workflow(S).state(bad)
    with pytest.raises(phronomy.DefinitionError, match="reserved"):
        phronomy.Workflow(S).state("a").transition("a", "a", on=AUTO_EVENT)


def test_automatic_transition_from_a_wait_state_is_refused() -> None:
    wf = (
        phronomy.Workflow(S)
        .state("a")
        .wait_state("w")
        .transition("a", "w")
        .transition("w", phronomy.FINISH)
    )
    with pytest.raises(phronomy.DefinitionError, match="can never fire"):
        wf.build()


def test_actions_for_undefined_states_are_refused() -> None:
    wf = phronomy.Workflow(S).state("a").entry("ghost", lambda s: None)
    with pytest.raises(phronomy.DefinitionError, match="ghost"):
        wf.build()


def test_callable_arity_is_checked_at_declaration() -> None:
    def two(state: S, event: Any) -> None: ...

    def four(a: Any, b: Any, c: Any, d: Any) -> None: ...

    def none() -> None: ...

    wf = phronomy.Workflow(S)
    wf.state("a", entry=two)
    assert wf.build().entry_actions["a"][0].arity == 2
    with pytest.raises(phronomy.DefinitionError, match="at most 3"):
        phronomy.Workflow(S).state("a", entry=four)
    with pytest.raises(phronomy.DefinitionError, match="must accept the state"):
        phronomy.Workflow(S).state("a", entry=none)
    with pytest.raises(phronomy.DefinitionError, match="at most 2"):
        phronomy.Workflow(S).state("a").transition(
            "a", "a", on="e", guard=lambda s, e, x: True
        )
    with pytest.raises(phronomy.DefinitionError, match="callable"):
        phronomy.Workflow(S).state("a", entry=[42])  # type: ignore[list-item]

    class OneArg:
        def __call__(self, state: S) -> None: ...

    def variadic(*args: Any) -> None: ...

    d = phronomy.Workflow(S).state("a", entry=[OneArg(), variadic, len]).build()
    assert [c.arity for c in d.entry_actions["a"]] == [1, 3, 1]


def test_compiled_definition_is_immutable_and_indexed() -> None:
    wf = phronomy.Workflow(S, name="flow")
    wf.state("draft").wait_state("review").state("ship")
    wf.transition("draft", "review")
    wf.transition("review", "ship", on="approve", guard=lambda s, e: True)
    wf.transition("review", "draft", on="reject")
    wf.transition("ship", "__finish__")
    d = wf.build()
    assert d.name == "flow"
    assert d.external_events == ("approve", "reject")
    assert d.events_from["review"] == frozenset({"approve", "reject"})
    assert d.external_events_from("review") == ("approve", "reject")
    assert d.external_events_from("ship") == ()
    assert d.auto_states == frozenset({"draft", "ship"})
    assert d.transitions[-1].target == FINISH
    assert d.has_event("approve")
    assert not d.has_event(AUTO_EVENT)
    with pytest.raises(AttributeError):
        d.name = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        d.by_event["x"] = ()  # type: ignore[index]
    # the builder can keep going without affecting the compiled definition
    wf.state("extra")
    assert "extra" not in d.declared


def test_mermaid_and_dot_export() -> None:
    wf = phronomy.Workflow(S, name="orders")
    wf.state("draft").wait_state("awaiting-approval").state("ship")
    wf.transition("draft", "awaiting-approval")
    wf.transition("awaiting-approval", "ship", on="approve", guard=lambda s: True)
    wf.transition("ship", phronomy.FINISH)
    d = wf.build()
    mermaid = d.to_mermaid()
    assert mermaid.startswith("stateDiagram-v2\n")
    assert '    state "awaiting-approval" as awaiting_approval' in mermaid
    assert "    [*] --> draft" in mermaid
    assert "    draft --> awaiting_approval\n" in mermaid
    assert "    awaiting_approval --> ship : approve [guard]" in mermaid
    assert "    ship --> [*]" in mermaid
    assert "    class awaiting_approval wait" in mermaid
    dot = d.to_dot()
    assert dot.startswith('digraph "orders" {')
    assert '"awaiting-approval" [shape=octagon];' in dot
    assert '"awaiting-approval" -> "ship" [label="approve [guard]"];' in dot
    assert '"ship" -> "[end]";' in dot


def test_state_type_must_be_a_state() -> None:
    with pytest.raises(phronomy.DefinitionError):
        phronomy.Workflow(dict)  # type: ignore[type-var]
    with pytest.raises(phronomy.DefinitionError, match="empty"):
        phronomy.Workflow(S, name="")
