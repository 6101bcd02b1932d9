"""What the driver of an instance carries out: the protocol's outputs.

The protocol performs no I/O; :meth:`Instance.handle
<phronomy.instance.Instance.handle>` returns these, in the order they must be carried
out. Each is a frozen, keyword-only struct.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, Literal, TypeVar, final

import msgspec

__all__ = [
    "CancelSession",
    "Complete",
    "DropLease",
    "Fail",
    "FailSession",
    "FollowUp",
    "HoldLease",
    "InstanceOutput",
    "Offer",
    "Publish",
    "Refused",
    "Released",
    "Rerun",
    "Settlement",
    "ShutDown",
    "StartSession",
    "Submit",
]

C = TypeVar("C")
S = TypeVar("S")
O = TypeVar("O")  # noqa: E741 - the store operation type, as in the events
E = TypeVar("E")
Q = TypeVar("Q")


@final
class Released(msgspec.Struct, frozen=True, kw_only=True):
    """The admission was given back: the key may be admitted again at once (this
    output always comes before the caller is settled)."""


@final
class HoldLease(msgspec.Struct, frozen=True, kw_only=True):
    """Keep renewing the lease the claim returned (until :class:`DropLease`)."""

    epoch: int
    claimed_at: float


@final
class DropLease(msgspec.Struct, frozen=True, kw_only=True):
    """Stop renewing the lease: its segment ended."""


@final
class StartSession(msgspec.Struct, Generic[S], frozen=True, kw_only=True):
    """Register the session with the engine: it runs."""

    session: S


@final
class Offer(msgspec.Struct, Generic[E], frozen=True, kw_only=True):
    """Give the live session what was stored for it while it loaded (before it
    starts)."""

    items: tuple[E, ...]


@final
class CancelSession(msgspec.Struct, frozen=True, kw_only=True):
    """Cancel the live session (it stops taking events and ends as cancelled)."""

    reason: str | None


@final
class FailSession(msgspec.Struct, frozen=True, kw_only=True):
    """Stop the live session with *error*, writing nothing (its lease is lost)."""

    error: BaseException


@final
class Complete(msgspec.Struct, Generic[C], frozen=True, kw_only=True):
    """Complete *caller* with *value*."""

    caller: C
    value: object = None


@final
class Fail(msgspec.Struct, Generic[C], frozen=True, kw_only=True):
    """Fail *caller* with *error*."""

    caller: C
    error: BaseException


@final
class FollowUp(msgspec.Struct, frozen=True, kw_only=True):
    """Call the feature's follow-up (given with the event), in this place."""

    call: Callable[[], object]


Settlement = Complete[C] | Fail[C] | FollowUp
"""What may follow a write."""


@final
class Submit(msgspec.Struct, Generic[O, C], frozen=True, kw_only=True):
    """Submit the store operation *op*; once it is done (landed or not: a failure is
    logged), carry out *then*. *quiet*: nothing waits for it (the shutdown's writes)."""

    op: O
    then: tuple[Settlement[C], ...] = ()
    quiet: bool = False


@final
class Publish(msgspec.Struct, frozen=True, kw_only=True):
    """Publish *update* to whoever watches the instance."""

    update: object


@final
class Rerun(msgspec.Struct, Generic[Q], frozen=True, kw_only=True):
    """Handle the waiting *command* again: the segment it waited for ended."""

    command: Q


@final
class Refused(msgspec.Struct, Generic[Q], frozen=True, kw_only=True):
    """Refuse the *command* (a cancel): the instance requires recovery."""

    command: Q
    because: Literal["recovery_required"] = "recovery_required"


@final
class ShutDown(msgspec.Struct, Generic[C], frozen=True, kw_only=True):
    """Fail *caller*: the runtime shut down.

    Attributes:
        caller: the caller.
        key: the instance.
        what: what the caller waited for: ``live`` (its segment, *error* is the
            dispatcher's), ``recovery_required`` (an operator; *cause*: why the
            outcome is unknown) or ``remote_cancel`` (another runtime ending it).
        error: the dispatcher's error, if it failed.
        cause: why the instance requires recovery.
    """

    caller: C
    key: str
    what: Literal["live", "recovery_required", "remote_cancel"]
    error: BaseException | None = None
    cause: BaseException | None = None


InstanceOutput = (
    Released
    | HoldLease
    | DropLease
    | StartSession[S]
    | Offer[E]
    | CancelSession
    | FailSession
    | Complete[C]
    | Fail[C]
    | FollowUp
    | Submit[O, C]
    | Publish
    | Rerun[Q]
    | Refused[Q]
    | ShutDown[C]
)
"""Every output of the protocol (type parameters: session, item, caller, op, command)."""
