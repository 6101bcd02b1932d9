"""How the command line prints: stored text escaped, times in ISO 8601 UTC, tables
for people and JSON for programs (``--json``)."""

from __future__ import annotations

import datetime
import json
import re
from typing import TYPE_CHECKING, Any

import msgspec

from phronomy.workflow._definition import describe_delay

if TYPE_CHECKING:
    import argparse
    from collections.abc import Collection, Mapping, Sequence

    from phronomy._cli_store import CliStore
    from phronomy.storage import StoredRecord

__all__ = ["done", "iso", "json_line", "print_view", "row_table", "safe", "table"]

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def safe(value: object) -> str:
    """*value* as one line of text: control characters (tabs, newlines) escaped."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))


def iso(ms: int | None) -> str | None:
    """Wall-clock milliseconds as ISO 8601 UTC (``2026-12-01T09:06:15.123Z``)."""
    if ms is None:
        return None
    try:
        moment = _EPOCH + datetime.timedelta(milliseconds=ms)
    except OverflowError:  # a damaged row: show the number rather than fail
        return f"{ms} ms"
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def json_line(value: Any, **times: int | None) -> str:
    """*value*'s fields as one line of JSON, with *times* (ms) in ISO 8601 added."""
    fields: dict[str, Any] = msgspec.to_builtins(value)
    fields.update({name: iso(ms) for name, ms in times.items()})
    return json.dumps(fields, sort_keys=True)


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Print *rows* under *header* in columns (two spaces apart, empty cells ``-``)."""
    cells = [list(header), *([c or "-" for c in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def row_table(row: StoredRecord | None) -> None:
    """Print an instance's row as a one-row table (nothing for ``None``)."""
    if row is not None:
        table(
            ("ID", "WORKFLOW", "STATUS", "REV", "PHASE", "UPDATED", "DETAIL"),
            [
                (
                    safe(row.workflow_instance_id),
                    safe(row.workflow),
                    row.status,
                    str(row.revision),
                    safe(row.phase or ""),
                    iso(row.updated_at_ms) or "",
                    safe(row.detail or ""),
                )
            ],
        )


def done(
    args: argparse.Namespace,
    text: str,
    store: CliStore | None = None,
    **fields: Any,
) -> int:
    """Print a command's outcome: *text* (under the instance's row as a table, if
    *store*), or (``--json``) *fields* as one JSON object (with the row's update
    time, if *store*)."""
    if not args.json:
        if store is not None:
            row_table(store.load(fields["id"]))
        print(text)
        return 0
    if store is not None:
        row = store.load(fields["id"])
        if row is not None:
            fields.update(
                updated_at_ms=row.updated_at_ms, updated_at=iso(row.updated_at_ms)
            )
    print(json.dumps(fields, sort_keys=True))
    return 0


def print_view(
    args: argparse.Namespace,
    view: Mapping[str, Any],
    *,
    hide: Collection[str] = (),
    times: Collection[str] = (),
    durations: Collection[str] = (),
) -> None:
    """Print a ``show`` command's *view*: with ``--json``, as one (indented) JSON
    object; otherwise for people, as a ``FIELD``/``VALUE`` table of its values in
    their order, then each list of objects as a table of its own under its name.

    Stored milliseconds whose ISO 8601 form is in the view too are left out, and so
    are the keys in *hide*; the keys in *times* (wall-clock milliseconds) are shown
    in ISO 8601, those in *durations* (milliseconds) as ``1h30m``, both without their
    ``_ms``. Other values are JSON (strings as they are).
    """
    if args.json:
        print(json.dumps(view, indent=2, sort_keys=True))
        return
    pairs: list[tuple[str, str]] = []
    lists: list[tuple[str, list[Mapping[str, Any]]]] = []
    for key, value in view.items():
        if key in hide or (key.endswith("_ms") and key[:-3] in view):
            continue
        if key in times:
            pairs.append((key.removesuffix("_ms"), iso(value) or ""))
        elif key in durations:
            shown = "" if value is None else describe_delay(value)
            pairs.append((key.removesuffix("_ms"), shown))
        elif value and isinstance(value, list) and isinstance(value[0], dict):
            lists.append((key, value))
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            pairs.append((key, ", ".join(safe(v) for v in value)))
        else:
            pairs.append((key, _cell(value)))
    table(("FIELD", "VALUE"), pairs)
    for key, items in lists:
        columns = list(dict.fromkeys(k for item in items for k in item))
        print(f"\n{key}:")
        table(
            [c.upper() for c in columns],
            [[_cell(item.get(c)) for c in columns] for item in items],
        )


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return safe(value)
    return safe(json.dumps(value, sort_keys=True))
