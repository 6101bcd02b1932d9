"""The operations of the differential store model (test_store_differential.py).

Each is relative to the state it runs on, so that both successes and conflicts happen:
revisions (``at``) are offsets from the instance's current revision (``None``: none
expected), leases are its holder's (or a named owner's) at an offset from its epoch,
consumed inbox entries are near the instance's pending ones (or its newest). Each
becomes a StoreOp when it runs (``op(model)``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Protocol, get_args

from hypothesis import strategies as st

from phronomy.storage import (
    EVENT_OUTCOMES,
    BeginOp,
    ClaimOp,
    Consumption,
    DeleteOp,
    EntryOp,
    FindWriteOp,
    FireOp,
    HistoryOp,
    InboxEntry,
    InboxOp,
    InboxStatus,
    InstanceStatus,
    Lease,
    ListOp,
    LoadOp,
    MarkOp,
    NextDueOp,
    PollOp,
    Posting,
    PostOp,
    RecoverOp,
    RenewOp,
    RequestCancelOp,
    SaveOp,
    SaveRequest,
    StoredRecord,
    StoreOp,
    TerminateOp,
    TimersOp,
    TimerSpec,
)

IDS = ("a", "b", "c")
OWNERS = ("A", "B")
WORKFLOWS = ("wf", "other", "")
STATUSES: tuple[InstanceStatus, ...] = get_args(InstanceStatus)
EVENT_IDS = ("e1", "e2", "e3", "e4")
"""Few event ids: repeats (and, with another event, mismatches) happen often."""
EVENTS = (("go", b"1", None, None), ("go", b"2", None, None), ("stop", b"1", b"{}", 1))
"""The events posted: (name, payload, input, expected revision)."""
TIMER_NAMES = ("t1", "t2")
LATER_MS = 3_600_000
"""The delay of a timer not due within an example (the other delay is 0: due at once)."""
LIVE_MS = 60_000
"""The ttl of a live lease (the other ttl is 0: expired at once)."""

_write_ids = itertools.count()


class Model(Protocol):
    """What the operations read of the model's state."""

    sent: dict[str, list[str]]
    batch: int

    @property
    def rows(self) -> dict[str, StoredRecord | None]: ...
    @property
    def inboxes(self) -> dict[str, tuple[InboxEntry, ...]]: ...

    def revision(self, iid: str, at: int | None) -> int | None: ...
    def lease(self, iid: str, held: Held | None) -> Lease | None: ...
    def expiry_ties(self, limit: int) -> bool: ...


@dataclass(frozen=True)
class Held:
    """A lease to present: *owner*'s (``None``: the instance's holder, or its last
    claimer) at the holder's epoch plus *shift*."""

    owner: str | None
    shift: int


@dataclass(frozen=True)
class Event:
    """A posting of ``EVENTS[kind]`` under *event_id*."""

    event_id: str
    kind: int

    def posting(self, iid: str) -> Posting:
        name, payload, input_, expected = EVENTS[self.kind]
        return Posting(
            workflow_instance_id=iid,
            event_id=self.event_id,
            event=name,
            payload=payload,
            input=input_,
            expected_revision=expected,
        )


@dataclass(frozen=True)
class Consume:
    """A consumption of the instance's *pick*-th pending entry (by seq; its newest
    entry when none is pending, seq 1 when it has none) shifted by *shift*."""

    pick: int
    shift: int
    status: InboxStatus
    detail: str | None

    def consumption(self, m: Model, iid: str) -> Consumption:
        entries = m.inboxes[iid]  # newest first
        pending = sorted(e.seq for e in entries if e.status == "pending")
        if pending:
            seq = pending[self.pick % len(pending)]
        else:
            seq = entries[0].seq if entries else 1
        return Consumption(seq=seq + self.shift, status=self.status, detail=self.detail)


def _consumed(
    m: Model, iid: str, consumed: tuple[Consume, ...]
) -> tuple[Consumption, ...]:
    return tuple(c.consumption(m, iid) for c in consumed)


@dataclass(frozen=True)
class Arm:
    """A timer a save arms: due at once, or not within the example."""

    name: str
    due: bool

    def spec(self) -> TimerSpec:
        return TimerSpec(
            name=self.name,
            delay_ms=0 if self.due else LATER_MS,
            event="go",
            payload=b"1",
        )


@dataclass(frozen=True)
class Load:
    iid: str

    def op(self, m: Model) -> StoreOp:
        return LoadOp(workflow_instance_id=self.iid)


@dataclass(frozen=True)
class List:
    status: InstanceStatus | None
    limit: int
    after: str | None
    workflow: str | None

    def op(self, m: Model) -> StoreOp:
        return ListOp(
            status=self.status,
            limit=self.limit,
            after=self.after,
            workflow=self.workflow,
        )


@dataclass(frozen=True)
class History:
    iid: str
    limit: int

    def op(self, m: Model) -> StoreOp:
        return HistoryOp(workflow_instance_id=self.iid, limit=self.limit)


@dataclass(frozen=True)
class FindWrite:
    iid: str
    pick: int | None  # one of the write ids sent for the instance; None: a new one

    def op(self, m: Model) -> StoreOp:
        sent = m.sent.get(self.iid, [])
        write_id = (
            sent[self.pick % len(sent)] if sent and self.pick is not None else "unsent"
        )
        return FindWriteOp(workflow_instance_id=self.iid, write_id=write_id)


@dataclass(frozen=True)
class Begin:
    iid: str
    workflow: str
    at: int | None
    owner: str | None
    ttl_ms: int
    only_new: bool

    def op(self, m: Model) -> StoreOp:
        return BeginOp(
            workflow_instance_id=self.iid,
            workflow=self.workflow,
            expected_revision=m.revision(self.iid, self.at),
            lease_owner=self.owner,
            ttl_ms=self.ttl_ms,
            only_new=self.only_new,
        )


@dataclass(frozen=True)
class Claim:
    iid: str
    workflow: str
    owner: str
    ttl_ms: int
    statuses: tuple[InstanceStatus, ...]
    create: bool
    placeholders: bool
    post: Event | None = None
    pending: int = 0

    def op(self, m: Model) -> StoreOp:
        return ClaimOp(
            workflow_instance_id=self.iid,
            workflow=self.workflow,
            lease_owner=self.owner,
            ttl_ms=self.ttl_ms,
            statuses=self.statuses,
            create=self.create,
            placeholders=self.placeholders,
            post=None if self.post is None else self.post.posting(self.iid),
            pending=self.pending,
        )


@dataclass(frozen=True)
class Save:
    iid: str
    at: int | None
    status: InstanceStatus
    workflow: str
    lease: Held | None
    detail: str | None
    version: str
    consumed: tuple[Consume, ...] = ()
    arm: tuple[Arm, ...] = ()
    disarm: tuple[str, ...] = ()

    def op(self, m: Model) -> StoreOp:
        write_id = f"w{next(_write_ids)}"
        m.sent.setdefault(self.iid, []).append(write_id)
        request = SaveRequest(
            workflow_instance_id=self.iid,
            expected_revision=m.revision(self.iid, self.at),
            snapshot=f'{{"fields":{{"w":"{write_id}"}}}}'.encode(),
            write_id=write_id,
            status=self.status,
            phase="p" if self.status == "halted" else "__end__",
            workflow=self.workflow,
            definition_version=self.version,
            detail=self.detail,
            lease=m.lease(self.iid, self.lease),
            consumed=_consumed(m, self.iid, self.consumed),
            arm=tuple({a.name: a.spec() for a in self.arm}.values()),
            disarm=self.disarm,
        )
        return SaveOp(request=request)


@dataclass(frozen=True)
class Segment:
    """A segment's save (mostly accepted): at the instance's revision, under its lease
    if it has one, consuming entries."""

    iid: str
    status: InstanceStatus
    consumed: tuple[Consume, ...]

    def op(self, m: Model) -> StoreOp:
        row = m.rows[self.iid]
        held = None if row is None or row.lease_owner is None else Held(None, 0)
        save = Save(self.iid, 0, self.status, "wf", held, None, "", self.consumed)
        return save.op(m)


@dataclass(frozen=True)
class Mark:
    iid: str
    status: InstanceStatus
    at: int | None
    detail: str | None
    create: bool
    workflow: str
    lease: Held | None
    consumed: tuple[Consume, ...] = ()

    def op(self, m: Model) -> StoreOp:
        expected, lease = m.revision(self.iid, self.at), m.lease(self.iid, self.lease)
        return MarkOp(
            workflow_instance_id=self.iid,
            status=self.status,
            expected_revision=expected,
            detail=self.detail,
            create=self.create,
            workflow=self.workflow,
            lease=lease,
            consumed=_consumed(m, self.iid, self.consumed),
        )


@dataclass(frozen=True)
class Delete:
    iid: str
    at: int
    closed_only: bool = False

    def op(self, m: Model) -> StoreOp:
        expected = m.revision(self.iid, self.at)
        return DeleteOp(
            workflow_instance_id=self.iid,
            expected_revision=expected or 0,
            closed_only=self.closed_only,
        )


@dataclass(frozen=True)
class Terminate:
    iid: str
    at: int
    status: str

    def op(self, m: Model) -> StoreOp:
        expected = m.revision(self.iid, self.at)
        return TerminateOp(
            workflow_instance_id=self.iid,
            expected_revision=expected or 0,
            status=self.status,  # type: ignore[arg-type]
            detail="terminated",
        )


@dataclass(frozen=True)
class Renew:
    owner: str
    iids: tuple[str, ...]
    ttl_ms: int

    def op(self, m: Model) -> StoreOp:
        return RenewOp(owner=self.owner, instance_ids=self.iids, ttl_ms=self.ttl_ms)


@dataclass(frozen=True)
class Recover:
    limit: int
    max_takeovers: int

    def op(self, m: Model) -> StoreOp:
        # Among leases that expired in the same millisecond, which comes first is not
        # part of the contract: a limit that would cut between them (or that a batch's
        # earlier operations could make so) takes them all.
        limit = self.limit if m.batch == 1 and not m.expiry_ties(self.limit) else 100
        return RecoverOp(limit=limit, max_takeovers=self.max_takeovers)


@dataclass(frozen=True)
class Cancel:
    iid: str
    reason: str | None

    def op(self, m: Model) -> StoreOp:
        return RequestCancelOp(workflow_instance_id=self.iid, reason=self.reason)


@dataclass(frozen=True)
class Post:
    iid: str
    event: Event

    def op(self, m: Model) -> StoreOp:
        return PostOp(posting=self.event.posting(self.iid))


@dataclass(frozen=True)
class Inbox:
    iid: str
    pending_only: bool
    after: int | None  # after one of the instance's seqs; None: 0
    limit: int

    def op(self, m: Model) -> StoreOp:
        seqs = sorted(e.seq for e in m.inboxes[self.iid])
        after = seqs[self.after % len(seqs)] if seqs and self.after is not None else 0
        return InboxOp(
            workflow_instance_id=self.iid,
            pending_only=self.pending_only,
            after=after,
            limit=self.limit,
        )


@dataclass(frozen=True)
class Entry:
    iid: str
    event_id: str

    def op(self, m: Model) -> StoreOp:
        return EntryOp(workflow_instance_id=self.iid, event_id=self.event_id)


@dataclass(frozen=True)
class Timers:
    iid: str

    def op(self, m: Model) -> StoreOp:
        return TimersOp(workflow_instance_id=self.iid)


@dataclass(frozen=True)
class NextDue:
    owner: str

    def op(self, m: Model) -> StoreOp:
        return NextDueOp(owner=self.owner, workflows=WORKFLOWS[:2])


@dataclass(frozen=True)
class Fire:
    """Fire every due timer an owner may (which of several due in the same
    millisecond come first is the clocks' business: the stores' clocks differ)."""

    owner: str

    def op(self, m: Model) -> StoreOp:
        return FireOp(owner=self.owner, workflows=WORKFLOWS[:2], limit=100)


@dataclass(frozen=True)
class Poll:
    owner: str
    limit: int

    def op(self, m: Model) -> StoreOp:
        return PollOp(owner=self.owner, limit=self.limit)


ids = st.sampled_from(IDS)
owners = st.sampled_from(OWNERS)
workflows = st.sampled_from(WORKFLOWS)
statuses = st.sampled_from(STATUSES)
ttls = st.sampled_from([0, LIVE_MS])
offsets = st.sampled_from([0, 0, -1, 1])  # mostly the current revision: successes
revisions = st.sampled_from([0, 0, None, -1, 1])
limits = st.sampled_from([1, 2, 100])
leases = st.one_of(
    st.none(),
    st.just(Held(None, 0)),  # the holder's: accepted while it holds the row
    st.builds(Held, st.one_of(st.none(), owners), st.sampled_from([0, -1, 1])),
)
details = st.sampled_from([None, "why"])
events = st.builds(Event, st.sampled_from(EVENT_IDS), st.integers(0, len(EVENTS) - 1))
consumptions = st.lists(  # near the pending entries, with every outcome
    st.builds(Consume, st.integers(0, 3), st.sampled_from([0, 0, 0, -1, 1]),
              st.sampled_from(sorted(EVENT_OUTCOMES)), details),
    min_size=1,
    max_size=3,
).map(tuple)  # fmt: skip
consumed = st.one_of(st.just(()), consumptions, consumptions)  # mostly some
READS = st.one_of(
    st.builds(Load, ids),
    st.builds(List, st.one_of(st.none(), statuses), limits, st.one_of(st.none(), ids),
              st.one_of(st.none(), workflows)),
    st.builds(History, ids, limits),
    st.builds(FindWrite, ids, st.one_of(st.none(), st.integers(0, 5))),
)  # fmt: skip
INBOX_READS = st.one_of(
    st.builds(Inbox, ids, st.booleans(), st.one_of(st.none(), st.integers(0, 3)),
              limits),
    st.builds(Entry, ids, st.sampled_from(EVENT_IDS)),
    st.builds(Poll, owners, limits),
)  # fmt: skip
arms = st.lists(
    st.builds(Arm, st.sampled_from(TIMER_NAMES), st.booleans()), max_size=2
).map(tuple)
SAVES = st.builds(
    Save,
    ids,
    revisions,
    statuses,
    workflows,
    leases,
    details,
    st.sampled_from(["", "v2"]),
    consumed,
    arms,
    st.lists(st.sampled_from(TIMER_NAMES), max_size=2, unique=True).map(tuple),
)
TIMERS = st.one_of(
    st.builds(Timers, ids),
    st.builds(NextDue, owners),
    st.builds(Fire, owners),
)
POSTS = st.builds(Post, ids, events)
BEGINS = st.builds(
    Begin, ids, workflows, revisions, st.one_of(st.none(), owners), ttls, st.booleans()
)
RECOVERS = st.builds(Recover, st.sampled_from([1, 100]), st.sampled_from([1, 2, 5]))
OPERATIONS = st.one_of(  # claims, saves, posts and sweeps the most: deeper histories
    READS,
    INBOX_READS,
    BEGINS,
    BEGINS,
    st.builds(Claim, ids, workflows, owners, ttls,
              st.lists(statuses, max_size=3, unique=True).map(tuple), st.booleans(),
              st.booleans(), st.one_of(st.none(), events),
              st.sampled_from([0, 1, 10])),
    SAVES,
    SAVES,
    SAVES,
    st.builds(Segment, ids, statuses, consumptions),
    st.builds(Segment, ids, statuses, st.just(())),  # a lease holder's save that lands
    POSTS,
    POSTS,
    POSTS,
    st.builds(Mark, ids, statuses, revisions, details, st.booleans(), workflows, leases,
              consumed),
    st.one_of(  # a delete ends a history: rarer
        st.builds(Delete, ids, offsets, st.booleans()),
        st.builds(Renew, owners, st.lists(ids, min_size=1, max_size=3).map(tuple), ttls),
        st.builds(Terminate, ids, offsets, st.sampled_from(["cancelled", "failed"])),
    ),
    RECOVERS,
    RECOVERS,
    st.builds(Cancel, ids, st.sampled_from([None, "stop"])),
    TIMERS,
    TIMERS,
)  # fmt: skip
Operation = (
    Load | List | History | FindWrite | Begin | Claim | Save | Segment | Mark | Delete
    | Terminate | Renew | Recover | Cancel | Post | Inbox | Entry | Poll | Timers | NextDue | Fire
)  # fmt: skip
