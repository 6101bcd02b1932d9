"""The commands of ``python -m phronomy`` (each takes an open store and the arguments).

A command prints its result on stdout and returns the exit status; an error is raised
(a :class:`~phronomy.errors.PhronomyError`) and printed by :func:`phronomy.cli.main`.
"""

from __future__ import annotations

import json
import shlex
import time
from typing import TYPE_CHECKING, Any

import msgspec

from phronomy._cli_output import done, iso, json_line, print_view, safe, table
from phronomy._cli_store import is_dsn, lease_now as _lease_now
from phronomy._cli_times import moment_ms
from phronomy.durability import kind_of
from phronomy.engine import random_hex
from phronomy.errors import (
    InstanceStateError,
    InvalidInputError,
    NotFoundError,
    PhronomyError,
)
from phronomy.storage import (
    EXECUTION_KEY_PREFIX,
    SCHEMA_VERSION,
    InboxEntry,
    InboxOp,
    RequestCancelOp,
    SaveOp,
    StoredTimer,
    TimersOp,
    cancellation,
    decode_snapshot_builtins,
    is_execution_plan,
    resolve_stored,
)
from phronomy.storage._shortcuts import MAX_LIMIT
from phronomy.workflow._definition import AFTER_PREFIX, describe_delay

if TYPE_CHECKING:
    import argparse

    from phronomy._cli_store import CliStore
    from phronomy.storage import BaseStore, StoredRecord

SETTLING_S = 5
"""Seconds a halted instance's event may wait for a runtime's poll before ``instances
show`` says that no live runtime has taken it."""

__all__ = [
    "lease_state",
    "listing",
    "migrate",
    "resolve",
    "show",
    "write_cancellation",
]


def _command(*words: str) -> str:
    return "`python -m phronomy " + " ".join(shlex.quote(w) for w in words) + "`"


# --- instances -------------------------------------------------------------------------


def _expiry_ms(
    record: StoredRecord, lease_now_ms: int | None, wall_now: int | None = None
) -> int:
    """The wall-clock time the lease expires at (leases are kept on the store's lease
    clock, *lease_now_ms* now; ``None``: written before this machine restarted), with
    the wall clock at *wall_now* (default: now)."""
    if wall_now is None:
        wall_now = time.time_ns() // 1_000_000
    if lease_now_ms is None:
        return wall_now
    return wall_now + (record.lease_expires_at_ms or 0) - lease_now_ms


def lease_state(
    record: StoredRecord, lease_now_ms: int | None, wall_now: int | None = None
) -> str:
    """Who holds the instance's lease, until when, and whether it is live, in words
    (*lease_now_ms*: :meth:`~phronomy.SQLiteStore.lease_now_ms`; *wall_now*: as for
    the expiry time printed beside it)."""
    if record.lease_owner is None:
        return "none (no runtime runs it)"
    held = f"epoch {record.lease_epoch}, owner {safe(record.lease_owner)}"
    if lease_now_ms is None:
        return (
            f"expired ({held}): written before this machine restarted; a runtime's "
            "recovery sweep puts it back at its last saved revision"
        )
    until = _expiry_ms(record, lease_now_ms, wall_now)
    left = ((record.lease_expires_at_ms or 0) - lease_now_ms) / 1000
    if left > 0:
        return f"live until {iso(until)}, {left:.1f} s from now ({held})"
    return (
        f"expired at {iso(until)}, {-left:.1f} s ago ({held}): its runtime stopped; a "
        "runtime's recovery sweep puts it back at its last saved revision"
    )


def _lease_cell(record: StoredRecord, lease_now_ms: int | None) -> str:
    if record.lease_owner is None:
        return "-"
    until = _expiry_ms(record, lease_now_ms)
    state = "live until" if _live(record, lease_now_ms) else "expired at"
    return (
        f"{state} {iso(until)} (owner {safe(record.lease_owner)}, "
        f"epoch {record.lease_epoch})"
    )


def _live(record: StoredRecord, lease_now_ms: int | None) -> bool:
    return lease_now_ms is not None and (record.lease_expires_at_ms or 0) > lease_now_ms


def _workflow_record(store: CliStore, args: argparse.Namespace) -> StoredRecord:
    """The row of the workflow instance ``args.id``; an execution record is refused.

    Raises:
        NotFoundError: nothing is stored under the id.
        InvalidInputError: the id is a supervised execution's record.
    """
    iid: str = args.id
    record = store.load(iid)
    if record is None:
        raise NotFoundError(f"workflow instance {iid!r} does not exist in {args.db!r}")
    if kind_of(record) == "execution":
        agent = iid.removeprefix(EXECUTION_KEY_PREFIX)
        look = _command("executions", "show", "--db", args.db, agent)
        raise InvalidInputError(
            f"{iid!r} is the record of a supervised execution (agent {agent!r}), not "
            f"a workflow instance; see {look}"
        )
    return record


def _workflow_page(
    store: CliStore, args: argparse.Namespace
) -> tuple[list[StoredRecord], str | None]:
    """Up to ``args.limit`` workflow rows after ``args.after``, and the next ``--after``.

    Execution records share the table; they are skipped, and pages are read until
    this one is full or the table ends (one row more tells whether a next page exists).
    """
    wanted: int = args.limit
    fetch = min(MAX_LIMIT, max(wanted + 1, 500))
    since, until = _window(store, args)
    found: list[StoredRecord] = []
    after: str | None = args.after
    while True:
        page = store.list_instances(
            status=args.status, workflow=args.workflow, limit=fetch, after=after
        )
        for record in page.records:
            if kind_of(record) == "workflow" and since <= record.updated_at_ms < until:
                found.append(record)
                if len(found) > wanted:
                    return found[:wanted], found[wanted - 1].workflow_instance_id
        if page.next_after is None:
            return found, None
        after = page.next_after


def _window(store: CliStore, args: argparse.Namespace) -> tuple[int | float, ...]:
    """``--since`` and ``--until`` of ``instances list``, in wall-clock ms."""
    since = getattr(args, "since", None)
    until = getattr(args, "until", None)
    now = store.wall_now_ms()
    return (
        -float("inf") if since is None else moment_ms(since, "--since", now),
        float("inf") if until is None else moment_ms(until, "--until", now),
    )


def listing(store: CliStore, args: argparse.Namespace) -> int:
    """``instances list``: a table (or JSON objects) of instances, then the next page."""
    if args.workflow is not None and is_execution_plan(args.workflow):
        raise InvalidInputError(
            f"{args.workflow!r} rows are supervised executions, not workflow "
            f"instances; use {_command('executions', 'list', '--db', args.db)}"
        )
    records, next_after = _workflow_page(store, args)
    lease_now = _lease_now(store)
    if args.json:
        for r in records:
            print(
                json_line(
                    r,
                    updated_at=r.updated_at_ms,
                    lease_expires_at=_expiry_ms(r, lease_now)
                    if r.lease_owner
                    else None,
                )
            )
        if next_after is not None:
            print(json.dumps({"next_after": next_after}))
        return 0
    table(
        ("ID", "WORKFLOW", "STATUS", "REV", "PHASE", "UPDATED", "LEASE", "DETAIL"),
        [
            (
                safe(r.workflow_instance_id),
                safe(r.workflow),
                r.status,
                str(r.revision),
                safe(r.phase or ""),
                iso(r.updated_at_ms) or "",
                _lease_cell(r, lease_now),
                safe(r.detail or ""),
            )
            for r in records
        ],
    )
    if any(r.lease_owner is not None and not _live(r, lease_now) for r in records):
        why = (
            "written before this machine restarted"
            if lease_now is None
            else "its runtime stopped"
        )
        print(
            f"expired lease: {why}; a runtime's recovery sweep puts the instance back "
            "at its last saved revision"
        )
    if next_after is not None:
        print(f"... more: add --after {shlex.quote(safe(next_after))}")
    return 0


def pending_events(store: CliStore, record: StoredRecord) -> dict[str, Any]:
    """The instance's pending events, and (if any) who applies them."""
    pending = store.run(
        InboxOp(workflow_instance_id=record.workflow_instance_id, limit=MAX_LIMIT)
    )
    view: dict[str, Any] = {
        "pending_events": [
            {
                "seq": e.seq,
                "event": e.event,
                "event_id": e.event_id,
                "stored_at": iso(e.stored_at_ms),
            }
            for e in pending
        ]
    }
    if pending:
        live = _live(record, _lease_now(store))
        view["pending_events_note"] = _who_applies(record, pending[0], live=live)
    return view


def pending_timers(store: CliStore, workflow_instance_id: str) -> list[Any]:
    """The instance's armed timers, soonest first."""
    timers = store.run(TimersOp(workflow_instance_id=workflow_instance_id))
    return [timer_view(t) for t in timers]


def timer_view(timer: StoredTimer) -> dict[str, Any]:
    """An armed timer as ``instances show`` and ``history --json`` print it."""
    return {
        "kind": "timer",
        "status": "armed",
        "name": timer.name,
        "timer_kind": timer.kind,
        "event": event_name(timer.event, timer.state),
        "state": timer.state,
        "due_at": iso(timer.due_at_ms),
        "armed_revision": timer.armed_revision,
        "armed_at": iso(timer.armed_at_ms),
    }


def event_name(event: str, state: str | None) -> str:
    """A timeout's event as people read it: ``after 2d (awaiting)``."""
    if not event.startswith(AFTER_PREFIX):
        return event
    ms = event[len(AFTER_PREFIX) :].removesuffix("ms__")
    delay = describe_delay(int(ms)) if ms.isdigit() else ms
    return f"after {delay}" + (f" ({state})" if state else "")


def _who_applies(record: StoredRecord, oldest: InboxEntry, *, live: bool) -> str:
    workflow = safe(record.workflow)
    owner = safe(record.lease_owner or "")
    if record.lease_owner and live:
        return f"the runtime holding the instance ({owner}) applies them"
    if record.lease_owner:
        return (
            f"the lease of {owner} expired: a live runtime's recovery sweep puts the "
            f"instance back, then a runtime that serves workflow {workflow!r} applies "
            "them"
        )
    if record.status != "halted":
        return (
            f"the instance is {record.status}: no runtime applies its events until "
            "it is resumed"
        )
    waited = time.time() - oldest.stored_at_ms / 1000
    if waited < SETTLING_S:
        return (
            f"a runtime that serves workflow {workflow!r} applies them at its next poll"
        )
    return (
        f"no live runtime serves workflow {workflow!r}: the oldest has waited "
        f"{waited:.0f} s; a runtime opened with open_runtime(workflows=[...]) that "
        "includes it applies them"
    )


def show(store: CliStore, args: argparse.Namespace) -> int:
    """``instances show``: the row, its lease, stored fields, pending events and
    timers (a table; ``--json``: one JSON object)."""
    record = _workflow_record(store, args)
    view: dict[str, Any] = msgspec.to_builtins(
        msgspec.structs.replace(record, snapshot=None)
    )
    lease_now = _lease_now(store)
    wall_now = time.time_ns() // 1_000_000  # one reading: both say the same time
    view["updated_at"] = iso(record.updated_at_ms)
    view["lease_expires_at"] = (
        iso(_expiry_ms(record, lease_now, wall_now)) if record.lease_owner else None
    )
    view["lease"] = lease_state(record, lease_now, wall_now)
    error: PhronomyError | None = None
    if record.snapshot is not None:
        try:
            decoded = decode_snapshot_builtins(
                record.snapshot, workflow_instance_id=args.id, revision=record.revision
            )
        except PhronomyError as exc:  # a corrupt row: show what is readable
            view["snapshot_error"] = str(exc)
            error = exc
        else:
            view["fields"] = decoded.fields
    view.update(pending_events(store, record))
    view["pending_timers"] = pending_timers(store, record.workflow_instance_id)
    print_view(args, view, hide=("snapshot",))
    if error is not None:
        raise error
    return 0


def write_cancellation(
    store: CliStore,
    record: StoredRecord,
    *,
    reason: str | None,
    force: bool = False,
) -> bool:
    """Write the cancelled revision of *record* (an instance nobody runs).

    Returns:
        Whether it was written (``False``: it is cancelled already).

    Raises:
        PhronomyError: the row changed meanwhile (nothing was written).
        InstanceStateError: see :func:`~phronomy.storage.cancellation`.
    """
    iid = record.workflow_instance_id
    op = cancellation(record, iid, reason=reason, write_id=random_hex(), force=force)
    if op is None:
        return False
    if isinstance(op, SaveOp):
        store.save(op.request)
    elif not store.run(op):
        raise PhronomyError(f"{iid!r} changed meanwhile; cancel it again")
    return True


ASK_PATIENCE = 5.0
"""Seconds a cancel request is asked again while other transactions write the row,
when its caller gives no deadline of its own."""


def ask_cancel(
    store: BaseStore[Any], key: str, *, reason: str | None, until: float | None = None
) -> bool | None:
    """Ask the runtime holding *key*'s lease to cancel it, through its row (that
    runtime cancels it at its next heartbeat; the recovery sweep, once the lease
    expired), asking again while another transaction writes the row: until *until*
    (a :func:`time.monotonic` time), else for :data:`ASK_PATIENCE` seconds.

    Returns:
        ``True`` once the request is in the row; ``False`` if *key* is not running
        under a lease any more (read it again); ``None`` if another transaction was
        still writing the row at *until* (nothing was asked).

    Raises:
        InstanceStateError: without *until*, the row was being written for
            :data:`ASK_PATIENCE` seconds (nothing was asked).
    """
    deadline = time.monotonic() + ASK_PATIENCE if until is None else until
    op = RequestCancelOp(workflow_instance_id=key, reason=reason)
    while (asked := store.run(op)) is not None and not asked[1]:
        if time.monotonic() <= deadline:
            time.sleep(0.01)
        elif until is not None:
            return None
        else:
            raise InstanceStateError(
                f"{key!r}: another transaction kept writing its row for "
                f"{ASK_PATIENCE} s; nothing was asked (ask again)",
                instance_id=key,
            )
    return asked is not None


def migrate(store: CliStore, args: argparse.Namespace) -> int:
    """``migrate``: opening the file for writing migrated it; say so."""
    from phronomy.storage._postgres_schema import SCHEMA_VERSION as POSTGRES_VERSION

    version = POSTGRES_VERSION if is_dsn(args.db) else SCHEMA_VERSION
    text = f"{safe(args.db)}: schema version {version}"
    return done(args, text, db=args.db, schema_version=version)


def resolve(store: CliStore, args: argparse.Namespace) -> int:
    """``instances resolve``: settle a recovery_required instance."""
    _workflow_record(store, args)
    record = resolve_stored(store, args.id, args.resolution, by="an operator (cli)")
    return done(
        args,
        f"{safe(args.id)}: recovery_required -> {record.status}",
        id=args.id,
        resolution=args.resolution,
        status=record.status,
        revision=record.revision,
        updated_at_ms=record.updated_at_ms,
        updated_at=iso(record.updated_at_ms),
    )
