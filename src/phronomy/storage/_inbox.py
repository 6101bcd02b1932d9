"""The inbox: events stored for an instance before anything acknowledges them.

Each instance has an inbox of entries, ordered by a sequence number the store assigns
under the instance's row. An entry is *pending* until the write that consumes it — the
save (or the status write) of the segment that applied it — records its outcome in the
same transaction, so an event is applied to the instance's state exactly once.
"""

from __future__ import annotations

import re
from typing import Literal, final

import msgspec

from phronomy.errors import ConflictError, InvalidInputError

from ._records import (
    MAX_INSTANCE_ID_LENGTH,
    Consumption,
    InboxStatus,
    StoredRecord,
)

__all__ = [
    "EVENT_OUTCOMES",
    "Claimed",
    "Consumption",
    "InboxEntry",
    "InboxStatus",
    "PostOutcome",
    "Posting",
    "not_pending",
    "validate_event_id",
]

EVENT_OUTCOMES: frozenset[InboxStatus] = frozenset(
    {"transitioned", "rejected", "dropped", "refused", "failed"}
)
"""The statuses of consumed entries."""

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def validate_event_id(value: object) -> str:
    """Return *value* if it is a usable event id (an idempotency key).

    Raises:
        InvalidInputError: not a string, empty, longer than 255 characters,
            containing control characters, or starting with ``timer:`` (reserved).
    """
    if not isinstance(value, str):
        raise InvalidInputError(
            f"event_id must be a string, got {type(value).__name__}"
        )
    if not value:
        raise InvalidInputError("event_id must not be empty")
    if len(value) > MAX_INSTANCE_ID_LENGTH:
        raise InvalidInputError(
            f"event_id is {len(value)} characters long; the limit is "
            f"{MAX_INSTANCE_ID_LENGTH}"
        )
    if _CONTROL.search(value):
        raise InvalidInputError(f"event_id {value!r} contains control characters")
    if value.startswith("timer:"):
        raise InvalidInputError(
            f"event_id {value!r} starts with 'timer:', which is reserved for the "
            "events of timers; choose another id"
        )
    return value


def not_pending(workflow_instance_id: str, seqs: list[int]) -> ConflictError:
    """The refusal of a write that would consume entries *seqs*, which are not
    pending (consumed by an earlier write, or never stored): nothing is written."""
    return ConflictError(
        f"workflow instance {workflow_instance_id!r}: inbox entries {seqs} are not "
        "pending (consumed by an earlier write, or never stored); an event is applied "
        "once, so nothing was written",
        instance_id=workflow_instance_id,
    )


@final
class Posting(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """An event to store in an instance's inbox.

    Attributes:
        workflow_instance_id: the instance.
        event_id: the idempotency key: a second posting with the same id is answered
            with the first one's entry (and stores nothing).
        event: the event's name.
        payload: its payload, encoded (JSON).
        input: field values merged into the state before it fires, encoded (JSON), or
            ``None``.
        expected_revision: the revision the sender saw (a resume from a halted result):
            if the instance moved on before the event is applied, it is refused.
    """

    workflow_instance_id: str
    event_id: str
    event: str
    payload: bytes
    input: bytes | None = None
    expected_revision: int | None = None

    def stored(self, *, seq: int, stored_at_ms: int) -> InboxEntry:
        """The pending entry this posting is once stored as number *seq*."""
        return InboxEntry(
            workflow_instance_id=self.workflow_instance_id,
            seq=seq,
            event_id=self.event_id,
            event=self.event,
            payload=self.payload,
            input=self.input,
            expected_revision=self.expected_revision,
            stored_at_ms=stored_at_ms,
        )


@final
class InboxEntry(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One stored event of an instance.

    Attributes:
        workflow_instance_id: the instance.
        seq: its place in the instance's inbox (1, 2, ...; entries are applied in this
            order).
        event_id: its idempotency key.
        event: the event's name.
        payload: its payload, encoded (JSON).
        input: field values merged into the state before it fires (JSON), or ``None``.
        expected_revision: the revision the sender saw, or ``None``.
        stored_at_ms: wall-clock milliseconds when it was stored.
        status: see :data:`InboxStatus`.
        revision: the revision its consumption produced (or that the instance was at
            when it was refused, rejected or dropped).
        consumed_at_ms: wall-clock milliseconds when it was consumed.
        detail: why it was refused, dropped or failed.
    """

    workflow_instance_id: str
    seq: int
    event_id: str
    event: str
    payload: bytes
    stored_at_ms: int
    input: bytes | None = None
    expected_revision: int | None = None
    status: InboxStatus = "pending"
    revision: int | None = None
    consumed_at_ms: int | None = None
    detail: str | None = None

    def same_event(self, posting: Posting) -> bool:
        """Whether *posting* asks for this entry's event (a true repeat of it): the
        same event, payload and input (a precondition, ``expected_revision``, is the
        first one's: a retry may come from a caller that no longer has it)."""
        return (
            self.event == posting.event
            and self.payload == posting.payload
            and self.input == posting.input
        )


@final
class PostOutcome(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What a :class:`~phronomy.storage.PostOp` did.

    Attributes:
        outcome: ``stored`` (a new entry), ``duplicate`` (the event id was stored
            before, for the same event: *entry* is the first one), ``mismatch`` (the
            event id was stored before for another event: nothing stored), ``closed``
            (the instance is finished or cancelled: nothing stored) or ``missing`` (no
            such instance: nothing stored).
        entry: the stored (or earlier) entry.
        row: the instance's row after the post, without its snapshot.
    """

    outcome: Literal["stored", "duplicate", "mismatch", "closed", "missing"]
    entry: InboxEntry | None = None
    row: StoredRecord | None = None


@final
class Claimed(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What a :class:`~phronomy.storage.ClaimOp` did.

    Attributes:
        row: the instance's row as it was before the claim (``None``: there was none).
        epoch: the new fencing epoch, or ``None`` when nothing was claimed (the row
            says why).
        pending: the instance's pending inbox entries (as many as the claim asked
            for), oldest first.
        posted: what the claim's posting did, if it carried one.
    """

    row: StoredRecord | None
    epoch: int | None
    pending: tuple[InboxEntry, ...] = ()
    posted: PostOutcome | None = None
