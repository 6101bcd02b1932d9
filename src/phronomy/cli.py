"""The ``phronomy`` command line: the durable demo and operators' commands.

::

    python -m phronomy demo [--db PATH]
    python -m phronomy migrate --db PATH
    python -m phronomy instances list --db PATH [--status S] [--workflow W] [--limit N]
                                      [--after ID] [--json]
    python -m phronomy instances show --db PATH ID
    python -m phronomy instances history --db PATH ID [--limit N] [--json]
    python -m phronomy instances cancel --db PATH ID [--reason TEXT] [--force]
    python -m phronomy instances resolve --db PATH ID {adopt,release}
    python -m phronomy executions list --db PATH [--json]
    python -m phronomy executions show --db PATH AGENT_ID
    python -m phronomy executions resolve --db PATH AGENT_ID {adopt,release}

Inspecting commands open the database read-only; no command ever creates one. Errors
print one line on stderr and exit with status 1 (2 for a usage error).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, get_args

import trio

from phronomy import __version__, _cli_commands as commands_module
from phronomy._cli_commands import safe
from phronomy._demo import run_demo
from phronomy.errors import PhronomyError, StoreUnavailableError
from phronomy.storage import InstanceStatus, SQLiteStore

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = ["build_parser", "main"]


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
        run: Callable[[SQLiteStore, argparse.Namespace], int],
        *,
        write: bool = False,
        json_output: bool = False,
    ) -> argparse.ArgumentParser:
        sub = group.add_parser(name, help=help_text, description=help_text)
        sub.add_argument(
            "--db",
            required=True,
            metavar="PATH",
            help="an existing phronomy SQLite database"
            + ("" if write else " (opened read-only)"),
        )
        if json_output:
            sub.add_argument(
                "--json", action="store_true", help="one JSON object per line"
            )
        sub.set_defaults(write=write, run=run, json=False)
        return sub

    command(
        commands,
        "migrate",
        "bring a database written by an earlier release to this release's schema",
        commands_module.migrate,
        write=True,
    )
    instances = commands.add_parser(
        "instances", help="inspect, cancel and resolve stored workflow instances"
    )
    actions = instances.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = command(
        actions,
        "list",
        "list instances, ordered by id",
        commands_module.listing,
        json_output=True,
    )
    listing.add_argument(
        "--status",
        choices=get_args(InstanceStatus),
        help="only instances with this status",
    )
    listing.add_argument("--workflow", help="only instances of this workflow")
    _paging(listing, "instances")
    listing.add_argument(
        "--after",
        metavar="ID",
        help="start after this instance id (the next page of an earlier listing)",
    )
    show = command(
        actions,
        "show",
        "show one instance: its row and stored fields",
        commands_module.show,
    )
    show.add_argument("id", help="the workflow instance id")
    history = command(
        actions,
        "history",
        "list an instance's last saves, newest first",
        commands_module.history,
        json_output=True,
    )
    history.add_argument("id", help="the workflow instance id")
    _paging(history, "saves")
    cancel = command(
        actions,
        "cancel",
        "cancel a stored instance that no runtime runs (a cancelled revision)",
        commands_module.cancel,
        write=True,
    )
    cancel.add_argument("id", help="the workflow instance id")
    cancel.add_argument("--reason", help="why (saved with the instance)")
    cancel.add_argument(
        "--force",
        action="store_true",
        help="cancel a 'running' instance that holds no lease too: only when you know "
        "no process runs it",
    )
    resolve = command(
        actions,
        "resolve",
        "resolve a recovery_required instance",
        commands_module.resolve,
        write=True,
    )
    resolve.add_argument("id", help="the workflow instance id")
    resolve.add_argument(
        "resolution",
        choices=["adopt", "release"],
        help="adopt: the stored state is the truth; release: mark it failed to retry",
    )

    executions = commands.add_parser(
        "executions", help="inspect and resolve supervised executions' records"
    )
    actions = executions.add_subparsers(dest="action", required=True, metavar="ACTION")
    command(
        actions,
        "list",
        "list stale execution records (active or recovery_required)",
        commands_module.executions_list,
        json_output=True,
    )
    show = command(
        actions,
        "show",
        "show one agent's execution record",
        commands_module.executions_show,
    )
    show.add_argument("agent_id", help="the agent id (the execution's key)")
    resolve = command(
        actions,
        "resolve",
        "close a stale execution record so its key can start",
        commands_module.executions_resolve,
        write=True,
    )
    resolve.add_argument("agent_id", help="the agent id (the execution's key)")
    resolve.add_argument(
        "resolution",
        choices=["adopt", "release"],
        help="adopt: keep a recorded outcome; release: close the record as abandoned",
    )
    return parser


def _paging(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--limit",
        type=_positive,
        default=100,
        help=f"at most this many {what} (default: %(default)s)",
    )


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
        print(f"phronomy: error: {safe(exc)}", file=sys.stderr)
        return 1
    try:
        status: int = args.run(store, args)
    except PhronomyError as exc:
        print(f"phronomy: error: {safe(exc)}", file=sys.stderr)
        return 1
    finally:
        store.close()
    return status
