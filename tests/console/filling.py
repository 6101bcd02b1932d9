"""A store filled by a real run, for the console's tests: expense instances of the
tutorial's workflow (halted with a timer, finished, hostile ids), a supervised
execution waiting for an approval, and a schedule."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import trio

import phronomy

EXAMPLES = Path(__file__).parents[2] / "examples"
HOSTILE_ID = "<script>alert('x')</script>&\"x"


def example(name: str) -> Any:
    """An example module (examples/NAME.py), imported once."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def expenses() -> phronomy.WorkflowDefinition[Any]:
    flow: phronomy.WorkflowDefinition[Any] = example("tutorial_expenses").build()
    return flow


def _search(query: str) -> list[str]:
    return [f"{query} result {i}" for i in range(2)]


def _ask(results: list[str]) -> phronomy.ApprovalRequest:
    return phronomy.ApprovalRequest(question="Send these results?", details=results)


def _send(approval: phronomy.Approval) -> str:
    return f"sent ({approval.response})"


async def fill(store: phronomy.storage.WorkflowStore) -> None:
    """Run the tutorial's workflow and a supervised execution on *store*."""
    flow = expenses()
    async with phronomy.open_runtime(store=store) as runtime:
        wf = runtime.workflows
        for n, (employee, amount) in enumerate(
            [("ana", 120), ("bo", 40), ("cy", 900)], start=1
        ):
            await wf.invoke(
                flow,
                {"employee": employee, "amount": amount},
                workflow_instance_id=f"exp-{n}",
            )
        await wf.send_event(
            flow, "approve", workflow_instance_id="exp-2", payload="dan"
        )
        await wf.invoke(flow, {"employee": "eve"}, workflow_instance_id=HOSTILE_ID)
        execution = runtime.executions.start(
            "assistant-1", [_search, _ask, _send], "trio"
        )
        await execution.wait_for_approval()
        await runtime.schedules.create("nightly", flow, cron="0 3 * * *")


def fill_sqlite(path: Path) -> None:
    """A new SQLite file at *path*, filled by :func:`fill`."""

    async def run() -> None:
        store = phronomy.SQLiteStore(path)
        try:
            await fill(store)
        finally:
            store.close()

    trio.run(run)
