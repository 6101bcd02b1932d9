"""What ``open_engine`` raises when its block or its nursery ends with an error."""

from __future__ import annotations

from typing import NoReturn

import trio

from phronomy.errors import PhronomyInternalError

__all__ = ["raise_keeping_context", "unwrap"]


def raise_keeping_context(error: BaseException) -> NoReturn:
    """Raise *error* as it is: its cause and context stay what they were.

    ``raise error from None`` would wipe the cause (and hide the context); a plain
    ``raise`` here would chain the nursery's exception group as its context.
    """
    context, cause = error.__context__, error.__cause__
    suppress = error.__suppress_context__
    try:
        raise error
    finally:
        error.__context__, error.__cause__ = context, cause
        error.__suppress_context__ = suppress
        del error, context, cause


def unwrap(
    group: BaseExceptionGroup[BaseException], body_error: BaseException | None
) -> BaseException:
    """Pick what to raise for an exception group escaping the engine's nursery."""
    interrupts, _ = group.split((KeyboardInterrupt, SystemExit))
    if interrupts is not None:
        return interrupts.exceptions[0]
    _, rest = group.split(trio.Cancelled)
    if rest is None:
        # Only cancellations: the body's error (or the cancellation itself) is the story.
        return body_error if body_error is not None else group.exceptions[0]
    error = PhronomyInternalError(
        "an internal phronomy task failed; please report this bug"
    )
    error.__cause__ = rest
    return error
