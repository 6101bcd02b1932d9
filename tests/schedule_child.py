"""A process of the schedules' cross-process test (run as ``python
schedule_child.py serve STORE``): it serves the workflow ``job`` (see
:func:`job_flow`), so its inbox poll ticks the due schedules of it, until it is
killed. It prints ``ready`` once its runtime is open. *STORE* is ``sqlite:PATH`` or
``postgres:SCHEMA:DSN`` (see :func:`inbox_child.open_store`)."""

# ruff: noqa: T201 - the parent reads what these processes print

from __future__ import annotations

import sys

import trio

import phronomy
from inbox_child import open_store

POLL = 0.02
"""The serving runtimes' ``inbox_poll_interval`` (seconds)."""


class Job(phronomy.State):
    n: int = 0


def job_flow() -> phronomy.WorkflowDefinition[Job]:
    """One state that finishes at once."""
    wf = phronomy.Workflow(Job, name="job")
    wf.state("run", entry=lambda s: s.merge(n=s.n + 1))
    wf.transition("run", phronomy.FINISH)
    return wf.build()


async def serve(spec: str) -> None:
    store = open_store(spec)
    async with phronomy.open_runtime(
        store=store, workflows=[job_flow()], inbox_poll_interval=POLL
    ):
        print("ready", flush=True)
        await trio.sleep_forever()


if __name__ == "__main__":
    assert sys.argv[1] == "serve", sys.argv
    trio.run(serve, sys.argv[2])
