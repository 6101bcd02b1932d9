"""An expense approval that waits for a manager and survives its process (the tutorial)."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

import trio

import phronomy


class Expense(phronomy.State):
    employee: str = ""
    amount: int = 0
    approved_by: str = ""
    history: Annotated[list[str], phronomy.APPEND] = []  # noqa: RUF012 - copied per state


def check_policy(expense: Expense) -> Expense:
    return expense.merge(history=[f"{expense.employee} submitted {expense.amount}"])


def record_approval(expense: Expense, event: Any) -> Expense:
    return expense.merge(
        approved_by=event.payload, history=[f"approved by {event.payload}"]
    )


def build() -> phronomy.WorkflowDefinition[Expense]:
    wf = phronomy.Workflow(Expense, name="expenses")
    wf.state("submitted", entry=check_policy)
    wf.wait_state("awaiting_manager")
    wf.wait_state("escalated")
    wf.state("paid", entry=lambda e: e.merge(history=["paid"]))
    wf.transition("submitted", "awaiting_manager")
    for waiting in ("awaiting_manager", "escalated"):
        wf.transition(
            waiting,
            "paid",
            on="approve",
            guard=lambda e, event: event.payload != e.employee,  # no self-approval
            action=record_approval,
        )
    wf.transition(  # nobody approved within two days: finance decides
        "awaiting_manager",
        "escalated",
        after=timedelta(days=2),
        action=lambda e: e.merge(history=["escalated to finance"]),
    )
    wf.transition("paid", phronomy.FINISH)
    return wf.build()


def report(result: phronomy.WorkflowResult[Expense]) -> None:
    print(
        f"{result.workflow_instance_id} is {result.phase} at revision "
        f"{result.revision}: {result.state.history}"
    )


async def submit(
    flow: phronomy.WorkflowDefinition[Expense],
) -> phronomy.WorkflowResult[Expense]:
    store = phronomy.SQLiteStore("expenses.db")
    async with phronomy.open_runtime(store=store) as runtime:
        expense = await runtime.workflows.invoke(
            flow,
            {"employee": "ana", "amount": 120},
            workflow_instance_id="exp-1",
            if_exists="return",  # exp-1 exists already? then what the store holds
        )
    report(expense)
    return expense


async def approve(flow: phronomy.WorkflowDefinition[Expense]) -> None:
    store = phronomy.SQLiteStore("expenses.db")
    async with phronomy.open_runtime(store=store) as runtime:
        try:
            await runtime.workflows.send_event(
                flow, "approve", workflow_instance_id="exp-1", payload="ana"
            )
        except phronomy.EventRejectedError as exc:
            print(f"refused: {exc.event!r} at {exc.phase!r}, nothing changed")
        done = await runtime.workflows.send_event(
            flow, "approve", workflow_instance_id="exp-1", payload="bob"
        )
    report(done)


async def main() -> None:
    flow = build()
    expense = await submit(flow)
    if expense.status == "halted":  # waiting for a manager: approve it
        await approve(flow)


if __name__ == "__main__":
    trio.run(main)
