"""The commands of ``python -m phronomy`` (each takes an open store and the arguments)."""

from __future__ import annotations

import json
import re
import sys
from typing import TYPE_CHECKING, Any

import msgspec

from phronomy.agent._records import (
    agent_key,
    decode_record,
    resolve_record,
    stale_records,
)
from phronomy.engine import random_hex
from phronomy.errors import PhronomyError
from phronomy.storage import (
    SCHEMA_VERSION,
    SaveOp,
    cancellation,
    decode_snapshot_builtins,
    resolve_stored,
)

if TYPE_CHECKING:
    import argparse

    from phronomy.storage import SQLiteStore, StoredRecord

__all__ = [
    "cancel",
    "executions_list",
    "executions_resolve",
    "executions_show",
    "history",
    "lease_state",
    "listing",
    "migrate",
    "resolve",
    "safe",
    "show",
]

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def safe(value: object) -> str:
    """*value* as one line of text: control characters (tabs, newlines) escaped."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))


def _json(value: Any) -> str:
    return json.dumps(msgspec.to_builtins(value), sort_keys=True)


# --- instances -------------------------------------------------------------------------


def lease_state(record: StoredRecord, lease_now_ms: int | None) -> str:
    """Who holds the instance's lease and whether it is live, in words (*lease_now_ms*:
    :meth:`~phronomy.SQLiteStore.lease_now_ms`)."""
    if record.lease_owner is None:
        return "none (no runtime runs it)"
    held = f"epoch {record.lease_epoch}, owner {safe(record.lease_owner)}"
    if lease_now_ms is None:
        return (
            f"expired ({held}): written before this machine restarted; a runtime's "
            "recovery sweep puts it back at its last saved revision"
        )
    left = ((record.lease_expires_at_ms or 0) - lease_now_ms) / 1000
    if left > 0:
        return f"live for {left:.1f} s more ({held})"
    return (
        f"expired {-left:.1f} s ago ({held}): its runtime stopped; a runtime's "
        "recovery sweep puts it back at its last saved revision"
    )


def listing(store: SQLiteStore, args: argparse.Namespace) -> int:
    """``instances list``: one line (or JSON object) per instance, then the next page."""
    page = store.list_instances(
        status=args.status, workflow=args.workflow, limit=args.limit, after=args.after
    )
    lease_now = store.lease_now_ms()
    for r in page.records:
        if args.json:
            print(_json(r))
            continue
        detail = f"  ({safe(r.detail)})" if r.detail else ""
        lease = f"\tlease: {lease_state(r, lease_now)}" if r.lease_owner else ""
        print(
            f"{safe(r.workflow_instance_id)}\t{safe(r.workflow)}\t{r.status}\t"
            f"rev {r.revision}\t{safe(r.phase or '-')}{lease}{detail}"
        )
    if page.next_after is not None:
        if args.json:
            print(_json({"next_after": page.next_after}))
        else:
            print(f"... more: add --after {safe(page.next_after)}")
    return 0


def show(store: SQLiteStore, args: argparse.Namespace) -> int:
    """``instances show``: the row and its stored fields, as JSON."""
    record = store.load(args.id)
    if record is None:
        print(f"phronomy: no instance {safe(args.id)}", file=sys.stderr)
        return 1
    view: dict[str, Any] = msgspec.to_builtins(
        msgspec.structs.replace(record, snapshot=None)
    )
    view["lease"] = lease_state(record, store.lease_now_ms())
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


def history(store: SQLiteStore, args: argparse.Namespace) -> int:
    """``instances history``: the instance's last saves, newest first."""
    entries = store.history(args.id, limit=args.limit)
    if not entries and store.load(args.id) is None:
        print(f"phronomy: no instance {safe(args.id)}", file=sys.stderr)
        return 1
    for e in entries:
        if args.json:
            print(_json(e))
            continue
        detail = f"  ({safe(e.detail)})" if e.detail else ""
        print(
            f"rev {e.revision}\t{e.status}\t{safe(e.phase or '-')}\t"
            f"{e.committed_at_ms}\t{safe(e.write_id)}\t"
            f"{safe(e.definition_version or '-')}{detail}"
        )
    return 0


def cancel(store: SQLiteStore, args: argparse.Namespace) -> int:
    """``instances cancel``: a cancelled revision of a stored instance (not live)."""
    op = cancellation(
        store.load(args.id),
        args.id,
        reason=args.reason,
        write_id=random_hex(),
        force=args.force,
    )
    if op is None:
        print(f"{safe(args.id)}: already cancelled")
        return 0
    if isinstance(op, SaveOp):
        store.save(op.request)
    elif not store.run(op):
        raise PhronomyError(f"{args.id!r} changed meanwhile; cancel it again")
    record = store.load(args.id)
    assert record is not None
    print(f"{safe(args.id)}: cancelled at revision {record.revision}")
    return 0


def migrate(store: SQLiteStore, args: argparse.Namespace) -> int:
    """``migrate``: opening the file for writing migrated it; say so."""
    print(f"{safe(args.db)}: schema version {SCHEMA_VERSION}")
    return 0


def resolve(store: SQLiteStore, args: argparse.Namespace) -> int:
    """``instances resolve``: settle a recovery_required instance."""
    record = resolve_stored(store, args.id, args.resolution, by="an operator (cli)")
    print(f"{safe(args.id)}: recovery_required -> {record.status}")
    return 0


# --- executions ------------------------------------------------------------------------


def executions_list(store: SQLiteStore, args: argparse.Namespace) -> int:
    """``executions list``: stale execution records."""
    for stale in stale_records(store):
        if args.json:
            print(_json(stale))
            continue
        detail = f"  ({safe(stale.detail)})" if stale.detail else ""
        print(
            f"{safe(stale.agent_id)}\t{safe(stale.execution_id or '-')}\t"
            f"{stale.status}\tsteps {stale.steps_completed}{detail}"
        )
    return 0


def executions_show(store: SQLiteStore, args: argparse.Namespace) -> int:
    """``executions show``: one agent's record, as JSON."""
    row, record = decode_record(store.load(agent_key(args.agent_id)))
    if row is None:
        print(
            f"phronomy: no execution record for {safe(args.agent_id)}", file=sys.stderr
        )
        return 1
    view: dict[str, Any] = msgspec.to_builtins(
        msgspec.structs.replace(row, snapshot=None)
    )
    view["record"] = msgspec.to_builtins(record)
    print(json.dumps(view, indent=2, sort_keys=True))
    return 0


def executions_resolve(store: SQLiteStore, args: argparse.Namespace) -> int:
    """``executions resolve``: close a stale record."""
    record = resolve_record(
        store, args.agent_id, args.resolution, by="an operator (cli)"
    )
    assert record is not None
    print(f"{safe(args.agent_id)}: execution record -> {record.status}")
    return 0
