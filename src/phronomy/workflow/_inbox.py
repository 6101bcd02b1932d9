"""Events through the inbox: their payloads as stored, receipts, a segment's feed.

Every event for a durable instance is stored in the instance's inbox before anything
acknowledges it. A segment takes the entries in order (its *feed*) and the write that
ends it records what became of each one, in the same transaction as the state it
produced: an event is applied to the state exactly once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, final

import msgspec

from phronomy.errors import SerializationError
from phronomy.storage import (
    Consumption,
    InboxEntry,
    InboxStatus,
    check_json_domain,
)

from ._messages import InputOverlay
from ._state import validate_fields

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._definition import WorkflowDefinition

__all__ = [
    "MAX_PAYLOAD_BYTES",
    "MOVED_ON",
    "EventReceipt",
    "Feed",
    "decode_input",
    "decode_payload",
    "encode_input",
    "encode_payload",
    "moved_on",
    "receipt_of",
]

MAX_PAYLOAD_BYTES = 1 << 20


def moved_on(expected: int, now: str) -> str:
    """Why an entry sent with a halted result is refused: the instance moved on from
    revision *expected* (*now*: to what). Callers recognise it by :data:`MOVED_ON`."""
    return f"it was sent for revision {expected}; {MOVED_ON} {now}"


MOVED_ON = "the instance had moved on"
"""The words of every refusal of an entry whose halted result is out of date (a
waiter reports those as a :class:`~phronomy.ConflictError`)."""
"""The largest payload (encoded) an event may carry: 1 MiB."""

_ENCODER = msgspec.json.Encoder()


def encode_payload(payload: Any, *, event: str, instance: str) -> bytes:
    """*payload* as it is stored (JSON), refusing what would not come back as itself.

    Raises:
        SerializationError: a value JSON cannot hold, one whose type a round trip would
            change (a tuple, a set, bytes, int keys), or more than
            :data:`MAX_PAYLOAD_BYTES` (the message names the event and the instance).
    """
    where = f"the payload of event {event!r} for workflow instance {instance!r}"
    try:
        check_json_domain(payload, "$")
        blob = _ENCODER.encode(payload)
    except RecursionError:
        raise SerializationError(f"{where} is nested too deeply") from None
    except (SerializationError, TypeError) as exc:
        raise SerializationError(f"{where} cannot be stored: {exc}") from None
    if len(blob) > MAX_PAYLOAD_BYTES:
        raise SerializationError(
            f"{where} is {len(blob)} bytes encoded; the limit is {MAX_PAYLOAD_BYTES}"
        )
    if msgspec.json.decode(blob) != payload:
        raise SerializationError(
            f"{where} would not come back as it was (a tuple, a set, bytes or "
            "non-text keys come back as lists and text): send JSON values (text, "
            "numbers, booleans, None, lists and dicts with text keys)"
        )
    return blob


def decode_payload(blob: bytes) -> Any:
    """A stored payload."""
    return msgspec.json.decode(blob)


def encode_input(overlay: InputOverlay, *, instance: str) -> bytes | None:
    """The field values of *overlay* as stored (``None`` without any); a complete
    state is stored as all of its fields.

    Raises:
        SerializationError: a value that cannot be stored.
    """
    fields = overlay.fields
    if overlay.state is not None:
        fields = msgspec.structs.asdict(overlay.state)
    if not fields:
        return None
    try:
        return _ENCODER.encode(fields)
    except (TypeError, RecursionError) as exc:
        raise SerializationError(
            f"the input for workflow instance {instance!r} cannot be stored: {exc}"
        ) from None


def decode_input(
    definition: WorkflowDefinition[Any], blob: bytes | None
) -> InputOverlay:
    """A stored input, converted to the state's field types again."""
    if blob is None:
        return InputOverlay()
    fields = validate_fields(definition.state_type, msgspec.json.decode(blob))
    return InputOverlay(fields=fields)


@final
class EventReceipt(msgspec.Struct, frozen=True, kw_only=True):
    """What storing an event did (``runtime.workflows.post``).

    Attributes:
        workflow_instance_id: the instance.
        event: the event's name.
        event_id: its idempotency key (given, or generated).
        seq: its place in the instance's inbox: events are applied in this order.
        status: ``pending`` (stored, not applied yet), or, for a repeat of an event id
            whose event was applied already, what became of it (see
            :data:`~phronomy.storage.InboxStatus`).
        duplicate: whether the event id had been stored before (nothing new was
            stored; this is the first one's receipt).
        started: whether the post started the instance (``start=`` was given and it
            did not exist).
        then: what happens next: ``applying`` (this runtime runs the instance and
            applies the event now), ``queued`` (another runtime holds the instance and
            applies it from its inbox), ``waiting`` (the instance is failed or requires
            recovery: the event is applied when it is resumed or resolved), or
            ``applied`` (a repeat of an event applied already).
        revision: the revision its application produced (once applied).
        detail: why it was refused, dropped or failed (once applied).
    """

    workflow_instance_id: str
    event: str
    event_id: str
    seq: int
    status: InboxStatus
    duplicate: bool = False
    started: bool = False
    then: Literal["applying", "queued", "waiting", "applied"] = "applying"
    revision: int | None = None
    detail: str | None = None


def receipt_of(
    entry: InboxEntry,
    *,
    duplicate: bool,
    started: bool,
    then: Literal["applying", "queued", "waiting", "applied"],
) -> EventReceipt:
    """The receipt of a stored entry."""
    return EventReceipt(
        workflow_instance_id=entry.workflow_instance_id,
        event=entry.event,
        event_id=entry.event_id,
        seq=entry.seq,
        status=entry.status,
        duplicate=duplicate,
        started=started,
        then="applied" if entry.status != "pending" else then,
        revision=entry.revision,
        detail=entry.detail,
    )


class Feed:
    """The inbox entries one segment takes, in order, and what became of each.

    The segment takes the first entry as its resume event (if it resumes from the
    inbox), then, while it waits for events, each next one; what it recorded is
    consumed by the write that ends the segment. An inbox's numbers have no gaps, so
    the feed knows when an entry it is offered is not the next one: it takes none of
    them and asks (:attr:`gap`) for the store's pending entries after
    :attr:`last_seq` (an offer that is *complete*).
    """

    __slots__ = (
        "_consumed",
        "_judgements",
        "_queue",
        "current",
        "gap",
        "last_seq",
        "on_record",
        "polls_before",
        "refilling",
    )

    def __init__(
        self,
        entries: tuple[InboxEntry, ...] = (),
        *,
        current: InboxEntry | None = None,
        done: tuple[tuple[InboxEntry, Consumption], ...] = (),
        horizon: int | None = None,
        truncated: bool = False,
    ) -> None:
        """Start with the pending *entries* (oldest first), the one being applied
        (*current*), and entries judged already (*done*); *horizon* is the instance's
        last entry number when known (else the first offer is checked with the
        store), *truncated* says the store has more entries than *entries*."""
        self._queue: list[InboxEntry] = list(entries)
        self._consumed: list[tuple[InboxEntry, Consumption]] = list(done)
        self._judgements = {e.seq: (e, c) for e, c in done}
        self.last_seq: int | None = horizon  # (a new instance's feed: nothing else)
        """The number of the last entry offered (``None``: not known yet)."""
        if entries or done or current is not None:
            seqs = [e.seq for e in entries] + [e.seq for e, _ in done]
            if current is not None:
                seqs.append(current.seq)
            if horizon is not None:
                seqs.append(horizon)
            self.last_seq = max(seqs)
        self.gap = truncated
        """Entries may have been stored that the feed was not offered (ask the store
        for those after :attr:`last_seq`)."""
        self.refilling = False
        self.polls_before = 0
        """The inbox polls begun before its segment loaded its entries: a later
        poll's read may predate that load (and list entries consumed before it), so
        only polls begun after it offer it entries (it loaded those of earlier ones)."""
        """The coordinator is asking the store (one ask at a time)."""
        self.current = current
        """The entry being applied now."""
        self.on_record: Callable[[InboxEntry, Consumption], object] | None = None
        """Told what became of each entry as the segment judges it."""

    def offer(
        self,
        entries: tuple[InboxEntry, ...] | list[InboxEntry],
        *,
        complete: bool = False,
    ) -> None:
        """Add newly stored entries in order (ones offered already are ignored).

        Args:
            entries: entries of the instance.
            complete: they are every pending entry after :attr:`last_seq`, as the
                store has them (a refill, or a poll); else an entry that is not the
                next one sets :attr:`gap` and is not taken.
        """
        for entry in sorted(entries, key=lambda e: e.seq):
            last = self.last_seq
            if last is not None and entry.seq <= last:
                continue
            if not complete and (last is None or entry.seq != last + 1):
                self.gap = True
                return
            self._queue.append(entry)
            self.last_seq = entry.seq
            complete = False  # the rest must follow it

    def holds(self, seq: int) -> bool:
        """Whether the entry numbered *seq* is queued here or being applied."""
        current = self.current
        return any(e.seq == seq for e in self._queue) or (
            current is not None and current.seq == seq
        )

    def take(self) -> InboxEntry | None:
        """The next entry to apply (it becomes :attr:`current`), or ``None``."""
        self.current = self._queue.pop(0) if self._queue else None
        return self.current

    def record(self, status: InboxStatus, detail: str | None = None) -> None:
        """Record what became of :attr:`current` (consumed with the segment's end)."""
        entry = self.current
        if entry is None:
            return
        consumption = Consumption(seq=entry.seq, status=status, detail=detail)
        self._consumed.append((entry, consumption))
        self._judgements[entry.seq] = (entry, consumption)
        self.current = None
        if self.on_record is not None:
            self.on_record(entry, consumption)

    @property
    def consumed(self) -> tuple[Consumption, ...]:
        """What the segment's end consumes."""
        return tuple(c for _, c in self._consumed)

    @property
    def judged(self) -> tuple[tuple[InboxEntry, Consumption], ...]:
        """The entries taken, with what became of each."""
        return tuple(self._consumed)

    def judgement(self, seq: int) -> tuple[InboxEntry, Consumption] | None:
        """The entry numbered *seq* with what became of it, if the feed judged it."""
        return self._judgements.get(seq)

    def failing(self, error: BaseException) -> tuple[Consumption, ...]:
        """What a write that fails the segment with *error* consumes: the entry the
        failure is blamed on (:attr:`culprit`, never applied again), and nothing else
        (the others were applied to a state that is not saved: they are applied
        again)."""
        entry = self.culprit
        if entry is None:
            return ()
        detail = f"{type(error).__name__}: {error}"[:1000]
        return (Consumption(seq=entry.seq, status="failed", detail=detail),)

    @property
    def culprit(self) -> InboxEntry | None:
        """The entry a failure of the segment is blamed on: the one being applied, or
        else the last one applied (the state it led to could not be saved)."""
        if self.current is not None:
            return self.current
        return self._consumed[-1][0] if self._consumed else None

    @property
    def idle(self) -> bool:
        """Whether it was offered no entry and knows of none it missed (its segment's
        end has nothing to settle)."""
        return not (self._consumed or self._queue or self.current or self.gap)

    def untaken(self) -> list[InboxEntry]:
        """Entries offered and not applied (still pending once the segment ends)."""
        pending = list(self._queue)
        return pending if self.current is None else [self.current, *pending]

    @property
    def waiting(self) -> int:
        """Entries offered and not taken yet."""
        return len(self._queue)
