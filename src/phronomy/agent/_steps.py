"""Steps of a supervised execution: their shape, and how a sync step is called."""

from __future__ import annotations

import inspect
from typing import Any

from phronomy.errors import DefinitionError

__all__ = ["arity", "call_sync_step", "is_async"]


def arity(step: Any, index: int) -> int:
    """How many arguments *step* takes: 1 ``(value)`` or 2 ``(value, ctx)``.

    Raises:
        DefinitionError: *step* is not callable or takes another number of arguments.
    """
    if not callable(step):
        raise DefinitionError(f"step {index} must be callable, got {step!r}")
    try:
        parameters = inspect.signature(step).parameters.values()
    except (TypeError, ValueError):
        return 1
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters):
        return 2
    required = [
        p
        for p in parameters
        if p.kind
        in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        and p.default is inspect.Parameter.empty
    ]
    if not 1 <= len(required) <= 2:
        raise DefinitionError(
            f"step {index} ({getattr(step, '__name__', step)!r}) must take (value) or "
            f"(value, ctx); it requires {len(required)} arguments"
        )
    return len(required)


def is_async(fn: Any) -> bool:
    """``async def`` functions, partials of them, and objects with an ``async __call__``."""
    call = type(fn).__dict__.get("__call__")
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


def call_sync_step(fn: Any, args: tuple[Any, ...]) -> Any:
    """Call a sync step in its worker thread; an awaitable result is refused.

    Raises:
        TypeError: the step returned an awaitable (it should be ``async def``).
    """
    result = fn(*args)
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()
        raise TypeError(f"step {fn!r} returned an awaitable; declare it with async def")
    return result
