"""What can happen to one instance in a runtime: the protocol's events.

Each event is a frozen, keyword-only struct. An event carries the feature's own
values where the feature decides them (the session it built, the store operation its
codec built, the error it raises); the protocol decides *whether* and *in which order*
they are carried out (see :mod:`phronomy.instance._table`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar, final

import msgspec

__all__ = [
    "Admit",
    "AdmitCancel",
    "Answer",
    "Buffer",
    "Cancel",
    "CancelAsked",
    "CancelAwait",
    "CancelDone",
    "CancelReload",
    "Claim",
    "End",
    "InstanceEvent",
    "LeaseLost",
    "Load",
    "Persist",
    "Refuse",
    "Resolve",
    "Retire",
    "Run",
    "Shutdown",
    "Withdraw",
]

C = TypeVar("C")
"""A caller's handle (the feature's result handle)."""
S = TypeVar("S")
"""A live session."""
O = TypeVar("O")  # noqa: E741 - the store operation type, as in the outputs
"""A store operation."""
E = TypeVar("E")
"""An item a segment takes once it runs (an inbox entry)."""
Q = TypeVar("Q")
"""A command that waits for the segment (a cancel)."""


@final
class Admit(msgspec.Struct, Generic[C], frozen=True, kw_only=True):
    """A start or resume is admitted for the key (``absent`` → ``admitting``).

    Attributes:
        owner: the command's opaque owner token (compared with ``is``).
        label: what the key runs (the workflow's name), for reports.
        caller: the command's caller, settled exactly once by the protocol's outputs
            (or left to whoever waits for an inbox entry, see :class:`End`).
    """

    owner: object
    label: str
    caller: C


@final
class AdmitCancel(msgspec.Struct, Generic[C], frozen=True, kw_only=True):
    """A cancel of an instance no segment runs here takes the admission while it
    reads and writes the row (``absent`` → ``cancelling``)."""

    owner: object
    label: str
    caller: C


@final
class Load(msgspec.Struct, frozen=True, kw_only=True):
    """The durable load (with its claim of the lease) was submitted."""


@final
class Claim(msgspec.Struct, frozen=True, kw_only=True):
    """The load came back with a claim: the row's lease is this runtime's.

    Attributes:
        epoch: the lease's fencing epoch.
        claimed_at: when the claim was sent (the runtime's monotonic clock).
    """

    epoch: int
    claimed_at: float


@final
class Run(msgspec.Struct, Generic[S], frozen=True, kw_only=True):
    """The segment's session was built and runs now.

    Attributes:
        session: the session to start.
        holder: its id (events for it name this id).
    """

    session: S
    holder: str


@final
class Refuse(msgspec.Struct, Generic[O], frozen=True, kw_only=True):
    """The command does not run: its caller fails with *error*.

    Attributes:
        error: why.
        write: the write that gives back a claim the load made (required once the
            claim was made, and refused before it).
    """

    error: BaseException
    write: O | None = None


@final
class Answer(msgspec.Struct, frozen=True, kw_only=True):
    """The load claimed nothing and answers the caller without running (a stored
    result, a post's receipt, a drain another runtime took)."""

    value: object = None


@final
class Withdraw(msgspec.Struct, Generic[O], frozen=True, kw_only=True):
    """Nothing runs and the caller is not answered here (it waits for its stored
    event, which whoever runs the instance applies).

    Attributes:
        write: the write that gives back the claim (required once it was made).
        after: the feature's follow-up once *write* is done (or at once).
        answered: complete the caller with ``None`` (a drain nobody waits for).
    """

    write: O | None = None
    after: Callable[[], object] | None = None
    answered: bool = False


@final
class Persist(msgspec.Struct, frozen=True, kw_only=True):
    """The session's terminal save was submitted (the terminal barrier)."""


@final
class End(msgspec.Struct, Generic[O], frozen=True, kw_only=True):
    """The session ended: with its save (*error* ``None``), cancelled, or failed.

    Attributes:
        value: the result (completes the caller, and waiting cancels when *cancelled*).
        error: the caller's error (a failure, or the cancellation error when
            *cancelled*).
        cancelled: the segment ended as cancelled (its save landed).
        write: a failed segment's status write; its caller hears once it is done.
        update: what to publish to watchers, if anything.
        settle: settle the caller here (``False``: waiters of its inbox entries hear).
        after: the feature's follow-up once the caller is settled.
    """

    value: object = None
    error: BaseException | None = None
    cancelled: bool = False
    write: O | None = None
    update: object = None
    settle: bool = True
    after: Callable[[], object] | None = None


@final
class Retire(msgspec.Struct, Generic[O], frozen=True, kw_only=True):
    """The outcome of the terminal save is unknown: the caller stays pending until an
    operator resolves it (or the runtime shuts down); *write* marks the row."""

    error: BaseException | None
    write: O | None = None


@final
class LeaseLost(msgspec.Struct, frozen=True, kw_only=True):
    """The segment's lease was lost (taken over, or not renewed in time)."""

    error: BaseException


@final
class Cancel(msgspec.Struct, Generic[Q, C], frozen=True, kw_only=True):
    """A cancel of this runtime (``runtime.workflows.cancel``) found the admission.

    Attributes:
        command: the cancel (given back to run again, or refused).
        caller: its caller (completed with the result when the segment ends
            cancelled).
        reason: its reason.
    """

    command: Q
    caller: C
    reason: str | None = None


@final
class CancelAsked(msgspec.Struct, frozen=True, kw_only=True):
    """Another runtime asked, through the row, for this live segment to cancel."""

    reason: str | None = None


@final
class CancelAwait(msgspec.Struct, frozen=True, kw_only=True):
    """The row-cancel found the instance live under another runtime's lease: it waits
    for that runtime to end it."""


@final
class CancelReload(msgspec.Struct, frozen=True, kw_only=True):
    """The waiting row-cancel reads the row again."""


@final
class CancelDone(msgspec.Struct, frozen=True, kw_only=True):
    """The row-cancel is done: *value* (the cancelled result) or *error*."""

    value: object = None
    error: BaseException | None = None
    update: object = None


@final
class Resolve(msgspec.Struct, frozen=True, kw_only=True):
    """An operator resolved the instance; a pending caller fails with *error*."""

    error: BaseException


@final
class Buffer(msgspec.Struct, Generic[E], frozen=True, kw_only=True):
    """Items stored for the instance while its segment is not running yet."""

    items: tuple[E, ...]


@final
class Shutdown(msgspec.Struct, frozen=True, kw_only=True):
    """The runtime shut down (*error*: the dispatcher's, if it failed)."""

    error: BaseException | None = None


InstanceEvent = (
    Admit[C]
    | AdmitCancel[C]
    | Load
    | Claim
    | Run[S]
    | Refuse[O]
    | Answer
    | Withdraw[O]
    | Persist
    | End[O]
    | Retire[O]
    | LeaseLost
    | Cancel[Q, C]
    | CancelAsked
    | CancelAwait
    | CancelReload
    | CancelDone
    | Resolve
    | Buffer[E]
    | Shutdown
)
"""Every event of the protocol."""
