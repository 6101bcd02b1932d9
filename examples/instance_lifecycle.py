"""An instance's lifecycle: an idempotent submit, a watcher, a cancel.

A web handler submits order "o-7" twice (a retried request): ``if_exists="return"``
gives the second call the stored result instead of a second run. A dashboard task
watches the order from its first stable state. An operator cancels the order while it
waits for a slow payment call: the call's thread finishes first, then the order is
saved as cancelled.

Run: ``python examples/instance_lifecycle.py`` (in an empty directory).
"""

from __future__ import annotations

import time
from typing import Any

import trio

import phronomy


class Order(phronomy.State):
    item: str = ""
    paid: bool = False


def charge(item: str) -> bool:
    """A slow, blocking payment call."""
    time.sleep(0.3)
    return True


def pay(order: Order, event: Any, effects: phronomy.Effects) -> None:
    effects.offload(charge, order.item, on_done="paid")


def build() -> phronomy.WorkflowDefinition[Order]:
    wf = phronomy.Workflow(Order, name="lifecycle-orders")
    wf.state("new")
    wf.wait_state("awaiting_payment")
    wf.state("charging", entry=pay)
    wf.transition("new", "awaiting_payment")
    wf.transition("awaiting_payment", "charging", on="pay")
    wf.transition(
        "charging", phronomy.FINISH, on="paid", action=lambda o: o.merge(paid=True)
    )
    return wf.build()


async def main() -> None:
    flow = build()
    async with phronomy.open_runtime(store=phronomy.SQLiteStore("orders.db")) as rt:
        seen: list[str] = []

        async def dashboard(task_status: trio.TaskStatus[None]) -> None:
            async with rt.workflows.watch(flow, "o-7", if_missing="wait") as updates:
                task_status.started()
                async for update in updates:
                    seen.append(f"{update.status}@{update.phase}")
                    if update.status in ("finished", "cancelled", "failed"):
                        return

        async with trio.open_nursery() as nursery:
            await nursery.start(dashboard)
            for attempt in (1, 2):  # the handler's request is retried
                order = await rt.workflows.invoke(
                    flow,
                    {"item": "lamp"},
                    workflow_instance_id="o-7",
                    if_exists="return",
                )
                print(
                    f"submit {attempt}: {order.status} at {order.phase}, rev {order.revision}"
                )
            payment = rt.workflows.start_event(flow, "pay", workflow_instance_id="o-7")
            await trio.sleep(0.05)  # the payment call is running in its thread
            cancelled = await rt.workflows.cancel(flow, "o-7", reason="customer left")
            print(f"cancel: {cancelled.status} at rev {cancelled.revision}")
            try:
                await payment.result()
            except phronomy.WorkflowCancelledError as exc:
                print(f"the payment segment was cancelled: {exc.reason}")
        print("dashboard saw: " + ", ".join(seen))
        history = await rt.workflows.history("o-7")
        print(
            "history: "
            + ", ".join(f"{e.revision}:{e.status}" for e in reversed(history))
        )


if __name__ == "__main__":
    trio.run(main)
