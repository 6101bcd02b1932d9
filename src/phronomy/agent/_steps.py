"""Steps of a supervised execution: their shape, and how they are run as effects.

A step runs as an effect of the execution's generated workflow: a ``def`` step in a
worker thread (:func:`run_sync_step`), an ``async def`` step as a supervised trio task
(:func:`run_async_step`). Both return a :class:`StepOutput` that carries the step
run's id, so a result that is not the current step's is rejected by the workflow.

A step that another process can import (a module-level function) is passed by name
and its value as JSON, so that its retries and its takeover may run elsewhere; any
other step is passed as the object itself and runs only in this process.
"""

from __future__ import annotations

import inspect
import time
from typing import Any, final

import msgspec
import trio

from phronomy.errors import DefinitionError
from phronomy.workflow._callbacks import is_awaitable
from phronomy.workflow._retries import (
    RetryPolicy,
    describe_error,
    load_ref,
    retry_delay,
    retryable,
)

from ._context import StepContext
from ._messages import Approval

__all__ = [
    "StepOutput",
    "arity",
    "call_sync_step",
    "is_async",
    "run_async_step",
    "run_local_async",
    "run_local_sync",
    "run_sync_step",
]


@final
class StepOutput(msgspec.Struct, frozen=True, kw_only=True):
    """A step's return value, and the id of the step run that produced it."""

    step_id: str
    value: Any = None


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
    if is_awaitable(result):
        if inspect.iscoroutine(result):
            result.close()
        raise TypeError(f"step {fn!r} returned an awaitable; declare it with async def")
    return result


StepIdent = tuple[str, str, int] | list[Any]
"""``(execution_id, agent_id, step index)`` of a step run (a list once stored)."""


def _value(value: Any, approval: bool) -> Any:
    """The step's input: an :class:`Approval` kept as JSON comes back as one."""
    if approval and not isinstance(value, Approval):
        return msgspec.convert(value, Approval)
    return value


def _args(
    value: Any, takes: int, ident: StepIdent, step_id: str, nursery: Any = None
) -> tuple[Any, ...]:
    if takes == 1:
        return (value,)
    execution_id, agent_id, index = tuple(ident)
    ctx = StepContext(
        execution_id=execution_id,
        agent_id=agent_id,
        step_index=index,
        step_id=step_id,
        nursery=nursery,
    )
    return (value, ctx)


def run_sync_step(
    ref: str,
    step_id: str,
    takes: int,
    value: Any,
    approval: bool,
    ident: StepIdent,
) -> StepOutput:
    """Run the module-level ``def`` step *ref* (in a worker thread); its arguments are
    JSON, so a retry or a takeover may run it in another process."""
    fn = load_ref(ref)
    args = _args(_value(value, approval), takes, ident, step_id)
    return StepOutput(step_id=step_id, value=call_sync_step(fn, args))


async def run_async_step(
    ref: str,
    step_id: str,
    takes: int,
    value: Any,
    approval: bool,
    ident: StepIdent,
) -> StepOutput:
    """Run the module-level ``async def`` step *ref* (as :func:`run_sync_step`)."""
    return await run_local_async(
        load_ref(ref),
        None,
        step_id,
        takes,
        _value(value, approval),
        tuple(ident),
    )


def run_local_sync(
    fn: Any,
    retry: RetryPolicy | None,
    step_id: str,
    takes: int,
    value: Any,
    ident: StepIdent,
) -> StepOutput:
    """Run a ``def`` step only this process has (a lambda, a closure), retried here
    by *retry* (the thread waits between attempts)."""
    args = _args(value, takes, ident, step_id)
    attempt = 1
    while True:
        try:
            return StepOutput(step_id=step_id, value=call_sync_step(fn, args))
        except Exception as exc:
            if retry is None or not retryable(retry, exc, attempt):
                raise
            exc.add_note(f"phronomy: attempt {attempt}: {describe_error(exc)}")
            time.sleep(retry_delay(retry, attempt))
            attempt += 1


async def run_local_async(
    fn: Any,
    retry: RetryPolicy | None,
    step_id: str,
    takes: int,
    value: Any,
    ident: StepIdent,
) -> StepOutput:
    """Run an ``async def`` step with a context whose offloaded threads it waits for:
    a cancelled step's task ends only once every thread it started has returned."""
    attempt = 1
    while True:
        try:
            async with trio.open_nursery() as nursery:
                result = await fn(*_args(value, takes, ident, step_id, nursery))
            return StepOutput(step_id=step_id, value=result)
        except Exception as exc:
            if retry is None or not retryable(retry, exc, attempt):
                raise
            await trio.sleep(retry_delay(retry, attempt))
            attempt += 1
