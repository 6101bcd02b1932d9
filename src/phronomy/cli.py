"""The ``phronomy`` command line: the durable demo and operator commands.

::

    python -m phronomy demo [--db PATH]                 # the README's main job
    python -m phronomy instances list --db PATH [--status STATUS]
    python -m phronomy instances show --db PATH ID
    python -m phronomy instances resolve --db PATH ID {adopt,release}
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec
import trio

import phronomy
from phronomy.errors import ConflictError, NotFoundError
from phronomy.storage import SQLiteStore, decode_snapshot_builtins, resolve_stored

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["main"]


# --- the demo: a durable order approval on the embedded SQLite default --------------------------


class Order(phronomy.State):
    """An order that needs a person's approval before it ships."""

    item: str = ""
    approved_by: str = ""
    log: Annotated[list[str], phronomy.APPEND] = []  # noqa: RUF012 - msgspec copies it


def _draft(order: Order) -> Order:
    return order.merge(log=[f"drafted {order.item}"])


def _ship(order: Order, event: Any) -> Order:
    return order.merge(
        approved_by=event.payload or "someone", log=["approved", "shipped"]
    )


def demo_workflow() -> phronomy.WorkflowDefinition[Order]:
    """draft → awaiting_approval (wait state) → ship → FINISH."""
    wf = phronomy.Workflow(Order, name="orders")
    wf.state("draft", entry=_draft)
    wf.wait_state("awaiting_approval")
    wf.state("ship")
    wf.transition("draft", "awaiting_approval")
    wf.transition("awaiting_approval", "ship", on="approve", action=_ship)
    wf.transition("ship", phronomy.FINISH)
    return wf.build()


async def run_demo(db: str) -> None:
    """One demo run on *db*.

    1. Approve (by id) every order an earlier process left halted.
    2. Start an order: it halts at ``awaiting_approval`` and is saved.
    3. Close that runtime, open a new one, and approve the order by id alone.
    4. Start one more order and leave it halted for the next run.
    """
    flow = demo_workflow()
    async with phronomy.open_runtime(store=SQLiteStore(db)) as runtime:
        store = runtime.store
        assert store is not None
        page = await runtime.pool("cli").run(lambda: store.list_instances(limit=1000))
        leftovers = [
            r.workflow_instance_id for r in page.records if r.status == "halted"
        ]
        print(
            f"{db}: {len(page.records)} order(s) from earlier runs, {len(leftovers)} waiting for approval"
        )
        for iid in leftovers:
            done = await runtime.send_event(
                flow, event="approve", workflow_instance_id=iid, payload="next run"
            )
            print(
                f"  approved {iid} (halted by an earlier process): {done.phase}, revision {done.revision}"
            )
        first = f"order-{len(page.records) + 1}"
        halted = await runtime.invoke(
            flow, {"item": "desk lamp"}, workflow_instance_id=first
        )
        print(
            f"  started {first}: halted at {halted.phase!r}, revision {halted.revision}"
        )
    async with phronomy.open_runtime(
        store=SQLiteStore(db)
    ) as runtime:  # a fresh runtime
        done = await runtime.send_event(
            flow, event="approve", workflow_instance_id=first, payload="demo user"
        )
        print(
            f"  approved {first} by id from a new runtime: {done.phase}, revision {done.revision}, log {done.state.log}"
        )
        second = f"order-{len(page.records) + 2}"
        halted = await runtime.invoke(
            flow, {"item": "floor lamp"}, workflow_instance_id=second
        )
        print(
            f"  started {second}: halted at {halted.phase!r}, revision {halted.revision} (left for the next run)"
        )
    print(f"Run the demo again: a new process will approve {second} from {db}.")


# --- operator commands --------------------------------------------------------------------------


def _list(store: SQLiteStore, status: str | None, limit: int) -> int:
    page = store.list_instances(status=status, limit=limit)  # type: ignore[arg-type]
    for r in page.records:
        detail = f"  ({r.detail})" if r.detail else ""
        print(
            f"{r.workflow_instance_id}\t{r.workflow}\t{r.status}\trev {r.revision}\t{r.phase or '-'}{detail}"
        )
    if page.next_after:
        print(f"... more after {page.next_after}")
    return 0


def _show(store: SQLiteStore, iid: str) -> int:
    record = store.load(iid)
    if record is None:
        print(f"no instance {iid!r}", file=sys.stderr)
        return 1
    view: dict[str, Any] = msgspec.to_builtins(
        msgspec.structs.replace(record, snapshot=None)
    )
    if record.snapshot is not None:
        decoded = decode_snapshot_builtins(
            record.snapshot, workflow_instance_id=iid, revision=record.revision
        )
        view["fields"] = decoded.fields
    print(json.dumps(view, indent=2, sort_keys=True))
    return 0


def _resolve(store: SQLiteStore, iid: str, action: Literal["adopt", "release"]) -> int:
    try:
        record = resolve_stored(store, iid, action, by="an operator (cli)")
    except (NotFoundError, ConflictError) as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"{iid}: recovery_required -> {record.status}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m phronomy``."""
    parser = argparse.ArgumentParser(
        prog="phronomy", description=__doc__.splitlines()[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo", help="run a durable order approval on SQLite (run it twice)"
    )
    demo.add_argument(
        "--db", default="phronomy-demo.db", help="SQLite file (default: %(default)s)"
    )
    instances = commands.add_parser(
        "instances", help="inspect and resolve stored instances"
    )
    actions = instances.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list")
    listing.add_argument("--db", required=True)
    listing.add_argument(
        "--status",
        choices=["running", "halted", "finished", "failed", "recovery_required"],
    )
    listing.add_argument("--limit", type=int, default=100)
    show = actions.add_parser("show")
    show.add_argument("--db", required=True)
    show.add_argument("id")
    resolve = actions.add_parser("resolve")
    resolve.add_argument("--db", required=True)
    resolve.add_argument("id")
    resolve.add_argument("resolution", choices=["adopt", "release"])
    args = parser.parse_args(argv)
    if args.command == "demo":
        trio.run(run_demo, args.db)
        return 0
    store = SQLiteStore(args.db)
    try:
        match args.action:
            case "list":
                return _list(store, args.status, args.limit)
            case "show":
                return _show(store, args.id)
            case _:
                return _resolve(store, args.id, args.resolution)
    finally:
        store.close()
