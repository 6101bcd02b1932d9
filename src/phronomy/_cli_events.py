"""The command line's inbox commands: ``instances send`` and ``instances history``
(saves, events, and timers armed or fired)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import msgspec

from phronomy._cli_commands import _workflow_record, event_name, timer_view
from phronomy._cli_output import iso, safe, table
from phronomy.engine import random_uuid
from phronomy.errors import InstanceStateError, InvalidInputError
from phronomy.storage import (
    InboxEntry,
    InboxOp,
    Posting,
    PostOp,
    StoredTimer,
    Takeover,
    TakeoversOp,
    TimersOp,
    fired_timer,
    validate_event_id,
)
from phronomy.workflow._inbox import encode_payload
from phronomy.workflow._inbox_client import interleave

if TYPE_CHECKING:
    import argparse

    from phronomy._cli_store import CliStore
    from phronomy.storage import SaveLogEntry

__all__ = ["history", "send"]


def send(store: CliStore, args: argparse.Namespace) -> int:
    """``instances send``: store an event in the instance's inbox; the runtime that
    runs the instance, or one that serves its workflow, applies it."""
    record = _workflow_record(store, args)
    try:
        payload = None if args.payload is None else json.loads(args.payload)
    except json.JSONDecodeError as exc:
        raise InvalidInputError(f"--payload is not JSON: {exc}") from None
    if not args.event:
        raise InvalidInputError("the event's name must not be empty")
    event_id = random_uuid() if args.event_id is None else args.event_id
    posting = Posting(
        workflow_instance_id=args.id,
        event_id=validate_event_id(event_id),
        event=args.event,
        payload=encode_payload(payload, event=args.event, instance=args.id),
    )
    posted = store.run(PostOp(posting=posting))
    entry = posted.entry
    if posted.outcome == "mismatch":
        assert entry is not None
        raise InvalidInputError(
            f"event id {event_id!r} of {args.id!r} names another event "
            f"({entry.event!r}, seq {entry.seq}); an event id names one event"
        )
    if posted.outcome in ("closed", "missing") or entry is None:
        row = posted.row or record
        raise InstanceStateError(
            f"{args.id!r} is {row.status} (revision {row.revision}): it accepts no "
            "events; nothing was stored",
            instance_id=args.id,
        )
    repeat = posted.outcome == "duplicate"
    what = f"already stored ({entry.status})" if repeat else "stored"
    row = posted.row or record
    who = (
        f"the runtime holding it ({safe(row.lease_owner)}) applies it"
        if row.lease_owner
        else f"a runtime serving workflow {safe(row.workflow)!r} applies it"
    )
    if args.json:
        view = _event_view(entry)
        view["duplicate"] = repeat
        print(json.dumps(view, sort_keys=True))
        return 0
    print(
        f"{safe(args.id)}: event {safe(entry.event)!r} {what} as seq {entry.seq} "
        f"(event id {safe(entry.event_id)}); {who}"
    )
    return 0


def history(store: CliStore, args: argparse.Namespace) -> int:
    """``instances history``: the instance's last saves, events and takeovers, newest
    first (an event just below the save that consumed it, pending ones on top, a
    fired timer as a ``timer`` event, a takeover of the recovery sweep just above the
    save it put the instance back at), under its armed timers (due soonest last)."""
    _workflow_record(store, args)
    saves = store.history(args.id, limit=args.limit)
    events = store.run(
        InboxOp(workflow_instance_id=args.id, pending_only=False, limit=args.limit)
    )
    armed = store.run(TimersOp(workflow_instance_id=args.id))[::-1]
    taken = store.run(TakeoversOp(workflow_instance_id=args.id, limit=args.limit))
    items = [*armed, *interleave(saves, events, taken)][: args.limit]
    if args.json:
        for item in items:
            if isinstance(item, StoredTimer):
                view = timer_view(item)
            elif isinstance(item, InboxEntry):
                view = _event_view(item)
            elif isinstance(item, Takeover):
                view = _takeover_view(item)
            else:
                view = _save_view(item)
            print(json.dumps(view, sort_keys=True))
        return 0
    table(
        ("REV", "KIND", "STATUS", "PHASE/EVENT", "AT", "ID", "VERSION", "DETAIL"),
        [_history_row(item) for item in items],
    )
    return 0


def _takeover_view(taken: Takeover) -> dict[str, Any]:
    view: dict[str, Any] = msgspec.to_builtins(taken)
    view.update(kind="takeover", taken_at=iso(taken.taken_at_ms))
    return view


def _save_view(save: SaveLogEntry) -> dict[str, Any]:
    view: dict[str, Any] = msgspec.to_builtins(save)
    view.update(kind="save", committed_at=iso(save.committed_at_ms))
    return view


def _event_view(e: InboxEntry) -> dict[str, Any]:
    view: dict[str, Any] = msgspec.to_builtins(
        msgspec.structs.replace(e, payload=b"", input=None)
    )
    fired = fired_timer(e.event_id)
    view.update(
        kind="event" if fired is None else "timer",
        payload=_summary(e.payload),
        input=None if e.input is None else _summary(e.input),
        stored_at=iso(e.stored_at_ms),
        consumed_at=iso(e.consumed_at_ms),
    )
    return view


def _summary(encoded: bytes, width: int = 60) -> str:
    """An encoded payload as text, cut to *width* characters."""
    text = encoded.decode("utf-8", "replace")
    return text if len(text) <= width else text[: width - 1] + "\u2026"


def _history_row(
    item: SaveLogEntry | InboxEntry | StoredTimer | Takeover,
) -> tuple[str, ...]:
    if isinstance(item, Takeover):
        return (
            str(item.revision),
            "takeover",
            item.status,
            "",
            iso(item.taken_at_ms) or "",
            f"epoch {item.epoch}",
            "",
            safe(item.detail or ""),
        )
    if isinstance(item, StoredTimer):
        return (
            str(item.armed_revision),
            "timer",
            "armed",
            safe(event_name(item.event, item.state)),
            f"due {iso(item.due_at_ms)}",
            safe(item.name),
            "",
            f"{item.kind}, payload {_summary(item.payload, 40)}",
        )
    if isinstance(item, InboxEntry):
        at = iso(item.consumed_at_ms or item.stored_at_ms) or ""
        detail = f"payload {_summary(item.payload, 40)}"
        if item.detail:
            detail += f"; {item.detail}"
        fired = fired_timer(item.event_id)
        return (
            "" if item.revision is None else str(item.revision),
            f"event {item.seq}" if fired is None else f"timer {item.seq}",
            item.status,
            safe(event_name(item.event, None)),
            at,
            safe(item.event_id),
            "",
            safe(detail),
        )
    return (
        str(item.revision),
        "save",
        item.status,
        safe(item.phase or ""),
        iso(item.committed_at_ms) or "",
        safe(item.write_id),
        safe(item.definition_version),
        safe(item.detail or ""),
    )
