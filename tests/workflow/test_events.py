"""Live events: undeclared ones, awaitable delivery, resume's choice, the recursion limit."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import trio

import phronomy
from phronomy.workflow import FINISH

from .helpers import Value, live_flow, start_live, until


def _two_events() -> phronomy.WorkflowDefinition[Value]:
    wf = phronomy.Workflow(Value, name="two-events").wait_state("w").initial("w")
    wf.transition("w", FINISH, on="approve", action=lambda s: s.merge(value="ok"))
    wf.transition("w", FINISH, on="cancel", action=lambda s: s.merge(value="no"))
    return wf.build()


async def test_an_undeclared_event_is_dropped_and_counted(
    runtime: phronomy.Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    # Before: a duplicate webhook's signal was accepted, then failed the whole run.
    wf = phronomy.Workflow(Value, name="dup").state("a").state("b")
    wf.transition("a", "b", on="go", action=lambda s: s.merge(count=s.count + 1))
    wf.transition("b", FINISH, on="finish")
    flow = wf.build()
    handle = runtime.workflows.start(flow, workflow_instance_id="dup-1")
    await until(lambda: runtime.workflows.signal(flow, "dup-1", "go"))
    assert runtime.workflows.signal(flow, "dup-1", "go")  # the duplicate
    assert runtime.workflows.signal(flow, "dup-1", "finish")
    with trio.fail_after(5):
        result = await handle.result()
    assert (result.phase, result.state.count) == (FINISH, 1)
    stats = runtime.workflows.statistics()
    assert (stats.events_dropped, stats.events_transitioned) == (1, 2)
    assert "dropped event 'go': state 'b' does not declare it" in caplog.text


async def test_deliver_reports_what_happened(runtime: phronomy.Runtime) -> None:
    flow = live_flow()
    deliver = runtime.workflows.deliver
    outcome = await deliver(flow, "d-1", "mark")
    assert (outcome.status, outcome.phase) == ("not_live", None)
    handle = await start_live(runtime, flow, "d-1")  # one "mark" was signalled
    assert (await deliver(flow, "d-1", "mark")).status == "transitioned"
    assert (await deliver(flow, "d-1", "ignored")).status == "rejected"
    done = await deliver(flow, "d-1", "finish")
    assert (done.status, done.phase) == ("transitioned", FINISH)
    result = await handle.result()
    assert result.state.count == 2  # the rejected event changed nothing
    assert (await deliver(flow, "d-1", "mark")).status == "not_live"
    with pytest.raises(phronomy.InvalidInputError, match="Unknown event 'nope'"):
        await deliver(flow, "d-1", "nope")


async def test_deliver_raises_what_the_transition_raised(
    runtime: phronomy.Runtime,
) -> None:
    wf = phronomy.Workflow(Value, name="boom").state("live")
    wf.transition("live", FINISH, on="explode", action=lambda s: 1 / 0)
    wf.transition("live", FINISH, on="finish")
    flow = wf.build()
    handle = runtime.workflows.start(flow, workflow_instance_id="b-1")
    await until(lambda: runtime.workflows.segment("b-1") is not None)
    await until(lambda: runtime.workflows.segment("b-1").status == "executing")  # type: ignore[union-attr]
    with pytest.raises(ZeroDivisionError):
        await runtime.workflows.deliver(flow, "b-1", "explode")
    with pytest.raises(ZeroDivisionError):
        await handle.result()


async def test_a_duplicate_signal_during_an_effect_is_dropped(
    runtime: phronomy.Runtime,
) -> None:
    # The webhook fires twice while the payment call (an effect) is still running.
    release = threading.Event()

    def charge(amount: int) -> str:
        release.wait(5)
        return f"charged {amount}"

    def pay(s: Value, e: Any, effects: phronomy.Effects) -> Value:
        effects.offload(charge, 10, on_done="charged")
        return s.merge(steps=["paying"])

    wf = (
        phronomy.Workflow(Value, name="payments")
        .state("new")
        .state("paying", entry=pay)
    )
    wf.transition("new", "paying", on="webhook")
    wf.transition(
        "paying", FINISH, on="charged", action=lambda s, e: s.merge(value=e.payload)
    )
    flow = wf.build()
    handle = runtime.workflows.start(flow, workflow_instance_id="p-1")
    await until(lambda: runtime.workflows.signal(flow, "p-1", "webhook"))
    duplicate = await runtime.workflows.deliver(flow, "p-1", "webhook")
    assert (duplicate.status, duplicate.phase) == ("dropped", "paying")
    release.set()
    result = await handle.result()
    assert (result.state.value, result.state.steps) == ("charged 10", ["paying"])


async def test_failing_on_undeclared_events_is_opt_in(
    runtime: phronomy.Runtime,
) -> None:
    wf = phronomy.Workflow(Value, name="strict", on_unhandled_event="fail")
    wf.state("a").state("b").transition("a", "b", on="go").transition("b", FINISH)
    flow = wf.build()
    assert flow.on_unhandled_event == "fail"
    wf2 = phronomy.Workflow(Value, name="strict2", on_unhandled_event="fail")
    wf2.state("a").state("b").transition("a", "b", on="go")
    wf2.transition("b", FINISH, on="finish")
    strict = wf2.build()
    handle = runtime.workflows.start(strict, workflow_instance_id="s-1")
    await until(lambda: runtime.workflows.signal(strict, "s-1", "finish"))
    with pytest.raises(phronomy.TransitionError, match="not declared for the current"):
        with trio.fail_after(5):
            await handle.result()
    with pytest.raises(phronomy.DefinitionError, match="'drop' or 'fail'"):
        phronomy.Workflow(Value, on_unhandled_event="ignore")  # type: ignore[arg-type]


async def test_resume_needs_a_single_event_or_a_name(runtime: phronomy.Runtime) -> None:
    # Before: resume() fired the first event declared, which could be the cancel.
    flow = _two_events()
    halted = await runtime.workflows.invoke(flow)
    with pytest.raises(phronomy.errors.AmbiguousEventError) as caught:
        await runtime.workflows.resume(flow, halted)
    assert caught.value.candidates == ("approve", "cancel")
    assert "name the event" in str(caught.value)
    done = await runtime.workflows.send_event(flow, "cancel", halted=halted)
    assert done.state.value == "no"
    single = phronomy.Workflow(Value, name="single").wait_state("w").initial("w")
    single.transition("w", FINISH, on="approve", action=lambda s: s.merge(value="ok"))
    only = single.build()
    resumed = await runtime.workflows.resume(only, await runtime.workflows.invoke(only))
    assert resumed.state.value == "ok"


async def test_a_live_instance_takes_any_number_of_signals(
    runtime: phronomy.Runtime,
) -> None:
    # Before: the recursion limit (25) counted signal-driven transitions too, so the
    # 26th signal failed the run. It bounds chains of automatic transitions.
    flow = live_flow()
    handle = await start_live(runtime, flow, "many")
    for _ in range(99):
        assert (await runtime.workflows.deliver(flow, "many", "mark")).status == (
            "transitioned"
        )
    runtime.workflows.signal(flow, "many", "finish")
    assert (await handle.result()).state.count == 100
    loop = phronomy.Workflow(Value, name="loop").state("spin")
    loop.transition("spin", "spin", action=lambda s: s.merge(count=s.count + 1))
    with pytest.raises(phronomy.TransitionError, match=r"Recursion limit \(25\)"):
        await runtime.workflows.invoke(loop.build())
