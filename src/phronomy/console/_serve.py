"""Serving the console: the store opener, ``--app`` definitions, and hypercorn on trio.

``python -m phronomy console --db PATH_OR_DSN [--schema NAME] [--host H] [--port N]
[--app M:ATTR]... [--allow-actions [--token-file PATH | --token TOKEN]]``; the token
may come from ``PHRONOMY_CONSOLE_TOKEN`` instead (then no other process sees it on
the command line).
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from phronomy._cli_store import is_dsn, open_store
from phronomy.errors import InvalidInputError, StoreUnavailableError
from phronomy.workflow import WorkflowDefinition

from ._app import ACTION_WAIT, LOOPBACK_HOSTS, ConsoleApp

if TYPE_CHECKING:
    import argparse

    from phronomy.storage import BaseStore

__all__ = [
    "TOKEN_ENV",
    "console_token",
    "load_definitions",
    "open_console_store",
    "run_console",
    "serve_console",
]

DEFAULT_PORT = 8470
TOKEN_ENV = "PHRONOMY_CONSOLE_TOKEN"  # noqa: S105 - a variable's name, not a secret
"""The environment variable the actions' token is read from when neither
``--token-file`` nor ``--token`` gives it."""


def open_console_store(
    db: str, *, read_only: bool, schema: str | None = None
) -> BaseStore[Any]:
    """The store named by *db* (an SQLite file or a ``postgresql://`` DSN), open, as
    the command line opens it: never created or migrated; read-only (SQLite: a
    read-only connection; PostgreSQL: read-only sessions) unless *read_only* is false.
    *schema* is the PostgreSQL schema (default: the DSN's ``search_path``, else
    ``public``). An SQLite write waits at most ``ACTION_WAIT`` seconds for a lock
    another process holds.

    Raises:
        StoreUnavailableError: the file does not exist, is not a file, or cannot be
            opened, the database holds no phronomy schema, or the server cannot be
            reached (the message shows no password).
        InvalidInputError: an invalid schema name.
    """
    if not is_dsn(db):  # the actions' store too
        if not os.path.exists(db):
            raise StoreUnavailableError(
                f"SQLite database {db!r} does not exist (check the path)", path=db
            )
        if not os.path.isfile(db):
            raise StoreUnavailableError(
                f"SQLite database {db!r} is not a file (check the path)", path=db
            )
    return open_store(db, read_only=read_only, schema=schema, busy_timeout=ACTION_WAIT)


def load_definitions(specs: Iterable[str]) -> list[WorkflowDefinition[Any]]:
    """The workflow definitions named by ``module:attr`` specs.

    The attribute may be a :class:`~phronomy.WorkflowDefinition`, a callable taking
    no argument that returns one (an example's ``build``), or an iterable or mapping
    of them.

    Raises:
        InvalidInputError: a spec is malformed, its module or attribute is missing,
            or it holds no definition.
    """
    found: list[WorkflowDefinition[Any]] = []
    for spec in specs:
        module_name, _, attr = spec.partition(":")
        if not module_name or not attr:
            raise InvalidInputError(f"--app {spec!r} must be module:attribute")
        if "" not in sys.path and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())  # as `python -m` does: the current dir
        try:
            value: Any = importlib.import_module(module_name)
            for part in attr.split("."):
                value = getattr(value, part)
        except (ImportError, AttributeError) as exc:
            raise InvalidInputError(f"--app {spec!r}: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - the module fails: one line
            raise InvalidInputError(
                f"--app {spec!r}: importing {module_name!r} failed: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        if callable(value) and not isinstance(value, WorkflowDefinition):
            try:
                value = value()
            except Exception as exc:  # noqa: BLE001 - one line, not a trace
                raise InvalidInputError(
                    f"--app {spec!r}: calling {attr!r} failed: "
                    f"{type(exc).__name__}: {exc}"
                ) from None
        if isinstance(value, WorkflowDefinition):
            value = [value]
        elif isinstance(value, Mapping):
            value = list(value.values())
        items = list(value) if isinstance(value, Iterable) else [value]
        if not items or not all(isinstance(d, WorkflowDefinition) for d in items):
            raise InvalidInputError(f"--app {spec!r} holds no workflow definition")
        found.extend(items)
    return found


async def serve_console(  # noqa: ASYNC114, ASYNC128 - hypercorn calls started()
    app: ConsoleApp,
    *,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve *app* with hypercorn on trio until cancelled.

    Args:
        app: the console.
        host: the interface to listen on.
        port: the port (0: a free one; the started value tells which).
        task_status: started with the URLs listened on.

    Raises:
        ImportError: hypercorn is not installed (``pip install phronomy[console]``).
        OSError: the address cannot be bound (a port in use, a host name that does
            not resolve or is not this machine's), found before serving. Should
            another process take the port in between, hypercorn's OSError arrives
            in an ``ExceptionGroup`` (it binds in a nursery of its own).

    Cancellation:
        Cancelling it stops the server (requests under way are cut off).
    """
    from hypercorn.config import Config
    from hypercorn.trio import serve

    _check_bind(host, port)
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = 1.0
    await serve(app, config, task_status=task_status, mode="asgi")  # type: ignore[arg-type]


def _check_bind(host: str, port: int) -> None:
    """Bind and close a socket as hypercorn will (``SO_REUSEADDR``): an address it
    cannot bind fails here as one :class:`OSError`, no socket left behind."""
    for family, kind, proto, _, address in socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM
    ):
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
        return


def run_console(args: argparse.Namespace) -> int:
    """``python -m phronomy console``: serve the console until interrupted (Ctrl-C:
    status 130) or terminated (SIGTERM: status 0), then close the store."""
    try:
        import hypercorn  # noqa: F401
    except ImportError:
        raise InvalidInputError(
            "the console needs hypercorn: pip install 'phronomy[console]'"
        ) from None
    if not 0 <= args.port <= 65535:
        raise InvalidInputError(f"--port must be from 0 to 65535, got {args.port}")
    token = console_token(args)
    definitions = load_definitions(args.app or ())
    store = open_console_store(
        args.db, read_only=not args.allow_actions, schema=args.schema
    )
    _log_to_stderr()
    try:
        loopback = args.host in LOOPBACK_HOSTS or args.host.startswith("127.")
        app = ConsoleApp(
            store,
            definitions=definitions,
            allow_actions=args.allow_actions,
            token=token,
            allowed_hosts=(LOOPBACK_HOSTS | {args.host}) if loopback else None,
        )
        if args.allow_actions and not loopback:
            print(
                f"phronomy: warning: actions are enabled on {args.host!r}, not a "
                "loopback interface: the token and every action travel over plain "
                "HTTP, readable on the network (put a TLS proxy in front, or listen "
                "on 127.0.0.1)",
                file=sys.stderr,
                flush=True,
            )

        async def main() -> None:
            async with trio.open_nursery() as nursery:
                urls = await nursery.start(
                    lambda task_status: serve_console(
                        app, host=args.host, port=args.port, task_status=task_status
                    )
                )
                mode = "actions enabled" if args.allow_actions else "read-only"
                print(f"phronomy console ({mode}) on {' '.join(urls)}", flush=True)
                with trio.open_signal_receiver(signal.SIGTERM) as signals:
                    async for _ in signals:  # stop serving; the store is closed
                        nursery.cancel_scope.cancel()

        try:
            trio.run(main)
        except* OSError as group:
            first = group.exceptions[0]
            reason = first.strerror if isinstance(first, OSError) else None
            raise InvalidInputError(
                f"cannot listen on {args.host!r} port {args.port}: {reason or first}"
            ) from None
    finally:
        store.close()
    return 0


def console_token(args: argparse.Namespace) -> str | None:
    """The actions' token: ``--token-file``'s first line, ``--token``, or else
    ``PHRONOMY_CONSOLE_TOKEN`` (``None`` without ``--allow-actions``).

    Raises:
        InvalidInputError: ``--allow-actions`` without a token, a token option
            without ``--allow-actions``, both options, or a token file that cannot be
            read or is empty.
    """
    if args.token is not None and args.token_file is not None:
        raise InvalidInputError("give --token-file or --token, not both")
    given = "--token" if args.token_file is None else "--token-file"
    if not args.allow_actions:
        if args.token is not None or args.token_file is not None:
            raise InvalidInputError(
                f"{given} is for actions: give --allow-actions too (or drop {given})"
            )
        return None  # TOKEN_ENV set for another console: not an error
    if args.token_file is not None:
        try:
            text = Path(args.token_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8"
            raise InvalidInputError(
                f"--token-file {args.token_file!r} cannot be read: {reason or exc}"
            ) from None
        lines = text.strip().splitlines()
        if not lines:
            raise InvalidInputError(f"--token-file {args.token_file!r} is empty")
        return lines[0].strip()
    token: str | None = args.token or os.environ.get(TOKEN_ENV) or None
    if token is None:
        raise InvalidInputError(
            f"--allow-actions needs a token (8 characters or more): --token-file "
            f"PATH, the environment variable {TOKEN_ENV}, or --token"
        )
    return token


def _log_to_stderr() -> None:
    """Let the console's errors (a 500's traceback) reach stderr: the library's own
    loggers have no handler of their own."""
    console_log = logging.getLogger("phronomy.console")
    if not console_log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        console_log.addHandler(handler)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``console`` command's arguments (its ``run_console`` default runs it)."""
    parser.description = (
        "Serve the web console (instances, executions, schedules; read-only unless "
        "--allow-actions) on trio with hypercorn (pip install 'phronomy[console]')."
    )
    parser.add_argument(
        "--db",
        required=True,
        metavar="PATH_OR_DSN",
        help="an existing SQLite database, or a postgresql:// DSN",
    )
    parser.add_argument(
        "--schema",
        help="the PostgreSQL schema (default: the DSN's search_path, else public)",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="the interface (default: %(default)s)"
    )
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help="default: %(default)s"
    )
    parser.add_argument(
        "--app",
        action="append",
        metavar="MODULE:ATTR",
        help="workflow definitions to draw (a definition, a function returning one, "
        "or a list of them); repeatable",
    )
    parser.add_argument(
        "--allow-actions",
        action="store_true",
        help="enable send, cancel, retry, approve and reject (behind the token and "
        "CSRF checks)",
    )
    parser.add_argument(
        "--token-file",
        metavar="PATH",
        help="a file whose first line is the secret actions need (8 characters or "
        f"more); else --token, else the environment variable {TOKEN_ENV}",
    )
    parser.add_argument(
        "--token",
        help="the secret actions need (visible to other processes: prefer "
        f"--token-file or {TOKEN_ENV})",
    )
    parser.set_defaults(run_console=run_console)
