"""An approval workflow with a wait state, a live signal and an effect.

draft -> reserving (an offloaded stock check delivers "reserved") -> awaiting_payment
(a live state: the "paid" signal reaches it while it runs) -> awaiting_approval (a wait
state: the segment halts and returns) -> ship -> FINISH.

Run: ``python examples/order_approval.py``
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import trio

import phronomy


class Order(phronomy.State):
    item: str = ""
    amount: int = 0
    reserved: bool = False
    approved: bool = False
    log: Annotated[list[str], phronomy.APPEND] = []  # noqa: RUF012 - msgspec copies defaults


def check_stock(item: str) -> bool:
    """A blocking call (an inventory service, a database, ...)."""
    time.sleep(0.05)
    return item != "unicorn"


def reserve(order: Order, event: Any, effects: phronomy.Effects) -> Order:
    effects.offload(check_stock, order.item, on_done="reserved")
    return order.merge(log=["checking stock"])


def build() -> phronomy.WorkflowDefinition[Order]:
    wf = phronomy.Workflow(Order, name="order-approval")
    wf.state("draft", entry=lambda o: o.merge(log=[f"drafted {o.item}"]))
    wf.state("reserving", entry=reserve)
    wf.state("awaiting_payment")
    wf.wait_state("awaiting_approval")
    wf.state("ship", entry=lambda o: o.merge(approved=True, log=["shipped"]))
    wf.transition("draft", "reserving")
    wf.transition(
        "reserving",
        "awaiting_payment",
        on="reserved",
        guard=lambda o, e: e.payload is True,
        action=lambda o: o.merge(reserved=True),
    )
    wf.transition(
        "reserving",
        phronomy.FINISH,
        on="reserved",
        action=lambda o: o.merge(log=["out of stock"]),
    )
    wf.transition(
        "awaiting_payment",
        "awaiting_approval",
        on="paid",
        guard=lambda o, e: e.payload["amount"] >= o.amount,
        action=lambda o, e: o.merge(log=[f"paid {e.payload['amount']}"]),
    )
    wf.transition(
        "awaiting_approval", "ship", on="approve", guard=lambda o, e: e.payload != "no"
    )
    wf.transition("ship", phronomy.FINISH)
    return wf.build()


async def main() -> None:
    flow = build()
    print(flow.to_mermaid())
    async with phronomy.open_runtime() as runtime:
        async with runtime.workflows.stream(
            flow, {"item": "book", "amount": 10}, workflow_instance_id="order-7"
        ) as steps:
            async for step in steps:
                print(f"stable state: {step.phase:18} log={step.state.log}")
                if step.phase == "awaiting_payment":
                    # a live segment: the signal reaches its session directly
                    assert runtime.workflows.signal(
                        flow, "order-7", "paid", {"amount": 5}
                    )  # guard rejects: still waiting
                    assert runtime.workflows.signal(
                        flow, "order-7", "paid", {"amount": 10}
                    )
        halted = await steps.result()
        print(f"halted at {halted.phase!r}: {halted.state.log}")
        done = await runtime.workflows.send_event(
            flow, "approve", halted=halted, payload="manager"
        )
        print(f"finished: approved={done.state.approved} log={done.state.log}")


if __name__ == "__main__":
    trio.run(main)
