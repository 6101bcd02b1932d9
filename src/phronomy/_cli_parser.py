"""The parser of the ``instances`` commands that operate instances: ``cancel``,
``retry``, ``fork``, ``purge`` and ``terminate``, and ``list``'s time filters."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from phronomy import _cli_operate as operate, _cli_start as start_module
from phronomy.storage._retention import CLOSED_STATUSES

if TYPE_CHECKING:
    import argparse

__all__ = ["add_operating", "add_time_filters", "add_wait"]


def add_wait(cancel: argparse.ArgumentParser) -> None:
    """A cancel command's ``--wait SECONDS`` and ``--no-wait``."""
    cancel.add_argument(
        "--wait",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how long to wait for a running one (default: %(default)s)",
    )
    cancel.add_argument(
        "--no-wait", action="store_true", help="return once its runtime was asked"
    )


def add_time_filters(listing: argparse.ArgumentParser) -> None:
    """``--since`` and ``--until`` of ``instances list``."""
    for option, side in (("--since", "at or after"), ("--until", "before")):
        listing.add_argument(
            option,
            metavar="TIME",
            help=f"only instances last changed {side} TIME: ISO 8601 with an offset "
            "(2026-12-01T09:00:00Z) or a duration ago (7d, 12h, 30m)",
        )


def add_operating(actions: Any, command: Any) -> None:
    """The operating ``instances`` commands (*command* adds one, with ``--db``)."""
    start = command(
        actions,
        "start",
        "start an instance: imports the workflow's definition from your code and runs "
        "its first segment in this process (until it halts or finishes)",
        start_module.start,
        write=True,
    )
    start.add_argument(
        "workflow", metavar="WORKFLOW", help="the definition, as module:attribute"
    )
    start.add_argument("id", help="the new instance's id")
    start.add_argument("--input", metavar="JSON", help="the state's fields (an object)")
    cancel = command(
        actions,
        "cancel",
        "cancel an instance: one nobody runs at once (a cancelled revision), one a "
        "live runtime runs through its row (it cancels at its next heartbeat)",
        operate.cancel,
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
    add_wait(cancel)
    terminate = command(
        actions,
        "terminate",
        "DANGEROUS: close an instance now, whoever runs it, without waiting (its "
        "runtime's next write is refused; its effects are not undone)",
        operate.terminate,
        write=True,
    )
    terminate.add_argument("id", help="the workflow instance id")
    terminate.add_argument("--reason", help="why (saved with the instance)")
    terminate.add_argument(
        "--status",
        choices=["cancelled", "failed"],
        default="cancelled",
        help="the status it ends with (failed: it may be retried; default: "
        "%(default)s)",
    )
    retry = command(
        actions,
        "retry",
        "restart a failed instance from its last saved revision (a runtime serving "
        "its workflow applies the failed event again)",
        operate.retry,
        write=True,
    )
    retry.add_argument("id", help="the workflow instance id")
    fork = command(
        actions,
        "fork",
        "start a new instance with the state and phase of a stored revision",
        operate.fork,
        write=True,
    )
    fork.add_argument("id", help="the workflow instance to fork")
    fork.add_argument("--new-id", required=True, help="the new instance's id")
    fork.add_argument(
        "--revision",
        type=int,
        metavar="N",
        help="the revision to fork: the current one (default) or any in its history",
    )
    fork.add_argument(
        "--app",
        metavar="MODULE:ATTR",
        help="the instance's workflow definition in your code: the fork arms its "
        "state's timeouts from it (default: those the source has armed at that state)",
    )
    purge = command(
        actions,
        "purge",
        "delete closed instances (finished, cancelled) with their history, inbox and "
        "timers",
        operate.purge,
        write=True,
    )
    purge.add_argument(
        "--older-than",
        required=True,
        metavar="DURATION",
        help="only those last changed longer ago than this (7d, 12h, 30m, 0s)",
    )
    purge.add_argument(
        "--status", choices=CLOSED_STATUSES, help="only this status (default: both)"
    )
    purge.add_argument("--workflow", help="only instances of this workflow")
    purge.add_argument(
        "--limit",
        type=int,
        default=10_000,
        help="at most this many (default: %(default)s)",
    )
    purge.add_argument(
        "--dry-run", action="store_true", help="list them, delete nothing"
    )
