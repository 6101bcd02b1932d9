"""A supervised execution: a blocking tool, an approval step, and a cancel that waits.

Run: ``python examples/supervised_agent.py``
"""

from __future__ import annotations

import time
from typing import Any

import trio

import phronomy


def search(query: str) -> list[str]:
    """A blocking tool: runs in a worker thread."""
    time.sleep(0.1)
    return [f"{query} result {i}" for i in range(3)]


def ask_approval(results: list[str]) -> phronomy.ApprovalRequest:
    return phronomy.ApprovalRequest(question="Send these results?", details=results)


async def send(approval: phronomy.Approval, ctx: phronomy.agent.StepContext) -> str:
    """An async step: trio work, plus a supervised blocking call."""
    await trio.sleep(0.01)
    sent = await ctx.offload(lambda: len(approval.request.details))
    return f"sent {sent} results ({approval.response})"


def slow_tool(value: Any) -> str:
    time.sleep(0.5)
    return "too late"


async def main() -> None:
    async with phronomy.open_runtime() as runtime:
        executions = runtime.executions
        execution = executions.start(
            "assistant-1", [search, ask_approval, send], "trio"
        )
        request = await execution.wait_for_approval()
        print(f"suspended, asking: {request.question} {request.details}")
        try:  # one live execution per key: a second start is refused before any work
            await executions.invoke("assistant-1", [search], "other")
        except phronomy.BusyError as exc:
            print(f"second start refused: {exc}")
        execution.approve("ok by bob")
        print(await execution.result())

        cancelled = executions.start("assistant-2", [slow_tool])
        await trio.sleep(0.1)
        started = trio.current_time()
        cancelled.cancel("user pressed stop")
        try:
            await cancelled.result()
        except phronomy.CancellationError as exc:
            waited = trio.current_time() - started
            print(
                f"cancelled after {waited:.2f}s (the tool was allowed to finish): {exc}"
            )


if __name__ == "__main__":
    trio.run(main)
