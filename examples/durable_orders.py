"""Durable orders on SQLite: a halted order survives its runtime and resumes by id.

Run: ``python examples/durable_orders.py [orders.db]``
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import trio

import phronomy


class Order(phronomy.State):
    item: str = ""
    approved_by: str = ""


def build() -> phronomy.WorkflowDefinition[Order]:
    wf = phronomy.Workflow(Order, name="orders")
    wf.wait_state("awaiting_approval")
    wf.initial("awaiting_approval")
    wf.transition(
        "awaiting_approval",
        phronomy.FINISH,
        on="approve",
        action=lambda o, e: o.merge(approved_by=e.payload),
    )
    return wf.build()


async def main(path: str) -> None:
    flow = build()
    async with phronomy.open_runtime(store=phronomy.SQLiteStore(path)) as runtime:
        halted = await runtime.workflows.invoke(
            flow, {"item": "lamp"}, workflow_instance_id="order-1"
        )
        print(f"order-1 halted at {halted.phase!r}, revision {halted.revision}")
    # ... later, in another runtime (or another process): only the id is needed
    async with phronomy.open_runtime(store=phronomy.SQLiteStore(path)) as runtime:
        done = await runtime.workflows.send_event(
            flow, event="approve", workflow_instance_id="order-1", payload="alice"
        )
        print(
            f"order-1 {done.phase} at revision {done.revision}, approved by {done.state.approved_by}"
        )
        view = await runtime.recovery.inspect("order-1")
        assert view.record is not None
        print(
            f"store status: {view.record.status}; needing recovery: {await runtime.recovery.list()}"
        )


if __name__ == "__main__":
    target = (
        sys.argv[1]
        if len(sys.argv) > 1
        else str(Path(tempfile.mkdtemp()) / "orders.db")
    )
    trio.run(main, target)
