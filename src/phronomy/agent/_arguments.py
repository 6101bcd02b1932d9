"""Checking what callers pass to ``runtime.executions``: keys, timeouts, deadlines."""

from __future__ import annotations

import math

import trio

from phronomy.errors import InvalidInputError
from phronomy.storage import (
    EXECUTION_KEY_PREFIX,
    MAX_INSTANCE_ID_LENGTH,
    validate_instance_id,
)

__all__ = ["agent_id_of", "deadline_of"]


def deadline_of(timeout: object, deadline: object) -> float | None:
    """The trio-time deadline of an execution given *timeout* or *deadline*.

    Raises:
        InvalidInputError: a bad value, both given, or a deadline that has passed.
    """
    if timeout is not None and deadline is not None:
        raise InvalidInputError(
            "give timeout= (seconds from now) or deadline= (a trio time), not both"
        )
    if timeout is not None:
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or not 0 < timeout < math.inf
        ):
            raise InvalidInputError(
                f"timeout must be a positive number of seconds, got {timeout!r}"
            )
        return trio.current_time() + timeout
    if deadline is None:
        return None
    if isinstance(deadline, bool) or not isinstance(deadline, (int, float)):
        raise InvalidInputError(
            f"deadline must be a trio time (a float, as trio.current_time()), got "
            f"{deadline!r}"
        )
    now = trio.current_time()
    if deadline <= now:
        raise InvalidInputError(
            f"deadline {deadline!r} has passed (trio.current_time() is {now:.3f}): "
            "deadline= is an absolute trio time; for seconds from now, pass timeout="
        )
    return float(deadline)


_MAX_AGENT_ID_LENGTH = MAX_INSTANCE_ID_LENGTH - len(EXECUTION_KEY_PREFIX)


def agent_id_of(agent_id: object) -> str:
    """*agent_id*, checked once for every use: its executions' store key
    (``agent:<agent_id>``) is an instance id, so the key must fit too.

    Raises:
        InvalidInputError: what is wrong with it.
    """
    key = validate_instance_id(agent_id, what="agent_id")
    if len(key) > _MAX_AGENT_ID_LENGTH:
        raise InvalidInputError(
            f"agent_id is {len(key)} characters long; the limit is "
            f"{_MAX_AGENT_ID_LENGTH} (its store key adds {EXECUTION_KEY_PREFIX!r})"
        )
    return key
