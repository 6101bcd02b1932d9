"""The tutorial's program: a durable expense approval, in three runs of one script.

Run: ``python examples/tutorial_expenses.py`` (in an empty directory). The first run
submits an expense, which halts waiting for a manager and is saved; the runtime closes.
A second runtime (it could be another process, days later) approves it by id.
"""

from __future__ import annotations

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
    wf.state("paid", entry=lambda e: e.merge(history=["paid"]))
    wf.transition("submitted", "awaiting_manager")
    wf.transition(
        "awaiting_manager",
        "paid",
        on="approve",
        guard=lambda e, event: event.payload != e.employee,  # no self-approval
        action=record_approval,
    )
    wf.transition("paid", phronomy.FINISH)
    return wf.build()


async def main() -> None:
    flow = build()
    store = "expenses.db"
    async with phronomy.open_runtime(store=phronomy.SQLiteStore(store)) as runtime:
        halted = await runtime.workflows.invoke(
            flow, {"employee": "ana", "amount": 120}, workflow_instance_id="exp-1"
        )
        print(f"exp-1 is {halted.phase} at revision {halted.revision}")

    async with phronomy.open_runtime(store=phronomy.SQLiteStore(store)) as runtime:
        try:
            await runtime.workflows.send_event(
                flow, "approve", workflow_instance_id="exp-1", payload="ana"
            )
        except phronomy.EventRejectedError as exc:
            print(f"refused: {exc.event!r} at {exc.phase!r}, nothing changed")
        done = await runtime.workflows.send_event(
            flow, "approve", workflow_instance_id="exp-1", payload="bob"
        )
        print(
            f"exp-1 is {done.phase} at revision {done.revision}: {done.state.history}"
        )


if __name__ == "__main__":
    trio.run(main)
