"""Identity, admission and live signals (spec §2.11, scenarios 48-52, 57-60)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

import phronomy
from phronomy.engine import ResultHandle
from phronomy.workflow._registry import WorkflowRegistry

from .helpers import Value, live_flow, on_dispatcher, until


async def test_owner_token_and_session_identity(runtime: phronomy.Runtime) -> None:
    # scenario 48
    registry = runtime._runner.registry
    flow = live_flow()
    first = runtime.start(flow, workflow_instance_id="workflow-42")
    await until(lambda: registry.state("workflow-42") == "executing")
    owner = registry.owner("workflow-42")
    session_id = registry.record("workflow-42").session_id  # type: ignore[union-attr]
    assert owner is not None
    assert not isinstance(owner, str)
    assert isinstance(session_id, str)
    assert session_id != "workflow-42"
    assert runtime.signal(flow, "workflow-42", "finish")
    await first.result()
    assert registry.owner("workflow-42") is None
    # scenario 49
    assert not runtime.signal(flow, "workflow-42", "finish")
    second = runtime.start(flow, workflow_instance_id="workflow-42")
    await until(lambda: registry.state("workflow-42") == "executing")
    assert registry.owner("workflow-42") is not owner
    assert registry.record("workflow-42").session_id != session_id  # type: ignore[union-attr]
    assert runtime.signal(flow, "workflow-42", "finish")
    await second.result()


async def test_signal_validation(runtime: phronomy.Runtime) -> None:
    # scenarios 50, 51, 52
    flow = live_flow()
    with pytest.raises(phronomy.InvalidInputError, match="workflow_instance_id"):
        runtime.signal(flow, "", "finish")
    with pytest.raises(phronomy.InvalidInputError, match="workflow_instance_id"):
        runtime.signal(flow, None, "finish")  # type: ignore[arg-type]
    with pytest.raises(phronomy.InvalidInputError, match="Unknown event 'nope'"):
        runtime.signal(flow, "absent", "nope")
    assert runtime._runner.registry.state("absent") is None
    assert not runtime.signal(flow, "absent", "finish")
    assert runtime.statistics().pending_deliveries == 0


async def test_signal_for_another_workflow_is_refused(
    runtime: phronomy.Runtime,
) -> None:
    live = live_flow()
    wf = phronomy.Workflow(Value, name="other")
    wf.state("waiting").transition("waiting", phronomy.FINISH, on="finish")
    other = wf.build()
    handle = runtime.start(live, workflow_instance_id="mine")
    await until(lambda: runtime.signal(live, "mine", "mark"))
    assert not runtime.signal(other, "mine", "finish")
    assert runtime.signal(live, "mine", "finish")
    await handle.result()


async def test_competing_start_is_refused_while_live(runtime: phronomy.Runtime) -> None:
    # a second start for a live instance fails with "live execution segment"
    flow = live_flow()
    first = runtime.start(flow, workflow_instance_id="busy")
    await until(lambda: runtime._runner.registry.state("busy") == "executing")
    with pytest.raises(
        phronomy.BusyError, match="already has a live execution segment"
    ):
        await runtime.invoke(flow, workflow_instance_id="busy")
    runtime.signal(flow, "busy", "finish")
    await first.result()


async def test_release_and_bind_require_the_owner_token(
    runtime: phronomy.Runtime,
) -> None:
    # scenarios 58, 59
    registry = runtime._runner.registry
    t1, t2 = object(), object()
    caller: ResultHandle[Any] = ResultHandle()
    await on_dispatcher(runtime, lambda: registry.admit_workflow("x", t1, "wf"))
    assert not await on_dispatcher(runtime, lambda: registry.release_workflow("x", t2))
    assert registry.owner("x") is t1
    with pytest.raises(
        phronomy.PhronomyInternalError, match="stale Workflow admission bind"
    ):
        await on_dispatcher(
            runtime, lambda: registry.bind_workflow_session("x", t2, "s1", caller)
        )
    await on_dispatcher(
        runtime, lambda: registry.bind_workflow_session("x", t1, "s1", caller)
    )
    with pytest.raises(
        phronomy.PhronomyInternalError, match="stale Workflow admission bind"
    ):
        await on_dispatcher(
            runtime, lambda: registry.bind_workflow_session("x", t1, "s2", caller)
        )
    with pytest.raises(
        phronomy.PhronomyInternalError, match="stale Workflow admission update"
    ):
        await on_dispatcher(
            runtime,
            lambda: registry.mark_workflow_admission("x", t2, "persisting_terminal"),
        )
    with pytest.raises(ValueError, match="unsupported Workflow admission state"):
        await on_dispatcher(
            runtime, lambda: registry.mark_workflow_admission("x", t1, "admitting")
        )
    with pytest.raises(phronomy.PhronomyInternalError, match="no Runtime admission"):
        await on_dispatcher(
            runtime, lambda: registry.mark_workflow_admission("y", t1, "executing")
        )
    with pytest.raises(phronomy.BusyError, match="live execution segment"):
        await on_dispatcher(runtime, lambda: registry.admit_workflow("x", t2, "wf"))
    assert await on_dispatcher(runtime, lambda: registry.release_workflow("x", t1))
    assert registry.owner("x") is None


async def test_mutations_off_the_dispatcher_are_refused(
    runtime: phronomy.Runtime,
) -> None:
    # scenario 60
    registry = runtime._runner.registry
    with pytest.raises(
        phronomy.ReentrancyError,
        match="only be mutated on the runtime's dispatcher",
    ):
        registry.admit_workflow("x", object(), "wf")
    assert registry.idle()


async def test_admissions_close_at_shutdown() -> None:
    async with phronomy.open_runtime() as rt:
        pass
    with pytest.raises(
        phronomy.RuntimeShutdownError,
        match="rejected Workflow start while shutting down",
    ):
        await rt.start(live_flow()).result()
    assert not rt.signal(live_flow(), "x", "finish")


# --- a stateful model of the registry ---------------------------------------------------


class _Engine:
    """Just enough engine for the registry: the dispatcher checks always pass."""

    def assert_dispatcher(self) -> None:
        pass

    def admit(self, receiver: object) -> None:
        pass


class RegistryModel(RuleBasedStateMachine):
    """admit / bind / mark / release / retire with fresh and stale tokens."""

    ids = st.sampled_from(["a", "b", "c"])
    tokens = Bundle("tokens")
    sessions = Bundle("sessions")

    def __init__(self) -> None:
        super().__init__()
        self.registry = WorkflowRegistry(_Engine(), lambda message: None)  # type: ignore[arg-type]
        self.model: dict[str, dict[str, Any]] = {}
        self.counter = 0

    @rule(target=tokens)
    def new_token(self) -> object:
        return object()

    @rule(iid=ids, token=tokens)
    def admit(self, iid: str, token: object) -> None:
        if iid in self.model:
            with pytest.raises(phronomy.BusyError):
                self.registry.admit_workflow(iid, token, "wf")
            return
        self.registry.admit_workflow(iid, token, "wf")
        self.model[iid] = {"owner": token, "session": None, "state": "admitting"}

    @rule(target=sessions, iid=ids, token=tokens)
    def bind(self, iid: str, token: object) -> str:
        self.counter += 1
        session = f"s{self.counter}"
        record = self.model.get(iid)
        if (
            record is None
            or record["owner"] is not token
            or record["session"] is not None
        ):
            with pytest.raises(phronomy.PhronomyInternalError):
                self.registry.bind_workflow_session(iid, token, session, ResultHandle())
            return session
        self.registry.bind_workflow_session(iid, token, session, ResultHandle())
        record.update(session=session, state="executing")
        return session

    @rule(
        iid=ids,
        token=tokens,
        state=st.sampled_from(["executing", "persisting_terminal"]),
    )
    def mark(self, iid: str, token: object, state: str) -> None:
        record = self.model.get(iid)
        if record is None or record["owner"] is not token:
            with pytest.raises(phronomy.PhronomyInternalError):
                self.registry.mark_workflow_admission(iid, token, state)  # type: ignore[arg-type]
            return
        self.registry.mark_workflow_admission(iid, token, state)  # type: ignore[arg-type]
        record["state"] = state

    @rule(iid=ids, token=tokens)
    def release(self, iid: str, token: object) -> None:
        record = self.model.get(iid)
        expected = record is not None and record["owner"] is token
        assert self.registry.release_workflow(iid, token) == expected
        if expected:
            del self.model[iid]

    @rule(session=consumes(sessions))
    def retire(self, session: str) -> None:
        self.registry.session_retired(session, waiter=None, error=None)
        for record in self.model.values():
            if record["session"] == session:
                record.update(session=None, state="recovery_required")

    @invariant()
    def matches(self) -> None:
        for iid in ("a", "b", "c"):
            record = self.model.get(iid)
            actual = self.registry.record(iid)
            if record is None:
                assert actual is None
                continue
            assert actual is not None
            assert actual.owner is record["owner"]
            assert actual.session_id == record["session"]
            assert actual.state == record["state"]
        busy = any(r["state"] != "recovery_required" for r in self.model.values())
        assert self.registry.idle() == (not busy)


TestRegistryModel = RegistryModel.TestCase
TestRegistryModel.settings = settings(
    max_examples=200, stateful_step_count=30, deadline=None
)
