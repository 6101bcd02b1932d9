"""The processes of the inbox's cross-process tests (run as ``python inbox_child.py``).

``python inbox_child.py ROLE STORE ARGS...``, where *STORE* is ``sqlite:PATH`` or
``postgres:SCHEMA:DSN``. Every role prints ``ready`` once its runtime is open.

* ``hold KIND IDS``: start the comma-separated instances of the tally workflow
  (``wait`` or ``live``: see :func:`tally_flow`; those not stored yet) and serve the
  workflows until killed.
* ``send ACKS FROM COUNT INSTANCES``: post events ``FROM..FROM+COUNT-1`` (event id
  ``e<i>``, payload ``i``) round robin to instances ``t-0..t-<INSTANCES-1>``, eight at
  a time, and append ``i iid then`` to *ACKS* (fsynced) once each post returned.
  The events before *FROM* that were not acknowledged are posted again first (with
  their ids: a repeat of a stored one must not apply twice).
* ``same IID EVENT_ID GATE``: once the file *GATE* exists, send one ``add`` event
  with that id and wait for its outcome; print ``outcome STATUS REVISION``.
* ``signal IID COUNT``: post ``add`` events ``0..COUNT-1`` to a live instance in
  order, then send ``finish`` and wait for it; print ``finished REVISION COUNT``.
"""

# ruff: noqa: T201 - the parent reads what these processes print

from __future__ import annotations

import os
import sys
from typing import Annotated, Any

import trio

import phronomy

LEASES: dict[str, Any] = {
    "lease_ttl": 0.8,
    "heartbeat_interval": 0.2,
    "lease_margin": 0.2,
    "sweep_interval": 0.2,
}


class Tally(phronomy.State):
    steps: Annotated[list[str], phronomy.APPEND] = []  # noqa: RUF012
    count: int = 0


def tally_flow(*, live: bool) -> phronomy.WorkflowDefinition[Tally]:
    """``add`` appends its payload, ``finish`` ends the instance. In a wait state
    (each event is a segment, saved when it halts again) or a live one (one segment
    applies every event; the events are consumed when it ends)."""
    wf = phronomy.Workflow(Tally, name="live" if live else "tally")
    if live:
        wf.state("open")
    else:
        wf.wait_state("open")
    wf.transition(
        "open",
        "open",
        on="add",
        action=lambda s, e: s.merge(steps=[str(e.payload)], count=s.count + 1),
    )
    wf.transition("open", phronomy.FINISH, on="finish")
    return wf.build()


def open_store(spec: str) -> phronomy.storage.BaseStore[Any]:
    """The store *spec* names (see the module docstring)."""
    kind, _, rest = spec.partition(":")
    if kind == "sqlite":
        return phronomy.SQLiteStore(rest, save_log_depth=100_000)
    schema, _, dsn = rest.partition(":")
    return phronomy.PostgresStore(dsn, schema=schema, save_log_depth=100_000)


FLOW = tally_flow(live=False)
LIVE = tally_flow(live=True)


async def _retrying(post: Any) -> Any:
    while True:
        try:
            return await post()
        except phronomy.TransientError:  # busy: the same event again
            await trio.sleep(0.05)


async def hold(rt: phronomy.Runtime, kind: str, ids: str) -> None:
    flow = LIVE if kind == "live" else FLOW
    for iid in ids.split(","):  # a stored one is left to the inbox (its events)
        rt.workflows.start(flow, workflow_instance_id=iid, if_exists="return")
    await trio.sleep_forever()


async def send(
    rt: phronomy.Runtime, acks: str, first: int, count: int, instances: int
) -> None:
    done = set()
    path = trio.Path(acks)
    if await path.exists():
        done = {int(line.split()[0]) for line in (await path.read_text()).splitlines()}
    fd = os.open(acks, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    todo = [i for i in range(max(0, first - 16), first) if i not in done]
    todo += range(first, first + count)
    queue = iter(todo)

    async def poster() -> None:
        for i in queue:
            iid = f"t-{i % instances}"
            receipt = await _retrying(
                lambda: rt.workflows.post(FLOW, iid, "add", i, event_id=f"e{i}")  # noqa: B023
            )
            os.write(fd, f"{i} {iid} {receipt.then}\n".encode())
            os.fsync(fd)

    async with trio.open_nursery() as nursery:
        for _ in range(8):
            nursery.start_soon(poster)


async def same(rt: phronomy.Runtime, iid: str, event_id: str, gate: str) -> None:
    while not await trio.Path(gate).exists():  # noqa: ASYNC110 - another process's
        await trio.sleep(0.005)
    done = await _retrying(
        lambda: rt.workflows.send_event(
            FLOW, "add", payload=event_id, workflow_instance_id=iid, event_id=event_id
        )
    )
    print("outcome", done.status, done.revision, done.state.count, flush=True)


async def signal(rt: phronomy.Runtime, iid: str, count: int) -> None:
    for i in range(count):
        await rt.workflows.post(LIVE, iid, "add", i, event_id=f"s{i}")
    done = await rt.workflows.send_event(LIVE, "finish", workflow_instance_id=iid)
    print("finished", done.revision, done.state.count, flush=True)


async def main() -> None:
    role, spec, *args = sys.argv[1:]
    poll = float(os.environ.get("PHRONOMY_CHILD_POLL", "0.1"))
    async with phronomy.open_runtime(
        store=open_store(spec),
        workflows=[FLOW, LIVE],
        inbox_poll_interval=poll,
        **LEASES,
    ) as rt:
        print("ready", flush=True)
        if role == "hold":
            await hold(rt, *args)
        elif role == "send":
            acks, first, count, instances = args
            await send(rt, acks, int(first), int(count), int(instances))
        elif role == "same":
            await same(rt, *args)
        else:
            await signal(rt, args[0], int(args[1]))


if __name__ == "__main__":
    trio.run(main)
