"""Workflows and helpers shared by the workflow tests."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import phronomy
from phronomy.engine import ResultHandle
from polling import until as until

if TYPE_CHECKING:
    from collections.abc import Callable
    from contextlib import AbstractAsyncContextManager

    from phronomy.workflow import IfExists

T = TypeVar("T")


class Value(phronomy.State):
    value: str = ""
    steps: Annotated[list[str], phronomy.APPEND] = []  # noqa: RUF012
    count: int = 0


def approval_flow() -> phronomy.WorkflowDefinition[Value]:
    """prepare -> awaiting (wait) -approve-> confirm -> FINISH (scenario 16)."""
    wf = phronomy.Workflow(Value, name="approval")
    wf.state(
        "prepare",
        entry=lambda s: s.merge(value=f"{s.value}:prepared", steps=["prepare"]),
    )
    wf.wait_state("awaiting")
    wf.state(
        "confirm",
        entry=lambda s: s.merge(value=f"{s.value}:confirmed", steps=["confirm"]),
    )
    wf.transition("prepare", "awaiting")
    wf.transition("awaiting", "confirm", on="approve")
    wf.transition("confirm", phronomy.FINISH)
    return wf.build()


def live_flow() -> phronomy.WorkflowDefinition[Value]:
    """A state with external events (not a wait state): the segment stays live."""
    wf = phronomy.Workflow(Value, name="live")
    wf.state("waiting")
    wf.transition(
        "waiting", "waiting", on="mark", action=lambda s: s.merge(count=s.count + 1)
    )
    wf.transition(
        "waiting",
        "waiting",
        on="ignored",
        guard=lambda s: False,
        action=lambda s: s.merge(count=s.count + 100),
    )
    wf.transition("waiting", phronomy.FINISH, on="finish")
    return wf.build()


def counter_flow(name: str = "counter") -> phronomy.WorkflowDefinition[Value]:
    """One increment, then FINISH (durable scenario 64)."""
    wf = phronomy.Workflow(Value, name=name)
    wf.state("increment", entry=lambda s: s.merge(count=s.count + 1))
    wf.transition("increment", phronomy.FINISH)
    return wf.build()


def halting_flow(name: str = "halting") -> phronomy.WorkflowDefinition[Value]:
    """Starts in a wait state; 'approve' finishes with a marker."""
    wf = phronomy.Workflow(Value, name=name)
    wf.wait_state("awaiting")
    wf.initial("awaiting")
    wf.transition(
        "awaiting",
        phronomy.FINISH,
        on="approve",
        action=lambda s: s.merge(steps=["approved"]),
    )
    return wf.build()


async def on_dispatcher(runtime: phronomy.Runtime, fn: Callable[[], T]) -> T:
    """Run *fn* on the dispatcher task (through a timer) and return its result."""
    done: ResultHandle[T] = ResultHandle("on-dispatcher")

    def run() -> None:
        try:
            done.complete(fn())
        except BaseException as exc:
            done.fail(exc)

    runtime.engine.timers.schedule(0, run)
    return await done.result()


def admission_state(runtime: phronomy.Runtime, iid: str) -> Any:
    """The status of the instance's live segment in *runtime*, or ``None``."""
    segment = runtime.workflows.segment(iid)
    return None if segment is None else segment.status


def segment_id(runtime: phronomy.Runtime, iid: str) -> str | None:
    """The id of the instance's live session, or ``None``."""
    segment = runtime.workflows.segment(iid)
    return None if segment is None else segment.segment_id


async def start_live(
    runtime: phronomy.Runtime,
    flow: phronomy.WorkflowDefinition[Value],
    iid: str,
    *,
    if_exists: IfExists = "refuse",
) -> ResultHandle[phronomy.WorkflowResult[Value]]:
    """Start *flow* (a :func:`live_flow`) as *iid*; return once its segment executes
    and applied one ``mark``."""
    handle = runtime.workflows.start(
        flow, workflow_instance_id=iid, if_exists=if_exists
    )

    def executing() -> bool:
        segment = runtime.workflows.segment(iid)
        return segment is not None and segment.status == "executing"

    await until(executing)
    outcome = await runtime.workflows.deliver(flow, iid, "mark")
    assert outcome.status == "transitioned", outcome
    return handle


def guarded_flow(name: str = "guarded") -> phronomy.WorkflowDefinition[Value]:
    """The README's order flow: 'approve' passes its guard unless the payload is "no"."""
    wf = phronomy.Workflow(Value, name=name)
    wf.state("draft", entry=lambda s: s.merge(steps=["drafted"]))
    wf.wait_state("awaiting")
    wf.state("ship", entry=lambda s: s.merge(steps=["shipped"]))
    wf.transition("draft", "awaiting")
    wf.transition(
        "awaiting", "ship", on="approve", guard=lambda s, e: e.payload != "no"
    )
    wf.transition("ship", phronomy.FINISH)
    return wf.build()


def runtime_on(
    store: phronomy.storage.BaseStore[Any], **kw: Any
) -> AbstractAsyncContextManager[phronomy.Runtime]:
    return phronomy.open_runtime(
        store=store, shutdown_timeout=kw.pop("shutdown_timeout", 2.0), **kw
    )
