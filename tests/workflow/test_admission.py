"""Identity, admission and live signals of workflow instances."""

from __future__ import annotations

import pytest

import phronomy
from phronomy.workflow import WorkflowCoordinator

from .helpers import Value, admission_state, live_flow, segment_id, until


async def test_each_segment_has_its_own_session(runtime: phronomy.Runtime) -> None:
    # scenarios 48, 49: the session id is fresh per segment, never the instance id
    flow = live_flow()
    first = runtime.workflows.start(flow, workflow_instance_id="workflow-42")
    await until(lambda: admission_state(runtime, "workflow-42") == "executing")
    session = segment_id(runtime, "workflow-42")
    assert isinstance(session, str)
    assert session != "workflow-42"
    assert runtime.workflows.signal(flow, "workflow-42", "finish")
    await first.result()
    assert runtime.workflows.segment("workflow-42") is None
    assert not runtime.workflows.signal(flow, "workflow-42", "finish")
    second = runtime.workflows.start(flow, workflow_instance_id="workflow-42")
    await until(lambda: admission_state(runtime, "workflow-42") == "executing")
    assert segment_id(runtime, "workflow-42") not in (None, session)
    assert runtime.workflows.signal(flow, "workflow-42", "finish")
    await second.result()


async def test_signal_validation(runtime: phronomy.Runtime) -> None:
    # scenarios 50, 51, 52
    flow = live_flow()
    with pytest.raises(phronomy.InvalidInputError, match="workflow_instance_id"):
        runtime.workflows.signal(flow, "", "finish")
    with pytest.raises(phronomy.InvalidInputError, match="workflow_instance_id"):
        runtime.workflows.signal(flow, None, "finish")  # type: ignore[arg-type]
    with pytest.raises(phronomy.InvalidInputError, match="Unknown event 'nope'"):
        runtime.workflows.signal(flow, "absent", "nope")
    assert runtime.workflows.segment("absent") is None
    assert not runtime.workflows.signal(flow, "absent", "finish")
    assert runtime.statistics().pending_deliveries == 0


async def test_signal_for_another_workflow_is_refused(
    runtime: phronomy.Runtime,
) -> None:
    live = live_flow()
    wf = phronomy.Workflow(Value, name="other")
    wf.state("waiting").transition("waiting", phronomy.FINISH, on="finish")
    other = wf.build()
    handle = runtime.workflows.start(live, workflow_instance_id="mine")
    await until(lambda: runtime.workflows.signal(live, "mine", "mark"))
    assert not runtime.workflows.signal(other, "mine", "finish")
    assert runtime.workflows.signal(live, "mine", "finish")
    await handle.result()


async def test_competing_start_is_refused_while_live(runtime: phronomy.Runtime) -> None:
    # a second start for a live instance fails with "live execution segment"
    flow = live_flow()
    first = runtime.workflows.start(flow, workflow_instance_id="busy")
    await until(lambda: admission_state(runtime, "busy") == "executing")
    with pytest.raises(
        phronomy.BusyError, match="already has a live execution segment"
    ):
        await runtime.workflows.invoke(flow, workflow_instance_id="busy")
    runtime.workflows.signal(flow, "busy", "finish")
    await first.result()


async def test_workflow_commands_off_the_dispatcher_are_refused(
    runtime: phronomy.Runtime,
) -> None:
    # scenario 60
    coordinator = runtime.engine.receiver(WorkflowCoordinator, _exists)
    command = object()
    with pytest.raises(
        phronomy.ReentrancyError, match="only be mutated on the runtime's dispatcher"
    ):
        coordinator.deliver(command)
    assert coordinator.idle()


async def test_admissions_close_at_shutdown() -> None:
    async with phronomy.open_runtime() as rt:
        pass
    # Before: "the runtime is shutting down" although it had shut down long ago
    with pytest.raises(
        phronomy.RuntimeShutdownError,
        match=r"the runtime has shut down \(its `async with open_runtime\(\.\.\.\)` "
        r"block has ended, terminated\); it refused the workflow start",
    ):
        await rt.workflows.start(live_flow()).result()
    with pytest.raises(phronomy.RuntimeShutdownError, match="block has ended"):
        await rt.executions.start("agent", [lambda task: task], "task").result()
    with pytest.raises(phronomy.RuntimeShutdownError, match="block has ended"):
        await rt.recovery.resolve("x", action="adopt")
    assert not rt.workflows.signal(live_flow(), "x", "finish")


async def test_workflow_ids_may_not_use_the_executions_prefix(
    runtime: phronomy.Runtime,
) -> None:
    flow = live_flow()
    for call in (
        lambda: runtime.workflows.start(flow, workflow_instance_id="agent:x"),
        lambda: runtime.workflows.signal(flow, "agent:x", "finish"),
    ):
        with pytest.raises(
            phronomy.InvalidInputError, match=r"starts with 'agent:'.*reserved"
        ):
            call()
    with pytest.raises(phronomy.InvalidInputError, match="reserved"):
        await runtime.workflows.cancel(flow, "agent:x")


def _exists(engine: object) -> WorkflowCoordinator:
    """A receiver factory for one that exists already (never called)."""
    pytest.fail("it exists already")
