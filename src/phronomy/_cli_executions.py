"""``python -m phronomy executions ...``: supervised executions in a store.

An execution is an instance ``agent:<agent_id>`` of its plan's generated workflow;
these commands read and change it as such (the ``instances`` commands leave it alone).
Answers and cancellations are stored for the runtime that serves the execution's
plan: it applies them (a live one at its next poll or heartbeat).
"""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Any

import msgspec

from phronomy._cli_commands import (
    _command,
    ask_cancel,
    lease_state,
    pending_events,
    pending_timers,
    write_cancellation,
)
from phronomy._cli_output import done, iso, json_line, print_view, safe, table
from phronomy._cli_store import lease_now as _lease_now
from phronomy.agent._records import (
    agent_key,
    answer_posting,
    execution_record,
    listing,
    run_listing,
)
from phronomy.errors import InstanceStateError, InvalidInputError, NotFoundError
from phronomy.storage import (
    PostOp,
    resolve_stored,
)

if TYPE_CHECKING:
    import argparse

    from phronomy._cli_store import CliStore
    from phronomy.agent import ExecutionRecord
    from phronomy.storage import StoredRecord

__all__ = ["approve", "cancel", "listing_command", "resolve", "show"]


def _row(store: CliStore, agent_id: str) -> tuple[StoredRecord, ExecutionRecord]:
    """The key's row and its record.

    Raises:
        NotFoundError: the key has no execution.
        InstanceStateError: the row under the key is a workflow instance.
    """
    row = store.load(agent_key(agent_id))
    if row is None:
        raise NotFoundError(f"agent {agent_id!r} has no execution record")
    return row, execution_record(row)


def _view(record: ExecutionRecord) -> dict[str, Any]:
    view: dict[str, Any] = msgspec.to_builtins(record)
    view["updated_at"] = iso(record.updated_at_ms)
    return view


def listing_command(store: CliStore, args: argparse.Namespace) -> int:
    """``executions list``: the executions in the store, by agent id (one page)."""
    page = run_listing(
        listing(
            status=args.status, after=args.after, limit=args.limit, prefix=args.agent
        ),
        store.run,
    )
    if args.json:
        for record in page.records:
            print(json_line(record, updated_at=record.updated_at_ms))
    else:
        table(
            ("AGENT", "STATUS", "STEP", "DONE", "PLAN", "UPDATED", "EXECUTION"),
            [
                (
                    safe(r.agent_id),
                    r.status,
                    "" if r.step is None else str(r.step),
                    str(r.steps_completed),
                    safe(r.plan),
                    iso(r.updated_at_ms) or "",
                    r.execution_id,
                )
                for r in page.records
            ],
        )
    if page.next_after is not None:
        more = _command(
            "executions", "list", "--db", args.db, "--after", page.next_after
        )
        print(f"next page: {more}", file=sys.stderr)
    return 0


def show(store: CliStore, args: argparse.Namespace) -> int:
    """``executions show``: one key's execution, its pending answers and its lease
    (a table; ``--json``: one JSON object)."""
    row, record = _row(store, args.agent_id)
    view = _view(record)
    view["lease"] = lease_state(row, _lease_now(store))
    view.update(pending_events(store, row))
    view["pending_timers"] = pending_timers(store, row.workflow_instance_id)
    print_view(args, view)
    return 0


def approve(store: CliStore, args: argparse.Namespace) -> int:
    """``executions approve`` / ``reject``: store the answer in the execution's inbox
    (the parser sets ``args.action``)."""
    _, record = _row(store, args.agent_id)
    if record.status != "suspended":
        raise InstanceStateError(
            f"agent {args.agent_id!r}'s execution is {record.status}, not waiting for "
            "an approval",
            instance_id=agent_key(args.agent_id),
        )
    try:
        response = None if args.response is None else json.loads(args.response)
    except json.JSONDecodeError as exc:
        raise InvalidInputError(f"--response must be JSON: {exc}") from None
    posting = answer_posting(
        args.agent_id,
        record.execution_id,
        approve=args.action == "approve",
        response=response,
    )
    posted = store.run(PostOp(posting=posting))
    if posted.outcome != "stored":
        raise InstanceStateError(
            f"agent {args.agent_id!r}'s execution took no answer ({posted.outcome})"
        )
    return done(
        args,
        f"{safe(args.agent_id)}: {posting.event} stored for execution "
        f"{record.execution_id} (a runtime that serves its plan applies it)",
        agent_id=args.agent_id,
        execution_id=record.execution_id,
        event=posting.event,
        event_id=posting.event_id,
    )


def cancel(store: CliStore, args: argparse.Namespace) -> int:
    """``executions cancel``: cancel a suspended execution, or ask the runtime that
    runs one to cancel it (at its next heartbeat, once its threads returned) and wait
    until the row says cancelled (``--no-wait``: return once asked).

    An execution that stops running meanwhile (it reached a checkpoint or an
    approval) is cancelled directly, as a suspended one.
    """
    key = agent_key(args.agent_id)
    row, record = _row(store, args.agent_id)
    deadline = time.monotonic() + args.wait
    while True:
        if row.status == "cancelled":
            return _cancelled(args, record, "cancelled")
        if row.status != "running" or row.lease_owner is None:
            write_cancellation(store, row, reason=args.reason)
        elif row.cancel_requested is None:  # asked again after each new claim
            until = None if args.no_wait else deadline
            if ask_cancel(store, key, reason=args.reason, until=until) and args.no_wait:
                return _cancelled(args, record, "cancel_requested")
        if time.monotonic() > deadline:
            raise InstanceStateError(
                f"agent {args.agent_id!r}'s execution is still {row.status} after "
                f"{args.wait} s; its runtime cancels it at its next heartbeat"
            )
        time.sleep(0.05)
        row, record = _row(store, args.agent_id)


def _cancelled(args: argparse.Namespace, record: ExecutionRecord, status: str) -> int:
    """Print that the execution is cancelled (or its runtime was asked to)."""
    text = (
        f"execution {record.execution_id} cancelled"
        if status == "cancelled"
        else "cancellation asked of its runtime"
    )
    return done(
        args,
        f"{safe(args.agent_id)}: {text}",
        agent_id=args.agent_id,
        execution_id=record.execution_id,
        status=status,
    )


def resolve(store: CliStore, args: argparse.Namespace) -> int:
    """``executions resolve``: settle a recovery_required execution."""
    _row(store, args.agent_id)
    resolved = resolve_stored(
        store, agent_key(args.agent_id), args.resolution, by="an operator (cli)"
    )
    return done(
        args,
        f"{safe(args.agent_id)}: recovery_required -> {resolved.status}",
        agent_id=args.agent_id,
        resolution=args.resolution,
        status=resolved.status,
        revision=resolved.revision,
        updated_at_ms=resolved.updated_at_ms,
        updated_at=iso(resolved.updated_at_ms),
    )
