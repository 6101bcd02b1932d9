"""Execution plans: a supervised execution's steps as a generated linear workflow.

For steps ``s0 .. s(n-1)`` the plan is this workflow (``checkpoints``: with a store)::

    step_i --step_done--> after_i (wait) --continue | after 1 s--> step_(i+1)
    step_i --step_done [an ApprovalRequest]--> approval_i (wait)
    approval_i --approve--> step_(i+1) (FINISH after the last step)
    approval_i --reject--> FINISH
    after_i | approval_i --deadline--> FINISH
    step_(n-1) --step_done--> FINISH

Each ``step_i`` runs its step as an effect when it is entered; ``after_i`` is a
checkpoint wait state (``wait_state(..., checkpoint="continue")``): its save makes the
step's result durable while the segment keeps its lease, and once it is acknowledged
the segment fires ``continue`` itself. A segment that halts there instead (it applied
inbox entries since its last save) is continued by the runtime that started the
execution at once, and by the 1 s timeout in whichever runtime serves the plan when
that one is gone (also after a crash: the sweep puts the row back there). Without checkpoints ``step_i`` goes to
``step_(i+1)`` directly. So an execution gets the workflow machinery whole: one live
segment per key (its ``agent:<id>`` instance), leases and fencing, the terminal
barrier, quiescent cancellation, the inbox (approvals from any process), durable
timers (deadlines, retries) and the recovery sweep.
"""

from __future__ import annotations

import functools
import hashlib
import random
from collections.abc import Callable, Sequence
from typing import Any, Literal, final

import msgspec

from phronomy.errors import DefinitionError, InvalidInputError
from phronomy.storage import EXECUTION_PLAN_PREFIX
from phronomy.workflow import FINISH, State, Workflow, WorkflowDefinition
from phronomy.workflow._retries import RetryPolicy, effect_ref

from ._messages import Approval, ApprovalRequest
from ._steps import (
    StepOutput,
    arity,
    is_async,
    run_async_step,
    run_local_async,
    run_local_sync,
    run_sync_step,
)

__all__ = [
    "CONTINUE_AFTER",
    "ExecutionState",
    "Plan",
    "PlanCache",
    "Step",
    "execution_plan",
    "plan_of",
    "step_at",
]

Step = Callable[..., Any]
"""A step: ``(value)`` or ``(value, ctx)``; ``def`` runs in a worker thread, ``async def``
runs as a supervised trio task."""

Plan = WorkflowDefinition["ExecutionState"]
"""An execution plan: the generated workflow of a list of steps."""

CONTINUE_AFTER = 1.0
"""Seconds after a checkpoint's save when any runtime serving the plan continues an
instance halted there (a live segment continues at once)."""

_LOCAL = "local-"


@final
class ExecutionState(State):
    """The state of an execution's generated workflow (what its saves hold).

    Attributes:
        execution_id: the execution.
        agent_id: its key.
        value: the input of the next step (the last result; JSON with a store).
        approved: *value* is an :class:`~phronomy.Approval` (kept as JSON).
        steps_completed: steps whose result the execution has.
        step_id: the id of the step run in flight.
        approval_request: what a suspended execution waits on.
        outcome: ``completed``, ``rejected`` or ``deadline`` once it finished.
        rejection: what the rejecter sent.
        timeout: seconds from the start to its deadline, if it has one.
    """

    execution_id: str = ""
    agent_id: str = ""
    value: Any = None
    approved: bool = False
    steps_completed: int = 0
    step_id: str = ""
    approval_request: ApprovalRequest | None = None
    outcome: Literal["", "completed", "rejected", "deadline"] = ""
    rejection: Any = None
    timeout: float | None = None

    def handle_event(self, event: Any) -> bool:
        """A deadline that falls while a step runs is handled by cancelling the
        step (see ``runtime.executions``): where no transition takes it, it is
        dropped quietly."""
        return bool(event.type == "deadline")


def _importable(step: Step) -> str | None:
    try:
        return effect_ref(step)
    except InvalidInputError:
        return None


def plan_name(steps: Sequence[Step], refs: Sequence[str | None]) -> str:
    """A plan's default name: its steps' ``module:qualname`` (hashed when long), or
    for steps another process cannot import, a name only this process uses."""
    if all(refs):
        joined = ",".join(r for r in refs if r)
        if len(joined) <= 120:
            return joined
        return f"{refs[0]}+{len(refs) - 1}-{hashlib.sha256(joined.encode()).hexdigest()[:16]}"
    return f"{_LOCAL}{random.getrandbits(64):016x}"


def execution_plan(
    steps: Sequence[Step],
    *,
    name: str | None = None,
    retry: RetryPolicy | None = None,
    checkpoints: bool = True,
) -> Plan:
    """Compile *steps* into an execution plan (a generated workflow).

    A plan whose steps are module-level functions is the same plan in every process
    that builds it: give it to ``open_runtime(workflows=[...])`` so that the runtime
    resumes its executions (approved elsewhere, or left by a process that died).
    Steps another process cannot import (lambdas, closures) make a plan only this
    process can run.

    Example::

        plan = phronomy.agent.execution_plan([search, ask, send], name="mailer")
        async with phronomy.open_runtime("app.db", workflows=[plan]) as runtime:
            await runtime.executions.invoke("assistant-1", plan, "trio")

    Args:
        steps: callables taking ``(value)`` or ``(value, ctx)``.
        name: the plan's name (default: from its steps' names); stored with each of
            its executions.
        retry: how each step is retried when it fails (default: the runtime's
            ``open_runtime(retry=...)``, else once). With a store, a module-level
            step waits between attempts halted, and its next attempt may run in
            another process.
        checkpoints: save each step's result (the default; a runtime without a store
            runs the plans it makes without them).

    Returns:
        The plan.

    Raises:
        DefinitionError: no steps, a step of the wrong shape, or an invalid name.
    """
    step_list = list(steps)
    if not step_list:
        raise DefinitionError("an execution needs at least one step")
    takes = [arity(step, i) for i, step in enumerate(step_list)]
    refs = [_importable(step) for step in step_list]
    given: object = name  # checked at run time: callers are not typed
    if given is not None and (not isinstance(given, str) or not given):
        raise DefinitionError(f"a plan's name must be a non-empty string, got {name!r}")
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise DefinitionError(f"retry must be a RetryPolicy, got {retry!r}")
    wf = Workflow(ExecutionState, name="execution-plan")
    count = len(step_list)
    for index, step in enumerate(step_list):
        wf.state(
            f"step_{index}",
            entry=_launcher(step, refs[index], takes[index], index, retry, checkpoints),
        )
    for index in range(count):
        last = index == count - 1
        after = (
            FINISH
            if last
            else (f"after_{index}" if checkpoints else f"step_{index + 1}")
        )
        wf.wait_state(f"approval_{index}")
        wf.transition(
            f"step_{index}",
            f"approval_{index}",
            on="step_done",
            guard=_suspends,
            action=_suspend,
        )
        wf.transition(
            f"step_{index}",
            after,
            on="step_done",
            guard=_current,
            action=_took(last, checkpoints),
        )
        nxt = FINISH if last else f"step_{index + 1}"
        wf.transition(
            f"approval_{index}",
            nxt,
            on="approve",
            guard=_this_one,
            action=_approve(last),
        )
        wf.transition(
            f"approval_{index}", FINISH, on="reject", guard=_this_one, action=_reject
        )
        wf.transition(f"approval_{index}", FINISH, on="deadline", action=_deadline)
        if checkpoints and not last:
            wf.wait_state(after, checkpoint="continue")
            wf.transition(after, nxt, on="continue")
            wf.transition(after, nxt, after=CONTINUE_AFTER)
            wf.transition(after, FINISH, on="deadline", action=_deadline)
    definition = wf.build()
    plan = name if name is not None else plan_name(step_list, refs)
    return msgspec.structs.replace(definition, name=EXECUTION_PLAN_PREFIX + plan)


@final
class PlanCache:
    """The plans of the step lists a runtime was given: one per list of step objects
    (a list of lambdas made anew per call makes a plan per call; the oldest of 1,024
    are forgotten)."""

    def __init__(self) -> None:
        """An empty cache."""
        self._plans: dict[tuple[int, ...], tuple[tuple[Step, ...], Plan]] = {}

    def plan(self, steps: Sequence[Step], *, checkpoints: bool) -> Plan:
        """The plan of *steps*.

        Raises:
            DefinitionError: see :func:`execution_plan`.
        """
        items = tuple(steps)
        ids = tuple(map(id, items))
        cached = self._plans.get(ids)
        if cached is not None:
            return cached[1]
        plan = execution_plan(items, checkpoints=checkpoints)
        if len(self._plans) >= 1024:
            self._plans.pop(next(iter(self._plans)))
        self._plans[ids] = (items, plan)  # the items keep their ids unique
        return plan


def plan_of(definition: object) -> Plan:
    """*definition* if it is an execution plan.

    Raises:
        InvalidInputError: it is something else.
    """
    if isinstance(definition, WorkflowDefinition) and (
        definition.state_type is ExecutionState
        and definition.name.startswith(EXECUTION_PLAN_PREFIX)
    ):
        return definition
    raise InvalidInputError(
        f"expected a list of steps or an execution plan (phronomy.agent.execution_plan), "
        f"got {definition!r}"
    )


def is_local(plan: Plan) -> bool:
    """Whether only this process can run *plan* (its steps cannot be imported)."""
    return plan.name.startswith(EXECUTION_PLAN_PREFIX + _LOCAL)


def step_count(plan: Plan) -> int:
    """How many steps *plan* has."""
    return sum(1 for s in plan.states if s.startswith("step_"))


@functools.lru_cache(maxsize=1024)  # a plan's few phases, looked up per step
def step_at(phase: str | None) -> int:
    """The step a phase is at (``after_i``: the next one)."""
    if not phase or "_" not in phase:
        return 0
    kind, _, number = phase.rpartition("_")
    try:
        index = int(number)
    except ValueError:
        return 0
    return index + 1 if kind == "after" else index


# --- the generated workflow's callbacks ------------------------------------------------


def _launcher(
    step: Step,
    ref: str | None,
    takes: int,
    index: int,
    retry: RetryPolicy | None,
    checkpoints: bool,
) -> Callable[..., ExecutionState]:
    asynchronous = is_async(step)

    def launch(state: ExecutionState, event: Any, effects: Any) -> ExecutionState:
        # the module's generator: reseeded after fork, and no system call (os.urandom
        # releases the GIL on the dispatcher)
        step_id = f"{state.execution_id}:{index}:{random.getrandbits(48):012x}"
        ident = [state.execution_id, state.agent_id, index]
        if index == 0 and state.steps_completed == 0 and state.timeout is not None:
            effects.schedule(state.timeout, "deadline", key="deadline")
        if ref is not None:  # by name, with JSON: a retry may run it elsewhere
            # saved (checkpoints): as JSON, so that a retry may run in another process
            value = _as_json(state.value) if checkpoints else state.value
            args: tuple[Any, ...] = (ref, step_id, takes, value, state.approved, ident)
            if asynchronous:
                effects.start_soon(
                    run_async_step, *args, on_done="step_done", retry=retry
                )
            else:
                effects.offload(run_sync_step, *args, on_done="step_done", retry=retry)
        else:
            value = _input(state)
            args = (step, retry, step_id, takes, value, ident)
            if asynchronous:
                effects.start_soon(run_local_async, *args, on_done="step_done")
            else:
                effects.offload(run_local_sync, *args, on_done="step_done")
        return _set(state, step_id=step_id)

    return launch


_set = msgspec.structs.replace
"""*state* with *fields* replaced (the plan's own values: no reducer, no check; the
function itself, not a wrapper: packing the fields again costs more than the copy)."""


def _input(state: ExecutionState) -> Any:
    if state.approved and not isinstance(state.value, Approval):
        return msgspec.convert(state.value, Approval)
    return state.value


def _current(state: ExecutionState, event: Any) -> bool:
    output = event.payload
    return isinstance(output, StepOutput) and output.step_id == state.step_id


def _suspends(state: ExecutionState, event: Any) -> bool:
    # the frequent answer first (a step's plain result), without a call
    value = getattr(event.payload, "value", None)
    return isinstance(value, ApprovalRequest) and _current(state, event)


def _suspend(state: ExecutionState, event: Any) -> ExecutionState:
    return _set(state, approval_request=event.payload.value, step_id="")


def _took(last: bool, checkpoints: bool) -> Callable[..., ExecutionState]:
    def took(state: ExecutionState, event: Any) -> ExecutionState:
        value = event.payload.value
        if checkpoints:  # saved: the next step receives what the save holds
            value = _as_json(value)
        return _set(
            state,
            value=value,
            approved=False,
            steps_completed=state.steps_completed + 1,
            step_id="",
            outcome="completed" if last else "",
        )

    return took


def _as_json(value: Any) -> Any:
    """*value* as JSON values (a tuple becomes a list, a Struct a dict); what has no
    JSON form is kept, and the save that stores it says why it cannot."""
    try:
        return msgspec.json.decode(msgspec.json.encode(value))
    except (TypeError, msgspec.EncodeError):
        return value


def _this_one(state: ExecutionState, event: Any) -> bool:
    payload = event.payload
    return (
        isinstance(payload, dict) and payload.get("execution_id") == state.execution_id
    )


def _approve(last: bool) -> Callable[..., ExecutionState]:
    def approve(state: ExecutionState, event: Any) -> ExecutionState:
        assert state.approval_request is not None
        approval = Approval(
            request=state.approval_request, response=event.payload.get("response")
        )
        return _set(
            state,
            value=approval,
            approved=True,
            approval_request=None,
            steps_completed=state.steps_completed + 1,
            outcome="completed" if last else "",
        )

    return approve


def _reject(state: ExecutionState, event: Any) -> ExecutionState:
    return _set(
        state,
        outcome="rejected",
        rejection=event.payload.get("response"),
        value=None,
        approval_request=None,
    )


def _deadline(state: ExecutionState, event: Any) -> ExecutionState:
    return _set(state, outcome="deadline", approval_request=None)
