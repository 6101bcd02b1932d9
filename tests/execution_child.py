"""The processes of the executions' cross-process tests (``python execution_child.py``).

``python execution_child.py ROLE STORE LEDGER ARGS...``, where *STORE* is
``sqlite:PATH`` or ``postgres:SCHEMA:DSN`` (see :func:`inbox_child.open_store`) and
*LEDGER* a file each step appends ``start|end KEY STEP PID TIME`` lines to. Every role
prints ``ready`` once its runtime is open.

* ``race KEY GO``: once the file *GO* exists, start an execution of :data:`LONG` for
  *KEY*; print ``won`` (it completed here) or ``busy`` (the key was taken).
* ``serve KEYS [GO]``: once the file *GO* exists, start executions of :data:`PLAN` (even positions) and
  :data:`APPROVED` (odd ones) for the comma-separated *KEYS*, then serve both plans
  until killed: its sweep takes over the executions of a runtime that died, and its
  poll resumes them (and applies answers stored by the command line).
* ``stall KEY``: start one execution of :data:`LONG` and serve until killed (the
  zombie test SIGSTOPs it in its long step).
"""

# ruff: noqa: T201 - the parent reads what these processes print

from __future__ import annotations

import os
import sys
import time
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
POLL = 0.05
STEP = 0.15
"""Seconds each step takes (where a kill -9 finds executions in a step)."""


def _ledger(what: str, value: Any, step: str) -> None:
    line = f"{what} {value['key']} {step} {os.getpid()} {time.time():.6f}\n"
    fd = os.open(os.environ["PHRONOMY_LEDGER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line.encode())  # one write: whole lines, never interleaved
    finally:
        os.close(fd)


def _step(value: Any, step: str, seconds: float = STEP) -> dict[str, Any]:
    if isinstance(value, dict) and "request" in value:  # an Approval, as JSON
        value = value["request"]["details"]
    if isinstance(value, phronomy.Approval):
        value = value.request.details
    _ledger("start", value, step)
    time.sleep(seconds)
    _ledger("end", value, step)
    return {**value, "done": [*value.get("done", []), [step, os.getpid()]]}


def first(value: Any) -> dict[str, Any]:
    return _step(value, "first")


def second(value: Any) -> dict[str, Any]:
    return _step(value, "second")


def third(value: Any) -> dict[str, Any]:
    return _step(value, "third")


def ask(value: Any) -> phronomy.ApprovalRequest:
    return phronomy.ApprovalRequest(question="go on?", details=value)


def long(value: Any) -> dict[str, Any]:
    return _step(value, "long", 3.0)


PLAN = phronomy.agent.execution_plan([first, second, third], name="three")
APPROVED = phronomy.agent.execution_plan([first, ask, third], name="approved")
LONG = phronomy.agent.execution_plan([first, long, third], name="long")
PLANS = [PLAN, APPROVED, LONG]


def _wait_for(path: str) -> None:
    while not os.path.exists(path):
        time.sleep(0.01)


async def race(rt: phronomy.Runtime, key: str, go: str) -> None:
    await trio.to_thread.run_sync(_wait_for, go)
    try:
        await rt.executions.invoke(key, LONG, {"key": key})  # holds the key 3.3 s
    except phronomy.BusyError:
        print("busy", flush=True)
    else:
        print("won", flush=True)


async def main() -> None:
    role, spec, ledger, *args = sys.argv[1:]
    os.environ["PHRONOMY_LEDGER"] = ledger
    async with phronomy.open_runtime(
        store=open_store(spec), workflows=PLANS, inbox_poll_interval=POLL, **LEASES
    ) as rt:
        print("ready", flush=True)
        if role == "race":
            await race(rt, args[0], args[1])
            return
        keys = args[0].split(",") if args and args[0] else []
        if len(args) > 1:  # wait until every process is up (another process says so)
            await trio.to_thread.run_sync(_wait_for, args[1])
        for i, key in enumerate(keys):
            plan = LONG if role == "stall" else (APPROVED if i % 2 else PLAN)
            rt.executions.start(key, plan, {"key": key})
        await trio.sleep_forever()


if __name__ == "__main__":
    trio.run(main)
