"""The times the command line takes: ``--since``, ``--until`` (an ISO 8601 time or a
duration ago) and ``--older-than`` (a duration)."""

from __future__ import annotations

import datetime
import re

from phronomy.errors import InvalidInputError

__all__ = ["duration_ms", "moment_ms"]

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_UNIT_MS["w"] = 7 * _UNIT_MS["d"]


def duration_ms(text: str, option: str) -> int:
    """A duration such as ``7d``, ``12h``, ``1h30m``, ``90s`` in milliseconds.

    Raises:
        InvalidInputError: not such a duration (the message names *option*).
    """
    spec = text.strip().lower()
    parts = list(_DURATION.finditer(spec))
    if not spec or "".join(p.group(0) for p in parts) != spec.replace(" ", ""):
        raise InvalidInputError(
            f"{option} {text!r} is not a duration (such as 7d, 12h, 30m, 90s, 1h30m)"
        )
    return round(sum(float(p.group(1)) * _UNIT_MS[p.group(2)] for p in parts))


def moment_ms(text: str, option: str, now_ms: int) -> int:
    """An ISO 8601 time with an offset (``2026-12-01T09:00:00Z``), or a duration
    before *now_ms* (``7d``: seven days ago), in wall-clock milliseconds.

    Raises:
        InvalidInputError: neither (the message names *option*).
    """
    try:
        moment = datetime.datetime.fromisoformat(text.strip())
    except ValueError:
        try:
            return now_ms - duration_ms(text, option)
        except InvalidInputError:
            raise InvalidInputError(
                f"{option} {text!r} is neither an ISO 8601 time with an offset "
                "(2026-12-01T09:00:00Z) nor a duration ago (7d, 12h, 30m)"
            ) from None
    if moment.tzinfo is None:
        raise InvalidInputError(
            f"{option} {text!r} has no UTC offset; add one (Z, +01:00)"
        )
    return int(moment.timestamp() * 1000)
