"""Retries of effects (pure: no trio): the policy, the wait before each attempt, which
errors end retries, and how a retried effect is named so that another process can run
its next attempt.

A durable instance's effect with a retry policy is stored by reference: its function
by module and qualified name, its arguments as JSON. When an attempt fails and the
effect is the segment's only running work, the instance halts at its state with a
``retry`` timer that holds the next attempt's number and the errors so far; when the
timer fires (in whichever runtime serves the instance), that attempt runs there. A
crash between attempts loses nothing: the count goes on from the stored number.
"""

from __future__ import annotations

import importlib
import math
import random
import sys
from typing import TYPE_CHECKING, Any, Literal, final

import msgspec

from phronomy.errors import InvalidInputError, NonRetryableError

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "RETRY_EVENT",
    "RetryPolicy",
    "StoredEffect",
    "effect_ref",
    "load_ref",
    "retry_delay",
    "retryable",
]

RETRY_EVENT = "__phronomy.retry__"
"""The event of a retry timer: the effect's next attempt runs at the halted state."""

MAX_ERRORS = 10
"""Errors a retried effect keeps (the last ones), shown in the instance's history."""


@final
class RetryPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """How an effect is tried again when it fails (``effects.offload(...,
    retry=RetryPolicy(...))``, or for every effect: ``open_runtime(retry=...)``).

    The wait before attempt *n* + 1 is drawn from ``[0, cap]`` with
    ``cap = min(max_interval, initial_interval * backoff ** (n - 1))`` (``full``
    jitter, AWS's recommendation), from ``[cap / 2, cap]`` (``equal``), or is
    ``cap`` (``none``). After the last attempt the effect's ``on_error`` event fires
    with the last error (without ``on_error``, the segment fails with it).

    Attributes:
        max_attempts: attempts in all (1: no retry).
        initial_interval: seconds before the second attempt (its cap).
        backoff: the factor between two caps.
        max_interval: the largest cap, in seconds.
        jitter: ``full``, ``equal`` or ``none``.
        non_retryable: exception types that end retries at once (as does
            :class:`~phronomy.NonRetryableError`).
        timeout_per_attempt: seconds an attempt of a ``start_soon`` effect may take
            (then it is cancelled and counts as failed); threads cannot be stopped,
            so ``offload`` refuses it.
    """

    max_attempts: int = 3
    initial_interval: float = 1.0
    backoff: float = 2.0
    max_interval: float = 60.0
    jitter: Literal["full", "equal", "none"] = "full"
    non_retryable: tuple[type[BaseException], ...] = ()
    timeout_per_attempt: float | None = None

    def __post_init__(self) -> None:
        attempts: object = (
            self.max_attempts
        )  # checked at run time: callers are not typed
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            raise InvalidInputError(
                f"max_attempts must be an int >= 1, got {self.max_attempts!r}"
            )
        for name in ("initial_interval", "max_interval", "backoff"):
            value: object = getattr(self, name)
            low = 1.0 if name == "backoff" else 0.0
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not low <= value <= 100 * 366 * 86400
            ):
                raise InvalidInputError(
                    f"{name} must be a number from {low:g} to 100 years, got {value!r}"
                )
        if self.jitter not in ("full", "equal", "none"):
            raise InvalidInputError(
                f"jitter must be 'full', 'equal' or 'none', got {self.jitter!r}"
            )
        kinds: tuple[object, ...] = self.non_retryable
        for kind in kinds:
            if not (isinstance(kind, type) and issubclass(kind, BaseException)):
                raise InvalidInputError(
                    f"non_retryable must hold exception types, got {kind!r}"
                )
        timeout: object = self.timeout_per_attempt
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or not timeout > 0
        ):
            raise InvalidInputError(
                f"timeout_per_attempt must be seconds > 0, got {timeout!r}"
            )


def retry_delay(
    policy: RetryPolicy,
    attempt: int,
    rng: Callable[[], float] = random.random,  # noqa: S311 - jitter, not secrets
) -> float:
    """Seconds to wait after attempt *attempt* (1, 2, ...) failed, before the next."""
    exponent = min(attempt - 1, 1024)
    cap = min(policy.max_interval, policy.initial_interval * policy.backoff**exponent)
    if not math.isfinite(cap):
        cap = policy.max_interval
    match policy.jitter:
        case "full":
            return cap * rng()
        case "equal":
            return cap / 2 + cap / 2 * rng()
    return cap


def retryable(policy: RetryPolicy, error: BaseException, attempt: int) -> bool:
    """Whether attempt *attempt*, which failed with *error*, is tried again."""
    if attempt >= policy.max_attempts:
        return False
    stop: tuple[type[BaseException], ...] = (NonRetryableError, *policy.non_retryable)
    return not isinstance(error, stop)


def effect_ref(fn: object) -> str:
    """``module:qualname`` of a module-level function (what another process imports
    to run a retried effect of a durable instance).

    Raises:
        InvalidInputError: *fn* is a lambda, a closure, a bound method or anything
            the name does not import back as the same object.
    """
    module = getattr(fn, "__module__", None)
    name = getattr(fn, "__qualname__", None)
    if isinstance(module, str) and isinstance(name, str) and "<" not in name:
        ref = f"{module}:{name}"
        try:
            if load_ref(ref) is fn:
                return ref
        except InvalidInputError:
            pass
    raise InvalidInputError(
        f"a retried effect of a durable instance must be a module-level function "
        f"(its next attempt may run in another process, which imports it by name); "
        f"{fn!r} is not (pass what it needs as the effect's arguments)"
    )


def load_ref(ref: str) -> Any:
    """The object named ``module:qualname``.

    Raises:
        InvalidInputError: it cannot be imported.
    """
    module, _, name = ref.partition(":")
    try:
        # an imported module from sys.modules itself (import_module's lookup is three
        # calls deep; a step runs this once per attempt), unless it is still importing
        value: Any = sys.modules.get(module)
        spec = getattr(value, "__spec__", None)
        if value is None or getattr(spec, "_initializing", False):
            value = importlib.import_module(module)
        for part in name.split("."):
            value = getattr(value, part)
    except (ImportError, AttributeError, ValueError) as exc:
        raise InvalidInputError(f"cannot import {ref!r}: {exc}") from None
    return value


@final
class StoredEffect(msgspec.Struct, frozen=True, kw_only=True):
    """A retried effect as its retry timer stores it (JSON).

    Attributes:
        kind: ``offload`` or ``start_soon``.
        fn: its function (``module:qualname``).
        args: its arguments.
        on_done: the event of its result.
        on_error: the event of its last error, or ``None``.
        attempt: the attempt the timer runs.
        errors: the errors of the attempts so far (the last few).
        policy: the policy's numbers.
        non_retryable: the policy's error types (``module:qualname``).
    """

    kind: Literal["offload", "start_soon"]
    fn: str
    args: list[Any]
    on_done: str
    on_error: str | None
    attempt: int
    errors: list[str]
    policy: dict[str, Any]
    non_retryable: list[str] = msgspec.field(default_factory=list)

    def restore_policy(self) -> RetryPolicy:
        """The policy again (its error types imported).

        Raises:
            InvalidInputError: an error type cannot be imported.
        """
        kinds = tuple(load_ref(ref) for ref in self.non_retryable)
        return RetryPolicy(**self.policy, non_retryable=kinds)


def describe_error(error: BaseException) -> str:
    """How a failed attempt's error is kept: its type and message, cut short."""
    return f"{type(error).__name__}: {error}"[:500]
