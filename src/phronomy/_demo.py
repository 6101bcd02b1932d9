"""The main job of the quick start: a durable order approval on the embedded SQLite default.

Run it with ``python -m phronomy demo``; run it again and the new process finishes the
order the previous one left halted.
"""

from __future__ import annotations

from typing import Annotated, Any

import phronomy
from phronomy.storage import ListOp, SQLiteStore, run_op

__all__ = ["Order", "demo_workflow", "run_demo"]


class Order(phronomy.State):
    """An order that needs a person's approval before it ships."""

    item: str = ""
    approved_by: str = ""
    log: Annotated[list[str], phronomy.APPEND] = []  # noqa: RUF012 - msgspec copies it


def _draft(order: Order) -> Order:
    return order.merge(log=[f"drafted {order.item}"])


def _ship(order: Order, event: Any) -> Order:
    return order.merge(
        approved_by=event.payload or "someone", log=["approved", "shipped"]
    )


def demo_workflow() -> phronomy.WorkflowDefinition[Order]:
    """draft → awaiting_approval (wait state) → ship → FINISH."""
    wf = phronomy.Workflow(Order, name="orders")
    wf.state("draft", entry=_draft)
    wf.wait_state("awaiting_approval")
    wf.state("ship")
    wf.transition("draft", "awaiting_approval")
    wf.transition("awaiting_approval", "ship", on="approve", action=_ship)
    wf.transition("ship", phronomy.FINISH)
    return wf.build()


async def run_demo(db: str) -> None:
    """One demo run on *db*.

    1. Approve (by id) every order an earlier process left halted.
    2. Start an order: it halts at ``awaiting_approval`` and is saved.
    3. Close that runtime, open a new one, and approve the order by id alone.
    4. Start one more order and leave it halted for the next run.

    Cancellation:
        Cancelling it stops the demo's runtime at once.
    """
    flow = demo_workflow()
    async with phronomy.open_runtime(store=SQLiteStore(db)) as runtime:
        store = runtime.store
        assert store is not None
        page = await runtime.pool("cli").run(run_op, store, ListOp(limit=1000))
        leftovers = [
            r.workflow_instance_id for r in page.records if r.status == "halted"
        ]
        print(
            f"{db}: {len(page.records)} order(s) from earlier runs, {len(leftovers)} waiting for approval"
        )
        for iid in leftovers:
            done = await runtime.workflows.send_event(
                flow, event="approve", workflow_instance_id=iid, payload="next run"
            )
            print(
                f"  approved {iid} (halted by an earlier process): {done.phase}, revision {done.revision}"
            )
        first = f"order-{len(page.records) + 1}"
        halted = await runtime.workflows.invoke(
            flow, {"item": "desk lamp"}, workflow_instance_id=first
        )
        print(
            f"  started {first}: halted at {halted.phase!r}, revision {halted.revision}"
        )
    async with phronomy.open_runtime(
        store=SQLiteStore(db)
    ) as runtime:  # a fresh runtime
        done = await runtime.workflows.send_event(
            flow, event="approve", workflow_instance_id=first, payload="demo user"
        )
        print(
            f"  approved {first} by id from a new runtime: {done.phase}, revision {done.revision}, log {done.state.log}"
        )
        second = f"order-{len(page.records) + 2}"
        halted = await runtime.workflows.invoke(
            flow, {"item": "floor lamp"}, workflow_instance_id=second
        )
        print(
            f"  started {second}: halted at {halted.phase!r}, revision {halted.revision} (left for the next run)"
        )
    print(f"Run the demo again: a new process will approve {second} from {db}.")
