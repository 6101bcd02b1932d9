"""The processes of the timers' kill -9 test (run as ``python timer_child.py``).

``python timer_child.py ROLE STORE ARGS...``, where *STORE* is ``sqlite:PATH`` or
``postgres:SCHEMA:DSN`` (see :func:`inbox_child.open_store`). Every role prints
``ready`` once its runtime is open.

* ``serve``: serve the timed workflows (see :func:`timed_flow`) until killed: its
  inbox poll fires their due timers and resumes the instances they belong to.
* ``start COUNT PACE``: start instances ``x-0..x-<COUNT-1>`` (``x-i`` of workflow
  ``timed-<i % SLOTS>``), one every *PACE* seconds; each halts at ``awaiting``,
  arming its timeout. This runtime never polls, so it fires no timer and resumes
  nothing (the serving ones do), nor sweeps; its leases are long (it is never
  killed, and a busy store must not cost it one). It prints ``started IID REVISION``
  for each, then ``started all``, and ends.
"""

# ruff: noqa: T201 - the parent reads what these processes print

from __future__ import annotations

import sys
from datetime import timedelta
from typing import Any

import trio

import phronomy
from inbox_child import open_store

LEASES: dict[str, Any] = {
    "lease_ttl": 0.8,
    "heartbeat_interval": 0.2,
    "lease_margin": 0.2,
    "sweep_interval": 0.2,
}
STARTER_LEASES: dict[str, Any] = {  # never killed: no need to be replaced fast
    "lease_ttl": 10.0,
    "heartbeat_interval": 2.0,
    "lease_margin": 2.0,
    "sweep_interval": 0,
}
POLL = 0.05
"""The serving runtimes' ``inbox_poll_interval`` (seconds)."""

SLOTS = 8
"""Timed workflows, one timeout each (see :func:`delay_ms`)."""

WORK = 0.1
"""Seconds the work after the timeout takes (an effect of the live state ``working``):
the segment that applies a timer holds its instance that long before its save, where
a kill -9 finds more of them."""


def delay_ms(slot: int) -> int:
    """The timeout of workflow ``timed-<slot>``: 200 ms to 3 s."""
    return 200 + slot * 400


class Timed(phronomy.State):
    visits: int = 0  # entries into awaiting
    fired: int = 0  # applications of its timeout


async def _work(*_: Any) -> None:
    await trio.sleep(WORK)


def timed_flow(slot: int) -> phronomy.WorkflowDefinition[Timed]:
    """``awaiting`` (a wait state) times out after :func:`delay_ms` (its action counts
    its applications) into ``working``, which waits for its effect (:data:`WORK`), then
    into ``done`` (a wait state, odd slots) or ``FINISH`` (even slots): one segment,
    saved as it halts or ends. No event is ever sent to it: only the timer moves it."""
    wf = phronomy.Workflow(Timed, name=f"timed-{slot}")
    wf.wait_state("awaiting")
    wf.entry("awaiting", lambda s: s.merge(visits=s.visits + 1))
    wf.transition(
        "awaiting",
        "working",
        after=timedelta(milliseconds=delay_ms(slot)),
        action=lambda s: s.merge(fired=s.fired + 1),
    )
    wf.state(
        "working",
        entry=lambda s, e, effects: effects.start_soon(_work, on_done="worked"),
    )
    if slot % 2:
        wf.wait_state("done")
        wf.transition("working", "done", on="worked")
        wf.transition("done", phronomy.FINISH, on="close")
    else:
        wf.transition("working", phronomy.FINISH, on="worked")
    return wf.build()


FLOWS = [timed_flow(slot) for slot in range(SLOTS)]


def instance(i: int) -> tuple[str, phronomy.WorkflowDefinition[Timed]]:
    """The id and workflow of the *i*-th instance."""
    return f"x-{i}", FLOWS[i % SLOTS]


async def start(rt: phronomy.Runtime, count: int, pace: float) -> None:
    due = trio.current_time()
    for i in range(count):
        await trio.sleep_until(due)
        due += pace
        iid, flow = instance(i)
        halted = await rt.workflows.invoke(flow, workflow_instance_id=iid)
        print("started", iid, halted.revision, flush=True)
    print("started all", flush=True)


async def main() -> None:
    role, spec, *args = sys.argv[1:]
    starter = role == "start"
    async with phronomy.open_runtime(
        store=open_store(spec),
        workflows=FLOWS,
        inbox_poll_interval=0 if starter else POLL,
        **(STARTER_LEASES if starter else LEASES),
    ) as rt:
        print("ready", flush=True)
        if starter:
            await start(rt, int(args[0]), float(args[1]))
        else:
            await trio.sleep_forever()


if __name__ == "__main__":
    trio.run(main)
