"""The ``phronomy`` command line: the durable demo and operators' commands.

::

    python -m phronomy demo [--db PATH]
    python -m phronomy migrate --db PATH_OR_DSN
    python -m phronomy instances list --db PATH_OR_DSN [--status S] [--workflow W]
                                      [--limit N] [--since TIME] [--until TIME]
                                      [--after ID]
    python -m phronomy instances show --db PATH_OR_DSN ID
    python -m phronomy instances history --db PATH_OR_DSN ID [--limit N]
    python -m phronomy instances start --db PATH_OR_DSN MODULE:ATTR ID [--input JSON]
    python -m phronomy instances send --db PATH_OR_DSN ID EVENT [--payload JSON]
    python -m phronomy instances cancel --db PATH_OR_DSN ID [--reason TEXT] [--force]
                                        [--wait SECONDS | --no-wait]
    python -m phronomy instances terminate --db PATH_OR_DSN ID [--status S]
    python -m phronomy instances retry --db PATH_OR_DSN ID
    python -m phronomy instances fork --db PATH_OR_DSN ID --new-id NEW [--revision N]
    python -m phronomy instances purge --db PATH_OR_DSN --older-than DURATION
                                       [--status S] [--workflow W] [--dry-run]
    python -m phronomy instances resolve --db PATH_OR_DSN ID {adopt,release}
    python -m phronomy schedules list|show|pause|resume|trigger|backfill|delete ...
    python -m phronomy executions list --db PATH_OR_DSN [--status S] [--agent PREFIX]
                                       [--limit N] [--after ID]
    python -m phronomy executions show --db PATH_OR_DSN AGENT_ID
    python -m phronomy executions approve|reject --db PATH_OR_DSN AGENT_ID
                                                 [--response JSON]
    python -m phronomy executions cancel --db PATH_OR_DSN AGENT_ID [--reason TEXT]
                                         [--wait SECONDS | --no-wait]
    python -m phronomy executions resolve --db PATH_OR_DSN AGENT_ID {adopt,release}
    python -m phronomy console --db PATH_OR_DSN [--schema NAME] [--host H] [--port N]
                               [--app M:ATTR]
                               [--allow-actions [--token-file PATH | --token TOKEN]]

``--db`` is an SQLite file, a ``postgresql://`` URI or a libpq ``key=value`` string
(``host=db dbname=app``; schema: the ``search_path`` its options set, or
``--schema``); a password in it is never printed. Inspecting commands open the
database read-only (PostgreSQL: read-only sessions); no command ever creates one, and
only ``migrate`` migrates one (the others refuse a database of an earlier release and
leave it unchanged). ``instances`` commands never show or change supervised
executions (``executions`` commands do). Every command but ``demo`` and ``console``
takes ``--json``. Tables (``show``: a ``FIELD``/``VALUE`` table) have a header row
and times in ISO 8601 UTC; ``--json`` prints one object per line (``show``: one
indented object), with the stored milliseconds and their ISO 8601 forms. ``--limit``
is at most 10000 (purge: any). TIME is ISO 8601 with an offset or a duration ago
(``7d``, ``12h``). ``terminate`` closes an instance without waiting for the runtime
that runs it (dangerous: see the reference).

Exit status: 0; 1 for an error, printed as one line ``phronomy: error: ...`` on stderr;
2 for a usage error (argparse's message); 141 when stdout is closed early (``| head``),
quietly; 130 when interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any, get_args

import trio

from phronomy import (
    __version__,
    _cli_commands as commands_module,
    _cli_events as events_module,
    _cli_executions as executions_module,
    _cli_schedules as schedules_module,
)
from phronomy._cli_output import safe
from phronomy._cli_parser import add_operating, add_time_filters, add_wait
from phronomy._cli_store import CliStore, open_store, shown
from phronomy._demo import run_demo
from phronomy.agent._records import RECORD_STATUSES
from phronomy.errors import PhronomyError
from phronomy.storage import MAX_LIMIT, InstanceStatus
from phronomy.storage._postgres_errors import Secrets

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = ["EXIT_BROKEN_PIPE", "build_parser", "main"]

EXIT_BROKEN_PIPE = 141
"""The exit status when stdout closes before the output is written (128 + SIGPIPE)."""


def _limit(text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= number <= MAX_LIMIT:
        raise argparse.ArgumentTypeError(
            f"must be from 1 to {MAX_LIMIT}, got {number} (page on with --after)"
        )
    return number


def _open(args: argparse.Namespace) -> CliStore:
    """The store ``args.db`` names, open; only ``migrate`` may migrate it. Afterwards
    ``args.db`` is the text to show (a URI's password masked)."""
    store = open_store(
        args.db,
        read_only=not args.write,
        migrate=args.command == "migrate",
        schema=args.schema,
    )
    args.db = shown(args.db)
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
        run: Callable[[CliStore, argparse.Namespace], int],
        *,
        write: bool = False,
    ) -> argparse.ArgumentParser:
        sub = group.add_parser(name, help=help_text, description=help_text)
        sub.add_argument(
            "--db",
            required=True,
            metavar="PATH_OR_DSN",
            help="an existing phronomy SQLite database, or a postgresql:// URI"
            + ("" if write else " (opened read-only)"),
        )
        sub.add_argument(
            "--schema",
            help="the PostgreSQL schema (default: the URI's search_path, else public)",
        )
        sub.add_argument(
            "--json",
            action="store_true",
            help="print JSON for programs instead of a table: one object per line "
            "(show: one object)",
        )
        sub.set_defaults(write=write, run=run)
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
        "list workflow instances, ordered by id (executions: `executions list`)",
        commands_module.listing,
    )
    listing.add_argument(
        "--status",
        choices=get_args(InstanceStatus),
        help="only instances with this status",
    )
    listing.add_argument("--workflow", help="only instances of this workflow")
    _paging(listing, "instances")
    add_time_filters(listing)
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
        "list an instance's last saves and events, newest first",
        events_module.history,
    )
    history.add_argument("id", help="the workflow instance id")
    _paging(history, "saves and events")
    send = command(
        actions,
        "send",
        "store an event for an instance (a runtime that runs it or serves its "
        "workflow applies it, once)",
        events_module.send,
        write=True,
    )
    send.add_argument("id", help="the workflow instance id")
    send.add_argument("event", help="the event's name")
    send.add_argument("--payload", metavar="JSON", help="the payload, a JSON value")
    send.add_argument(
        "--event-id",
        help="the idempotency key (default: a new UUID); a repeat stores nothing",
    )
    add_operating(actions, command)
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

    _schedules(commands, command)
    _console(commands)
    executions = commands.add_parser(
        "executions", help="list, inspect, answer and cancel supervised executions"
    )
    actions = executions.add_subparsers(dest="action", required=True, metavar="ACTION")
    listed = command(
        actions,
        "list",
        "list executions by agent id (their status, step and plan)",
        executions_module.listing_command,
    )
    listed.add_argument(
        "--status", choices=sorted(RECORD_STATUSES), help="only executions so"
    )
    _paging(listed, "executions")
    listed.add_argument("--after", metavar="AGENT:ID", help="start after this key")
    listed.add_argument(
        "--agent", default="", metavar="PREFIX", help="only agent ids starting so"
    )
    show = command(
        actions,
        "show",
        "show one agent's execution: steps completed, pending approval, lease",
        executions_module.show,
    )
    show.add_argument("agent_id", help="the agent id (the execution's key)")
    for verb, meaning in (("approve", "approve"), ("reject", "reject")):
        answer = command(
            actions,
            verb,
            f"{meaning} the approval an execution waits for (through its inbox)",
            executions_module.approve,
            write=True,
        )
        answer.add_argument("agent_id", help="the agent id (the execution's key)")
        answer.add_argument(
            "--response",
            metavar="JSON",
            help="what the next step receives as Approval.response (or the reason)",
        )
    cancel = command(
        actions,
        "cancel",
        "cancel an execution (one running elsewhere cancels at its next heartbeat)",
        executions_module.cancel,
        write=True,
    )
    cancel.add_argument("agent_id", help="the agent id (the execution's key)")
    cancel.add_argument("--reason", help="saved with the execution")
    add_wait(cancel)
    resolve = command(
        actions,
        "resolve",
        "settle a recovery_required execution",
        executions_module.resolve,
        write=True,
    )
    resolve.add_argument("agent_id", help="the agent id (the execution's key)")
    resolve.add_argument(
        "resolution",
        choices=["adopt", "release"],
        help="adopt: the stored state is the truth; release: mark it failed",
    )
    return parser


def _schedules(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], command: Any
) -> None:
    """The ``schedules`` commands."""
    group = commands.add_parser(
        "schedules", help="list, pause, resume, trigger, backfill and delete schedules"
    )
    actions = group.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = command(
        actions,
        "list",
        "list schedules, ordered by id",
        schedules_module.schedules_list,
    )
    _paging(listing, "schedules")
    listing.add_argument("--after", metavar="ID", help="start after this schedule id")
    helps = {
        "show": "show one schedule: its fields, next ticks and instances",
        "pause": "stop handling its ticks (ticks due meanwhile are skipped)",
        "resume": "handle its ticks again, from the next one",
        "trigger": "start one instance now (a runtime serving its workflow does it)",
        "backfill": "start the instances of its ticks in a past range (once each)",
        "delete": "delete it (the instances it started stay)",
    }
    for action, help_text in helps.items():
        run = {
            "show": schedules_module.schedules_show,
            "delete": schedules_module.schedules_delete,
        }.get(action, schedules_module.schedules_edit)
        sub = command(actions, action, help_text, run, write=action != "show")
        sub.add_argument("id", help="the schedule id")
        if action == "pause":
            sub.add_argument("--note", help="why (kept with the schedule)")
        if action == "backfill":
            sub.add_argument(
                "--start", required=True, help="ISO 8601 time, with offset"
            )
            sub.add_argument("--end", required=True, help="ISO 8601 time (exclusive)")


def _console(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from phronomy.console._serve import add_arguments  # the console loads lazily

    add_arguments(commands.add_parser("console", help="serve the web console"))


def _paging(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--limit",
        type=_limit,
        default=100,
        help=f"at most this many {what}, up to {MAX_LIMIT} (default: %(default)s)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m phronomy``.

    Returns:
        The exit status: 0; 1 for an error (one line ``phronomy: error: ...`` on
        stderr); 2 for a usage error; 141 when stdout was closed early; 130 when
        interrupted.
    """
    args = build_parser().parse_args(argv)
    secrets = Secrets(args.db)  # a password in --db, whatever it names
    try:
        status = _run(args)
        sys.stdout.flush()  # here, not at exit: a closed pipe is reported below
    except BrokenPipeError:
        _discard_stdout()
        return EXIT_BROKEN_PIPE
    except PhronomyError as exc:
        return _error(exc, secrets)
    except OSError as exc:  # the output failing otherwise (a full disk)
        return _error(exc, secrets)
    except KeyboardInterrupt:
        return _error("interrupted", status=130)
    return status


def _run(args: argparse.Namespace) -> int:
    if args.command == "demo":
        trio.run(run_demo, args.db)
        return 0
    if args.command == "console":
        return int(args.run_console(args))
    store = _open(args)
    try:
        status: int = args.run(store, args)
    finally:
        store.close()
    return status


def _error(error: object, secrets: Secrets | None = None, *, status: int = 1) -> int:
    """Print *error* as one line on stderr (without the passwords of *secrets*)."""
    try:
        sys.stdout.flush()  # what was printed before comes first
    except OSError:
        _discard_stdout()
    text = safe(error) if secrets is None else secrets.redact(safe(error))
    print(f"phronomy: error: {text}", file=sys.stderr)
    return status


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so that the flush at exit cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is not a file (captured): nothing to flush
        pass
