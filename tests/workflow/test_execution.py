"""Execution semantics on a live runtime (spec §3.3, scenarios 14-47, 134-135)."""

from __future__ import annotations

import threading
from typing import Annotated, Any

import pytest
import trio

import phronomy
from phronomy.workflow._definition import AUTO_EVENT, FINISH

from .helpers import (
    Value,
    admission_state,
    approval_flow,
    guarded_flow,
    live_flow,
    segment_id,
    start_live,
    until,
)


async def test_single_state_action_and_finish(runtime: phronomy.Runtime) -> None:
    # scenario 14
    class V(phronomy.State):
        value: int = 0

    wf = (
        phronomy.Workflow(V)
        .state("step", entry=lambda s: s.merge(value=42))
        .transition("step", FINISH)
    )
    result = await runtime.workflows.invoke(wf.build())
    assert (result.state.value, result.phase, result.halted, result.revision) == (
        42,
        FINISH,
        False,
        None,
    )
    assert result.workflow == "V"


async def test_append_reducer_across_states(runtime: phronomy.Runtime) -> None:
    # scenario 15
    wf = phronomy.Workflow(Value)
    wf.state("one", entry=lambda s: s.merge(steps="first"))
    wf.state("two", entry=lambda s: s.merge(steps="second"))
    wf.transition("one", "two").transition("two", FINISH)
    assert (await runtime.workflows.invoke(wf.build())).state.steps == [
        "first",
        "second",
    ]


async def test_halt_and_send_event(runtime: phronomy.Runtime) -> None:
    # scenario 16
    flow = approval_flow()
    halted = await runtime.workflows.invoke(flow, {"value": "start"})
    assert (halted.phase, halted.halted, halted.state.value) == (
        "awaiting",
        True,
        "start:prepared",
    )
    done = await runtime.workflows.send_event(flow, "approve", halted=halted)
    assert (done.state.value, done.phase, done.halted) == (
        "start:prepared:confirmed",
        FINISH,
        False,
    )
    assert done.state.steps == [
        "prepare",
        "confirm",
    ]  # prepare's entry did not run again
    assert done.workflow_instance_id == halted.workflow_instance_id


async def test_send_event_input_is_merged_first(runtime: phronomy.Runtime) -> None:
    # scenario 17
    wf = (
        phronomy.Workflow(Value)
        .wait_state("awaiting")
        .initial("awaiting")
        .state("execute")
    )
    wf.entry("execute", lambda s: s.merge(value=f"{s.value}:executed"))
    wf.transition("awaiting", "execute", on="approve").transition("execute", FINISH)
    flow = wf.build()
    halted = await runtime.workflows.invoke(flow, {"value": "original"})
    done = await runtime.workflows.send_event(
        flow, "approve", halted=halted, input={"value": "overridden"}
    )
    assert done.state.value == "overridden:executed"


async def test_resume_fires_the_first_event_of_the_phase(
    runtime: phronomy.Runtime,
) -> None:
    # scenarios 18, 19
    wf = phronomy.Workflow(Value).wait_state("w").initial("w")
    wf.transition("w", FINISH, on="resume", action=lambda s: s.merge(value="resumed"))
    flow = wf.build()
    done = await runtime.workflows.resume(flow, await runtime.workflows.invoke(flow))
    assert done.state.value == "resumed"

    wf = phronomy.Workflow(Value).wait_state("stuck").initial("stuck").state("other")
    wf.transition("other", FINISH, on="go")
    with pytest.warns(phronomy.DefinitionWarning, match="'other'"):
        flow = wf.build()  # 'other' is unreachable on purpose
    halted = await runtime.workflows.invoke(flow)
    with pytest.raises(
        phronomy.InstanceStateError,
        match="No external event registered for state 'stuck'",
    ):
        await runtime.workflows.resume(flow, halted)


async def test_unknown_and_misplaced_events_are_refused_synchronously(
    runtime: phronomy.Runtime,
) -> None:
    # scenario 20, and a declared event that does not leave the phase
    flow = approval_flow()
    halted = await runtime.workflows.invoke(flow)
    with pytest.raises(
        phronomy.InvalidInputError,
        match=r"Unknown event 'bogus'\. Valid events: \['approve'\]",
    ):
        await runtime.workflows.send_event(flow, "bogus", halted=halted)
    other = phronomy.Workflow(Value).wait_state("a").initial("a").state("b")
    other.transition("a", "b", on="go").transition("b", FINISH, on="later")
    flow2 = other.build()
    halted2 = await runtime.workflows.invoke(flow2)
    with pytest.raises(
        phronomy.TransitionError, match="Transition from 'a' via event 'later' failed"
    ):
        await runtime.workflows.send_event(flow2, "later", halted=halted2)


async def test_send_event_validates_the_halted_result(
    runtime: phronomy.Runtime,
) -> None:
    # scenario 21
    flow = approval_flow()
    halted = await runtime.workflows.invoke(flow)
    broken = phronomy.WorkflowResult(
        state=halted.state,
        phase="awaiting",
        workflow_instance_id="",
        revision=None,
        halted=True,
        workflow="approval",
    )
    with pytest.raises(phronomy.InvalidInputError, match="workflow_instance_id"):
        await runtime.workflows.send_event(flow, "approve", halted=broken)
    done = await runtime.workflows.send_event(flow, "approve", halted=halted)
    with pytest.raises(phronomy.InstanceStateError, match="is finished"):
        await runtime.workflows.send_event(flow, "approve", halted=done)
    with pytest.raises(phronomy.InvalidInputError, match="event's name"):
        await runtime.workflows.send_event(flow, halted)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="event"):
        await runtime.workflows.send_event(flow, halted=halted)  # type: ignore[call-arg]
    with pytest.raises(phronomy.InvalidInputError, match="needs a store"):
        await runtime.workflows.send_event(
            flow, event="approve", workflow_instance_id="x"
        )
    # Before: a bare TypeError; now it says the two ways to name the instance
    with pytest.raises(
        phronomy.InvalidInputError,
        match=r"needs to know which instance: pass workflow_instance_id=.* or halted=",
    ):
        await runtime.workflows.send_event(flow, "approve")


async def test_actions_see_events_targeted_at_their_session(
    runtime: phronomy.Runtime,
) -> None:
    # scenarios 24, 25, 27
    seen: list[tuple[str, Any, str]] = []

    def record(state: Value, event: Any) -> None:
        seen.append((event.type, event.payload, event.target_id))

    wf = phronomy.Workflow(Value).state("a").wait_state("w").state("b")
    wf.transition("a", "w", action=record)
    wf.transition("w", "b", on="approve", action=record)
    wf.transition("b", FINISH, on="advance", action=record)
    flow = wf.build()
    halted = await runtime.workflows.invoke(flow)
    handle = runtime.workflows.start(flow)  # a second instance, left halted
    await handle.result()
    resumed = runtime.workflows.start_event(
        flow,
        "approve",
        halted=halted,
    )
    await until(
        lambda: runtime.workflows.signal(
            flow, halted.workflow_instance_id, "advance", {"value": 42}
        )
    )
    await resumed.result()
    assert [(t, p) for t, p, _ in seen] == [
        (AUTO_EVENT, None),
        (AUTO_EVENT, None),
        ("approve", None),
        ("advance", {"value": 42}),
    ]
    assert all(target for _, _, target in seen)
    assert (
        seen[2][2] == seen[3][2]
    )  # the same session handled the resume and the signal
    assert seen[0][2] != seen[2][2]  # a new segment is a new session


async def test_action_returning_a_state_of_the_workflow(
    runtime: phronomy.Runtime,
) -> None:
    # scenario 26, adapted: an action returns a state instance (not a dict)
    wf = phronomy.Workflow(Value).state(
        "s", entry=lambda s: Value(value="action:entry")
    )
    wf.transition("s", FINISH)
    result = await runtime.workflows.invoke(wf.build())
    assert (result.state.value, result.phase) == ("action:entry", FINISH)


async def test_invalid_action_results_fail_the_segment(
    runtime: phronomy.Runtime,
) -> None:
    # scenarios 28-30 through the runtime
    wf = (
        phronomy.Workflow(Value)
        .state("source")
        .transition(
            "source", FINISH, action=lambda s: runtime.workflows.start(approval_flow())
        )
    )
    with pytest.raises(
        phronomy.InvalidActionResultError,
        match="source --state_completed--> __end__",
    ):
        await runtime.workflows.invoke(wf.build())
    wf = (
        phronomy.Workflow(Value)
        .state("s", entry=lambda s: {"value": "x"})
        .transition("s", FINISH)
    )
    with pytest.raises(phronomy.InvalidActionResultError, match="returned a dict"):
        await runtime.workflows.invoke(wf.build())


async def test_signals_with_rejecting_guards(runtime: phronomy.Runtime) -> None:
    # scenario 31
    flow = live_flow()
    handle = await start_live(runtime, flow, "live-31")
    assert runtime.workflows.signal(flow, "live-31", "ignored")
    assert runtime.workflows.signal(flow, "live-31", "finish")
    result = await handle.result()
    assert result.state.count == 1


async def test_recursion_limit(runtime: phronomy.Runtime) -> None:
    # scenario 32
    wf = (
        phronomy.Workflow(Value)
        .state("a")
        .state("b")
        .transition("a", "b")
        .transition("b", "a")
    )
    flow = wf.build()
    with pytest.raises(
        phronomy.TransitionError, match=r"Recursion limit \(3\) exceeded"
    ):
        await runtime.workflows.invoke(flow, recursion_limit=3)
    with pytest.raises(
        phronomy.TransitionError, match=r"Recursion limit \(25\) exceeded"
    ):
        await runtime.workflows.invoke(flow)
    with pytest.raises(phronomy.InvalidInputError):
        runtime.workflows.start(flow, recursion_limit=0)


async def test_recursion_limit_counts_transitions_exactly(
    runtime: phronomy.Runtime,
) -> None:
    wf = phronomy.Workflow(Value)
    for name in ("a", "b", "c"):
        wf.state(name)
    wf.transition("a", "b").transition("b", "c").transition("c", FINISH)
    flow = wf.build()
    assert (await runtime.workflows.invoke(flow, recursion_limit=3)).phase == FINISH
    with pytest.raises(phronomy.TransitionError):
        await runtime.workflows.invoke(flow, recursion_limit=2)


async def test_entry_error_fails_only_that_workflow(runtime: phronomy.Runtime) -> None:
    # scenario 33
    def boom(state: Value) -> None:
        raise RuntimeError("deliberate error")

    bad = (
        phronomy.Workflow(Value).state("s", entry=boom).transition("s", FINISH).build()
    )
    with pytest.raises(RuntimeError, match="deliberate error"):
        await runtime.workflows.invoke(bad)
    assert (await runtime.workflows.invoke(approval_flow())).halted
    assert runtime.state == "running"


async def test_signal_without_transition_from_the_current_state_fails(
    runtime: phronomy.Runtime,
) -> None:
    # scenario 34, with the definition opting into the spec's behaviour (by default
    # an undeclared event is dropped: see test_events.py)
    wf = phronomy.Workflow(Value, on_unhandled_event="fail")
    wf.state("state_a").state("state_b").state("done")
    wf.transition("state_a", "state_b", on="go_to_b").transition(
        "state_b", "done", on="finish"
    )
    flow = wf.build()
    handle = runtime.workflows.start(flow, workflow_instance_id="wf-34")
    await until(lambda: runtime.workflows.signal(flow, "wf-34", "finish"))
    with pytest.raises(phronomy.TransitionError, match="Transition from 'state_a'"):
        with trio.fail_after(5):
            await handle.result()
    assert admission_state(runtime, "wf-34") is None


async def test_guarded_signal_correlation(runtime: phronomy.Runtime) -> None:
    # scenario 35
    class Req(phronomy.State):
        request_id: str = "r-1"
        answer: str = ""

    wf = phronomy.Workflow(Req).state("waiting")
    wf.transition(
        "waiting",
        FINISH,
        on="reply",
        guard=lambda s, e: e.payload["request_id"] == s.request_id,
        action=lambda s, e: s.merge(answer=e.payload["answer"]),
    )
    flow = wf.build()
    handle = runtime.workflows.start(flow, workflow_instance_id="req-35")
    await until(
        lambda: runtime.workflows.signal(
            flow, "req-35", "reply", {"request_id": "stale", "answer": "old"}
        )
    )
    await trio.sleep(0.02)
    assert not handle.done
    assert runtime.workflows.signal(
        flow, "req-35", "reply", {"request_id": "r-1", "answer": "fresh"}
    )
    assert (await handle.result()).state.answer == "fresh"


class Correlated(phronomy.State):
    current: str = "c-2"
    answer: str = ""
    bumped: int = 0

    def handle_event(self, event: Any) -> Any:
        payload = event.payload or {}
        if event.type == "result" and payload.get("id") != self.current:
            return phronomy.CONSUME
        if event.type == "result":
            return self.merge(answer=payload["answer"])
        if event.type == "bump":
            return self.merge(bumped=self.bumped + 100)
        return None


async def test_context_hook_consume_and_adopt(runtime: phronomy.Runtime) -> None:
    # scenarios 36, 37, 38
    wf = phronomy.Workflow(Correlated).state("waiting")
    wf.transition("waiting", FINISH, on="result")
    wf.transition(
        "waiting", "waiting", on="bump", action=lambda s: s.merge(bumped=s.bumped + 1)
    )
    flow = wf.build()
    handle = runtime.workflows.start(flow, workflow_instance_id="hook")
    await until(
        lambda: runtime.workflows.signal(
            flow, "hook", "result", {"id": "c-1", "answer": "stale"}
        )
    )
    assert runtime.workflows.signal(flow, "hook", "bump")
    await trio.sleep(0.02)
    assert not handle.done
    assert runtime.workflows.signal(
        flow, "hook", "result", {"id": "c-2", "answer": "fresh"}
    )
    result = await handle.result()
    assert (result.state.answer, result.state.bumped) == ("fresh", 101)


async def test_unknown_event_posted_directly_fails_the_workflow(
    runtime: phronomy.Runtime,
) -> None:
    # scenario 135
    flow = live_flow()
    handle = runtime.workflows.start(flow, workflow_instance_id="direct")
    await until(lambda: admission_state(runtime, "direct") == "executing")
    session_id = segment_id(runtime, "direct")
    assert session_id is not None
    runtime.engine.post_nowait(
        phronomy.engine.Event(type="nonsense", target_id=session_id)
    )
    with pytest.raises(phronomy.TransitionError, match="Unknown FSM event 'nonsense'"):
        await handle.result()


async def test_automatic_guards_all_rejecting_fail_the_workflow(
    runtime: phronomy.Runtime,
) -> None:
    # scenario 134
    wf = (
        phronomy.Workflow(Value)
        .state("s")
        .transition("s", FINISH, guard=lambda s: False)
    )
    with pytest.raises(
        phronomy.TransitionError,
        match="Transition from 's' via event 'state_completed' failed",
    ):
        await runtime.workflows.invoke(wf.build())
    assert await runtime.recovery.list() == []  # nothing was left recovery-required


async def test_effects_offload_delivers_an_event(runtime: phronomy.Runtime) -> None:
    # scenario 39, with effects instead of callbacks
    class Gen(phronomy.State):
        answer: str = ""
        events: Annotated[list[str], phronomy.APPEND] = []  # noqa: RUF012
        thread: int = 0

    def generate(prompt: str) -> tuple[str, int]:
        return f"answer to {prompt}", threading.get_ident()

    def start_generation(state: Gen, event: Any, effects: phronomy.Effects) -> None:
        effects.offload(generate, "life", on_done="generation_completed")

    wf = phronomy.Workflow(Gen).state("generating", entry=start_generation)
    wf.transition(
        "generating",
        FINISH,
        on="generation_completed",
        action=lambda s, e: s.merge(
            answer=e.payload[0], thread=e.payload[1], events=[e.type]
        ),
    )
    result = await runtime.workflows.invoke(wf.build())
    assert result.state.answer == "answer to life"
    assert result.state.events == ["generation_completed"]
    assert result.state.thread != threading.get_ident()


async def test_on_step_observer_runs_on_the_dispatcher(
    runtime: phronomy.Runtime,
) -> None:
    # scenario 40
    class N(phronomy.State):
        value: int = 0

    wf = phronomy.Workflow(N)
    wf.state("first", entry=lambda s: s.merge(value=1))
    wf.state("second", entry=lambda s: s.merge(value=2))
    wf.transition("first", "second").transition("second", FINISH)
    flow = wf.build()
    seen: list[tuple[str, int, bool]] = []
    result = await runtime.workflows.invoke(
        flow,
        on_step=lambda step: seen.append(
            (step.phase, step.state.value, runtime.is_dispatcher())
        ),
    )
    assert seen == [("first", 1, True), ("second", 2, True)]
    assert result.state.value == 2
    steps = []
    async with runtime.workflows.stream(flow) as stream:
        async for step in stream:
            steps.append((step.phase, step.state.value))
    assert steps == [("first", 1), ("second", 2)]
    assert (await stream.result()).state.value == 2


async def test_observer_errors_reach_the_caller(runtime: phronomy.Runtime) -> None:
    # scenarios 42, 43 (ephemeral)
    err = ValueError("observer exploded")

    def bad(step: Any) -> None:
        raise err

    with pytest.raises(ValueError) as caught:
        await runtime.workflows.invoke(approval_flow(), on_step=bad)
    assert caught.value is err

    def bad_at_halt(step: Any) -> None:
        if step.phase == "awaiting":
            raise err

    handle = runtime.workflows.start(
        approval_flow(), workflow_instance_id="obs-43", on_step=bad_at_halt
    )
    with pytest.raises(ValueError) as caught:
        await handle.result()
    assert caught.value is err
    assert admission_state(runtime, "obs-43") is None


async def test_stream_raises_the_segment_error_after_its_steps(
    runtime: phronomy.Runtime,
) -> None:
    def boom(state: Value) -> None:
        raise KeyError("late failure")

    wf = (
        phronomy.Workflow(Value)
        .state("a")
        .state("b", entry=boom)
        .transition("a", "b")
        .transition("b", FINISH)
    )
    names: list[str] = []

    async def consume() -> None:
        async with runtime.workflows.stream(wf.build()) as stream:
            async for step in stream:
                names.append(step.phase)

    with pytest.raises(KeyError, match="late failure"):
        await consume()
    assert names == ["a"]


async def test_leaving_a_stream_early_leaves_the_segment_running(
    runtime: phronomy.Runtime,
) -> None:
    flow = live_flow()
    async with runtime.workflows.stream(flow, workflow_instance_id="early") as stream:
        async for step in stream:
            assert step.phase == "waiting"
            break
    assert runtime.workflows.signal(flow, "early", "finish")
    assert (await stream.result()).phase == FINISH


async def test_actions_can_start_other_workflows(runtime: phronomy.Runtime) -> None:
    # scenario 44 in trio terms: from the dispatcher, start() (not invoke) is the API
    handles: list[phronomy.ResultHandle[Any]] = []

    def spawn(state: Value) -> None:
        handles.append(runtime.workflows.start(approval_flow(), {"value": "child"}))

    wf = (
        phronomy.Workflow(Value)
        .state("parent", entry=spawn)
        .transition("parent", FINISH)
    )
    await runtime.workflows.invoke(wf.build())
    child = await handles[0].result()
    assert child.state.value == "child:prepared"


async def test_bad_input_is_refused_at_the_boundary(runtime: phronomy.Runtime) -> None:
    # scenario 7 at the API, scenario 47 (no legacy thread_id keyword)
    flow = approval_flow()
    with pytest.raises(
        phronomy.InvalidInputError, match=r"Unknown Value field\(s\): \['valu'\]"
    ):
        runtime.workflows.start(flow, {"valu": "x"})
    with pytest.raises(phronomy.InvalidInputError, match=r"Value\.count"):
        runtime.workflows.start(flow, {"count": "many"})
    with pytest.raises(phronomy.InvalidInputError, match="mapping"):
        runtime.workflows.start(flow, ["not", "a", "mapping"])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        runtime.workflows.start(flow, thread_id="x")  # type: ignore[call-arg]
    for bad_id in ("", "x" * 256, "tab\there", 42):
        with pytest.raises(phronomy.InvalidInputError):
            runtime.workflows.start(flow, workflow_instance_id=bad_id)  # type: ignore[arg-type]
    assert (
        await runtime.workflows.invoke(flow, Value(value="typed"))
    ).state.value == "typed:prepared"

    class Other(phronomy.State):
        x: int = 0

    with pytest.raises(phronomy.InvalidInputError, match="runs Value"):
        runtime.workflows.start(flow, Other())  # type: ignore[misc]  # on purpose


async def test_a_rejected_resume_of_an_ephemeral_halt_fails_at_once() -> None:
    flow = guarded_flow()
    with trio.fail_after(10):
        async with phronomy.open_runtime(shutdown_timeout=2) as rt:
            halted = await rt.workflows.invoke(flow)
            with pytest.raises(phronomy.EventRejectedError) as caught:
                await rt.workflows.send_event(
                    flow, "approve", halted=halted, payload="no"
                )
            assert (caught.value.phase, caught.value.revision) == ("awaiting", None)
            done = await rt.workflows.send_event(
                flow, "approve", halted=halted, payload="ok"
            )
            assert done.phase == FINISH
        assert rt.shutdown_result is not None
        assert rt.shutdown_result.clean


class _Hooked(Value):
    def handle_event(self, event: Any) -> Any:
        if event.type == "hook":
            raise KeyError("hook failed")
        return False


@pytest.mark.parametrize(
    ("where", "note"),
    [
        (
            "entry",
            "raised by the entry action of 'draft' of workflow 'noted' (event 'start')",
        ),
        ("guard", "raised by the guard of draft --go--> done of workflow 'noted'"),
        (
            "action",
            "raised by the transition action draft --go--> done of workflow 'noted'",
        ),
        ("hook", "raised by _Hooked.handle_event in state 'draft' of workflow 'noted'"),
        ("observer", "raised by the on_step observer at state 'draft'"),
    ],
)
async def test_errors_from_user_code_say_where_they_were_raised(
    runtime: phronomy.Runtime, where: str, note: str
) -> None:
    def fail(*args: Any) -> Any:
        raise RuntimeError(f"{where} failed")

    wf = phronomy.Workflow(_Hooked, name="noted")
    wf.state("draft", entry=fail if where == "entry" else None)
    wf.state("done")
    wf.transition(
        "draft",
        "done",
        on="go",
        guard=fail if where == "guard" else None,
        action=fail if where == "action" else None,
    )
    wf.transition("draft", "done", on="hook")
    wf.transition("done", FINISH)
    flow = wf.build()
    observer = fail if where == "observer" else None
    handle = runtime.workflows.start(flow, workflow_instance_id="n-1", on_step=observer)
    if where in ("guard", "action", "hook"):
        await until(
            lambda: runtime.workflows.signal(
                flow, "n-1", "hook" if where == "hook" else "go"
            )
        )
    with pytest.raises((RuntimeError, KeyError)) as caught:
        await handle.result()
    notes = getattr(caught.value, "__notes__", [])
    assert any(note in n for n in notes), notes
    assert "phronomy: workflow 'noted' instance 'n-1' failed at state 'draft'" in notes
