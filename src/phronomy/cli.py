"""The ``phronomy`` command line: the durable demo and operators' commands.

::

    python -m phronomy demo [--db PATH]
    python -m phronomy instances list --db PATH [--status STATUS] [--limit N] [--after ID]
    python -m phronomy instances show --db PATH ID
    python -m phronomy instances resolve --db PATH ID {adopt,release}
    python -m phronomy executions list --db PATH
    python -m phronomy executions show --db PATH AGENT_ID
    python -m phronomy executions resolve --db PATH AGENT_ID {adopt,release}

Inspecting commands open the database read-only; no command ever creates one. Errors
print one line on stderr and exit with status 1 (2 for a usage error).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import TYPE_CHECKING, Any, get_args

import msgspec
import trio

from phronomy import __version__
from phronomy._demo import run_demo
from phronomy.agent._records import (
    agent_key,
    decode_record,
    resolve_record,
    stale_records,
)
from phronomy.errors import PhronomyError, StoreUnavailableError
from phronomy.storage import (
    InstanceStatus,
    SQLiteStore,
    decode_snapshot_builtins,
    resolve_stored,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["build_parser", "main"]

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _safe(value: object) -> str:
    """*value* as one line of text: control characters (tabs, newlines) escaped."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))


def _positive(text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def _open(path: str, *, write: bool = False) -> SQLiteStore:
    """The store at *path*; it must exist (a mistyped path is an error, not a new file)."""
    if write and not os.path.exists(path):
        raise StoreUnavailableError(
            f"SQLite database {path!r} does not exist (check the path)", path=path
        )
    store = SQLiteStore(path, read_only=not write)
    store.open()
    return store


# --- instances -------------------------------------------------------------------------


def _list(store: SQLiteStore, args: argparse.Namespace) -> int:
    page = store.list_instances(status=args.status, limit=args.limit, after=args.after)
    for r in page.records:
        detail = f"  ({_safe(r.detail)})" if r.detail else ""
        print(
            f"{_safe(r.workflow_instance_id)}\t{_safe(r.workflow)}\t{r.status}\t"
            f"rev {r.revision}\t{_safe(r.phase or '-')}{detail}"
        )
    if page.next_after is not None:
        print(f"... more: add --after {_safe(page.next_after)}")
    return 0


def _show(store: SQLiteStore, args: argparse.Namespace) -> int:
    record = store.load(args.id)
    if record is None:
        print(f"phronomy: no instance {_safe(args.id)}", file=sys.stderr)
        return 1
    view: dict[str, Any] = msgspec.to_builtins(
        msgspec.structs.replace(record, snapshot=None)
    )
    status = 0
    if record.snapshot is not None:
        try:
            decoded = decode_snapshot_builtins(
                record.snapshot, workflow_instance_id=args.id, revision=record.revision
            )
        except PhronomyError as exc:  # a corrupt row: say so, show what is readable
            view["snapshot_error"] = str(exc)
            status = 1
        else:
            view["fields"] = decoded.fields
    print(json.dumps(view, indent=2, sort_keys=True))
    return status


def _resolve(store: SQLiteStore, args: argparse.Namespace) -> int:
    record = resolve_stored(store, args.id, args.resolution, by="an operator (cli)")
    print(f"{_safe(args.id)}: recovery_required -> {record.status}")
    return 0


# --- executions ------------------------------------------------------------------------


def _executions_list(store: SQLiteStore, args: argparse.Namespace) -> int:
    for stale in stale_records(store):
        detail = f"  ({_safe(stale.detail)})" if stale.detail else ""
        print(
            f"{_safe(stale.agent_id)}\t{_safe(stale.execution_id or '-')}\t"
            f"{stale.status}\tsteps {stale.steps_completed}{detail}"
        )
    return 0


def _executions_show(store: SQLiteStore, args: argparse.Namespace) -> int:
    row, record = decode_record(store.load(agent_key(args.agent_id)))
    if row is None:
        print(
            f"phronomy: no execution record for {_safe(args.agent_id)}", file=sys.stderr
        )
        return 1
    view: dict[str, Any] = msgspec.to_builtins(
        msgspec.structs.replace(row, snapshot=None)
    )
    view["record"] = msgspec.to_builtins(record)
    print(json.dumps(view, indent=2, sort_keys=True))
    return 0


def _executions_resolve(store: SQLiteStore, args: argparse.Namespace) -> int:
    record = resolve_record(
        store, args.agent_id, args.resolution, by="an operator (cli)"
    )
    assert record is not None
    print(f"{_safe(args.agent_id)}: execution record -> {record.status}")
    return 0


# --- the parser ------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m phronomy``."""
    parser = argparse.ArgumentParser(
        prog="phronomy",
        description="Durable workflows for trio: the demo and operators' commands.",
    )
    parser.add_argument(
        "--version", action="version", version=f"phronomy {__version__}"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = commands.add_parser(
        "demo", help="run a durable order approval on SQLite (run it twice)"
    )
    demo.add_argument(
        "--db",
        default="phronomy-demo.db",
        help="the SQLite file to use (created if missing; default: %(default)s)",
    )

    def command(
        group: argparse._SubParsersAction[argparse.ArgumentParser],
        name: str,
        help_text: str,
        *,
        write: bool = False,
    ) -> argparse.ArgumentParser:
        sub = group.add_parser(name, help=help_text, description=help_text)
        sub.add_argument(
            "--db",
            required=True,
            metavar="PATH",
            help="an existing phronomy SQLite database"
            + ("" if write else " (opened read-only)"),
        )
        sub.set_defaults(write=write)
        return sub

    instances = commands.add_parser(
        "instances", help="inspect and resolve stored workflow instances"
    )
    actions = instances.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = command(actions, "list", "list instances, ordered by id")
    listing.add_argument(
        "--status",
        choices=get_args(InstanceStatus),
        help="only instances with this status",
    )
    listing.add_argument(
        "--limit",
        type=_positive,
        default=100,
        help="at most this many instances (default: %(default)s)",
    )
    listing.add_argument(
        "--after",
        metavar="ID",
        help="start after this instance id (the next page of an earlier listing)",
    )
    listing.set_defaults(run=_list)
    show = command(actions, "show", "show one instance: its row and stored fields")
    show.add_argument("id", help="the workflow instance id")
    show.set_defaults(run=_show)
    resolve = command(
        actions, "resolve", "resolve a recovery_required instance", write=True
    )
    resolve.add_argument("id", help="the workflow instance id")
    resolve.add_argument(
        "resolution",
        choices=["adopt", "release"],
        help="adopt: the stored state is the truth; release: mark it failed to retry",
    )
    resolve.set_defaults(run=_resolve)

    executions = commands.add_parser(
        "executions", help="inspect and resolve supervised executions' records"
    )
    actions = executions.add_subparsers(dest="action", required=True, metavar="ACTION")
    command(
        actions, "list", "list stale execution records (active or recovery_required)"
    ).set_defaults(run=_executions_list)
    show = command(actions, "show", "show one agent's execution record")
    show.add_argument("agent_id", help="the agent id (the execution's key)")
    show.set_defaults(run=_executions_show)
    resolve = command(
        actions,
        "resolve",
        "close a stale execution record so its key can start",
        write=True,
    )
    resolve.add_argument("agent_id", help="the agent id (the execution's key)")
    resolve.add_argument(
        "resolution",
        choices=["adopt", "release"],
        help="adopt: keep a recorded outcome; release: close the record as abandoned",
    )
    resolve.set_defaults(run=_executions_resolve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m phronomy``.

    Returns:
        The exit status: 0, 1 for an error, 2 for a usage error.
    """
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        trio.run(run_demo, args.db)
        return 0
    try:
        store = _open(args.db, write=args.write)
    except PhronomyError as exc:
        print(f"phronomy: error: {_safe(exc)}", file=sys.stderr)
        return 1
    try:
        status: int = args.run(store, args)
    except PhronomyError as exc:
        print(f"phronomy: error: {_safe(exc)}", file=sys.stderr)
        return 1
    finally:
        store.close()
    return status
