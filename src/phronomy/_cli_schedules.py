"""The command line's ``schedules`` commands: list, show, pause, resume, trigger,
backfill and delete stored schedules (a runtime serving the schedule's workflow
carries out a trigger or a backfill at its next poll)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

import msgspec

from phronomy._cli_output import done, iso, print_view, safe, table
from phronomy.errors import InvalidInputError, NotFoundError
from phronomy.storage import (
    DeleteScheduleOp,
    ListOp,
    PutScheduleOp,
    ScheduleOp,
    ScheduleRecord,
    SchedulesOp,
)
from phronomy.workflow._schedule_client import ScheduleClient
from phronomy.workflow._ticks import EDITS, tick_instance_id, ticks_between

if TYPE_CHECKING:
    import argparse

    from phronomy._cli_store import CliStore

__all__ = ["schedules_delete", "schedules_edit", "schedules_list", "schedules_show"]


def schedules_list(store: CliStore, args: argparse.Namespace) -> int:
    """``schedules list``: every schedule, by id."""
    _, records = store.run(SchedulesOp(after=args.after, limit=args.limit))
    if args.json:
        for record in records:
            print(json.dumps(_view(record), sort_keys=True))
        return 0
    table(
        ("ID", "WORKFLOW", "WHEN", "ZONE", "NEXT", "OVERLAP", "STATE", "STARTED", "SKIPPED"),
        [
            (
                safe(r.schedule_id),
                safe(r.workflow),
                safe(_when(r)),
                safe(r.timezone),
                iso(r.next_tick_ms) or "",
                r.overlap,
                "paused" if r.paused else "active",
                str(r.started),
                str(r.skipped),
            )
            for r in records
        ],
    )  # fmt: skip
    return 0


def schedules_show(store: CliStore, args: argparse.Namespace) -> int:
    """``schedules show``: one schedule, with its next ticks and the instances it
    started that the store holds, the last ones first (a table; ``--json``: one
    JSON object)."""
    record = _load(store, args.id)
    view = _view(record)
    view["upcoming"] = [
        t.isoformat().replace("+00:00", "Z") for t in ScheduleClient.upcoming(record)
    ]
    page = store.run(ListOp(after=f"{record.schedule_id}@", limit=1000))
    started = [
        r
        for r in page.records
        if r.workflow_instance_id.startswith(f"{record.schedule_id}@")
    ]
    view["instances"] = [
        {"id": r.workflow_instance_id, "status": r.status, "phase": r.phase}
        for r in started[::-1][:20]
    ]
    print_view(args, view, times=_TIMES, durations=("every_ms", "catchup_window_ms"))
    return 0


def schedules_edit(store: CliStore, args: argparse.Namespace) -> int:
    """``schedules pause|resume|trigger|backfill``: the same edits as
    ``runtime.schedules`` (a compare-and-set of the schedule's version)."""
    extra: tuple[Any, ...] = ()
    if args.action == "pause":
        extra = (args.note,)
    elif args.action == "backfill":
        extra = (_instant(args.start, "--start"), _instant(args.end, "--end"))
    for _ in range(20):  # a runtime's tick may change it meanwhile
        record = _load(store, args.id)
        fields = EDITS[args.action](record, store.wall_now_ms(), *extra)
        changed = msgspec.structs.replace(record, **fields, version=record.version + 1)
        if store.run(PutScheduleOp(record=changed, expected_version=record.version)):
            break
    else:  # pragma: no cover - twenty ticks in a row
        raise InvalidInputError(f"schedule {args.id!r} keeps changing: try again")
    sid = safe(record.schedule_id)
    serving = f"a runtime serving {safe(record.workflow)!r}"
    view = _view(changed)
    view["action"] = args.action
    if args.action == "trigger":
        view["instance"] = tick_instance_id(record.schedule_id, fields["trigger_ms"])
        text = f"{sid}: {serving} starts {safe(view['instance'])}"
    elif args.action == "backfill":
        view["ticks"] = len(ticks_between(record, *extra))
        text = (
            f"{sid}: {serving} starts the instances of {view['ticks']} ticks (those "
            "not started before)"
        )
    else:
        text = f"{sid}: {'paused' if args.action == 'pause' else 'active'}"
    return done(args, text, **view)


def schedules_delete(store: CliStore, args: argparse.Namespace) -> int:
    """``schedules delete``: delete the schedule (its instances stay)."""
    if not store.run(DeleteScheduleOp(schedule_id=args.id)):
        raise NotFoundError(f"no schedule {args.id!r} in {args.db!r}")
    text = f"{safe(args.id)}: deleted (the instances it started stay)"
    return done(args, text, id=args.id, deleted=True)


_TIMES = (
    "anchor_ms",
    "buffered_tick_ms",
    "trigger_ms",
    "backfill_from_ms",
    "backfill_to_ms",
)
"""The times (wall-clock ms) of a schedule its view has no ISO 8601 form of."""


def _load(store: CliStore, schedule_id: str) -> ScheduleRecord:
    record: ScheduleRecord | None = store.run(ScheduleOp(schedule_id=schedule_id))
    if record is None:
        raise NotFoundError(f"no schedule {schedule_id!r}")
    return record


def _when(record: ScheduleRecord) -> str:
    if record.cron is not None:
        return f"cron {record.cron}"
    return f"every {record.every_ms} ms"


def _view(record: ScheduleRecord) -> dict[str, Any]:
    view: dict[str, Any] = msgspec.to_builtins(
        msgspec.structs.replace(record, input=None)
    )
    view.update(
        input=None if record.input is None else json.loads(record.input),
        next_tick=iso(record.next_tick_ms),
        created_at=iso(record.created_at_ms),
        updated_at=iso(record.updated_at_ms),
    )
    return view


def _instant(text: str, what: str) -> int:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidInputError(f"{what} {text!r} is not an ISO 8601 time") from None
    if moment.utcoffset() is None:
        raise InvalidInputError(
            f"{what} {text!r} has no UTC offset (write 2026-03-01T09:00+01:00 or ...Z)"
        )
    return round(moment.timestamp() * 1000)
