"""How the workflow coordinator settles what its segments and the poll did with inbox
entries (its ``Settlement`` part): whoever waits for an entry hears what became of it
once the store says so.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, final

from phronomy.errors import (
    EventRejectedError,
    InstanceStateError,
    NotFoundError,
    SerializationError,
    TransientError,
    UsageError,
)
from phronomy.storage import SAVE_LOG_DEPTH, Consumption, EntryOp, HistoryOp, LoadOp

from ._claims import UNCHANGED
from ._definition import FINISH
from ._hydration import decode_stored
from ._messages import WorkflowResult
from ._waiters import Applied

if TYPE_CHECKING:
    import outcome

    from phronomy.storage import InboxEntry, InstanceStatus, PostOutcome, StoredRecord

    from ._context import Coordination
    from ._definition import WorkflowDefinition
    from ._inbox import Feed
    from ._messages import ResumeCommand
    from ._session import WorkflowSession

__all__ = [
    "PENDING",
    "Call",
    "Settlement",
    "blames_an_event",
    "refused_posting",
]

PENDING = 100
"""How many pending entries a claim brings along (a segment applies more later)."""


@final
class Settlement:
    """Settles what segments and the poll did with inbox entries: whoever waits for
    an entry hears what became of it once the store says so (on the dispatcher)."""

    __slots__ = ("_coordinator", "on_judged")

    def __init__(self, coordinator: Coordination) -> None:
        """Settle for *coordinator* (its waiters, its store)."""
        self._coordinator = coordinator
        self.on_judged = self.judged
        """:meth:`judged`, bound once: every durable segment's feed calls it."""

    def settled(
        self, feed: Feed, phase: str | None, revision: int, *, drain: ResumeCommand
    ) -> None:
        """A claim given back (nothing could fire) was written: the instance may have
        more entries pending."""
        for entry, consumption in feed.judged:
            self._settle(entry, consumption, phase=phase, revision=revision)
        if len(feed.judged) >= PENDING:
            self._coordinator.inbox.drain(drain.definition, drain.workflow_instance_id)

    def judged(self, entry: InboxEntry, consumption: Consumption) -> None:
        """A segment judged an entry: who wants only that hears now."""
        session = self._coordinator.sessions.get(entry.workflow_instance_id)
        phase = None if session is None else session.machine.current
        self._settle(entry, consumption, phase=phase, final=False)

    def judged_before(self, entry: InboxEntry) -> None:
        """A waiter added for *entry* hears what became of it already: a poll can offer
        a stored entry before its post's completion arrives, to this segment (which
        judged it) or to an earlier one that consumed it (the store says how)."""
        session = self._coordinator.sessions.get(entry.workflow_instance_id)
        if session is None or session.feed is None:
            return  # no segment here: whoever applies it, the poll checks it
        feed = session.feed
        judged = feed.judgement(entry.seq)
        if judged is not None:
            self.judged(*judged)
            return
        if feed.last_seq is None or entry.seq > feed.last_seq or feed.holds(entry.seq):
            return  # this segment applies it later
        assert self._coordinator.gateway is not None
        key = (entry.workflow_instance_id, entry.event_id)
        self._coordinator.gateway.submit(
            EntryOp(workflow_instance_id=key[0], event_id=key[1]),
            lambda done: self._coordinator.post_message(
                Call(functools.partial(self._checked, key=key), done)
            ),
        )

    def _checked(self, done: outcome.Outcome[Any], *, key: tuple[str, str]) -> None:
        try:
            entry = done.unwrap()
        except Exception as exc:  # noqa: BLE001 - the waiters' error
            self._coordinator.waiters.fail(key[0], key[1], exc)
            return
        self.check_applied([(key, entry)])

    def _settle(
        self,
        entry: InboxEntry,
        consumption: Consumption,
        *,
        phase: str | None,
        revision: int | None = None,
        result: WorkflowResult[Any] | None = None,
        final: bool = True,
    ) -> None:
        """Tell the waiters of *entry* what became of it (see :meth:`Waiters.settle`)."""
        self._coordinator.waiters.settle(
            Applied(
                entry=entry,
                status=consumption.status,
                detail=consumption.detail,
                result=result,
                phase=phase,
                revision=revision,
            ),
            final=final,
        )

    def segment_applied(
        self,
        definition: WorkflowDefinition[Any],
        session: WorkflowSession[Any],
        result: WorkflowResult[Any],
    ) -> None:
        """A durable segment ended with its save: what it consumed is settled, and
        entries still pending are applied by the next segment (a halted instance)."""
        feed = session.feed
        if feed is None:
            return
        for entry, consumption in feed.judged:
            self._settle(
                entry,
                consumption,
                phase=result.phase,
                revision=result.revision,
                result=result,
            )
        untaken = feed.untaken()
        if result.status in ("finished", "cancelled"):
            detail = f"the instance was {result.status} before it was applied"
            for entry in untaken:
                self._coordinator.waiters.settle(
                    Applied(entry=entry, status="refused", detail=detail)
                )
        elif result.status == "halted" and (untaken or feed.gap):
            self._coordinator.inbox.drain(definition, result.workflow_instance_id)

    def segment_failing(
        self, session: WorkflowSession[Any], error: BaseException
    ) -> tuple[Consumption, ...]:
        """What the status write of a segment that failed with *error* consumes. The
        entry it is blamed on keeps *error* for its callers until that write returned
        (see :meth:`segment_ended` and :meth:`Waiters.failing`)."""
        feed = session.feed
        if feed is None:
            return ()
        if isinstance(error, EventRejectedError):
            return feed.consumed  # the resume event every guard rejected
        culprit = feed.culprit
        if culprit is None or not blames_an_event(feed, error):
            return ()  # applied again later, from the last durable revision
        iid = session.workflow_instance_id
        self._coordinator.waiters.failing(iid, culprit.event_id, error)
        return feed.failing(error)  # the entry whose action raised: never again

    def segment_ended(
        self,
        definition: WorkflowDefinition[Any],
        session: WorkflowSession[Any],
        error: BaseException,
    ) -> None:
        """A durable segment failed (its status write, if any, is done): waiters of
        the entries it held hear why (a resume event every guard rejected: that)."""
        feed = session.feed
        if feed is None:
            return
        iid = session.workflow_instance_id
        if isinstance(error, EventRejectedError):  # its resume event: consumed
            for entry, consumption in feed.judged:
                self._settle(
                    entry, consumption, phase=error.phase, revision=error.revision
                )
            if feed.untaken():
                self._coordinator.inbox.drain(definition, iid)
            return
        failing = feed.culprit if blames_an_event(feed, error) else None
        held = [e for e, _ in feed.judged] + feed.untaken()
        for entry in held:
            if entry is failing:
                self._coordinator.waiters.fail(iid, entry.event_id, error)
                self._coordinator.waiters.told(iid, entry.event_id)
                continue
            self._coordinator.waiters.fail(
                iid,
                entry.event_id,
                error
                if failing is None
                else InstanceStateError(
                    f"workflow instance {iid!r} failed applying event "
                    f"{failing.event!r} ({type(error).__name__}: {error}) before event "
                    f"{entry.event!r} was applied; it is stored and applied when the "
                    "instance is resumed (send_event)",
                    instance_id=iid,
                ),
            )

    def check_applied(self, checked: list[tuple[tuple[str, str], Any]]) -> None:
        """Entries someone here waits for, as the store has them: settle those that
        another runtime applied (the result is the instance as stored now)."""
        assert self._coordinator.gateway is not None
        for (iid, event_id), entry in checked:
            if entry is None:
                self._coordinator.waiters.fail(
                    iid,
                    event_id,
                    NotFoundError(
                        f"workflow instance {iid!r} and its events were deleted",
                        instance_id=iid,
                    ),
                )
                continue
            if entry.status == "pending":
                continue
            self._coordinator.waiters.settle(
                Applied(entry=entry, status=entry.status, detail=entry.detail),
                final=False,
            )
            if entry.status == "transitioned":
                self._load_result(entry)
            else:
                self._load_phase(entry)

    def _load_phase(self, entry: InboxEntry) -> None:
        """Settle the result waiters of *entry* (not applied: rejected, refused or
        dropped elsewhere) with the phase the instance had at its revision, as the
        runtime that judged it answers its own callers."""
        gateway = self._coordinator.gateway
        assert gateway is not None

        def loaded(done: outcome.Outcome[Any]) -> None:
            try:
                row: StoredRecord | None = done.unwrap()
            except Exception as exc:  # noqa: BLE001 - the waiters' error
                self._coordinator.waiters.fail(
                    entry.workflow_instance_id, entry.event_id, exc
                )
                return
            at = row is not None and row.revision == entry.revision
            self._coordinator.waiters.settle(
                Applied(
                    entry=entry,
                    status=entry.status,
                    detail=entry.detail,
                    phase=row.phase if at and row else None,
                )
            )

        gateway.submit(
            LoadOp(workflow_instance_id=entry.workflow_instance_id),
            lambda done: self._coordinator.post_message(Call(loaded, done)),
        )

    def _load_result(self, entry: InboxEntry) -> None:
        """Settle the result waiters of *entry* (applied elsewhere) with the instance
        as stored now."""
        gateway = self._coordinator.gateway
        assert gateway is not None
        iid = entry.workflow_instance_id

        def decode(row: StoredRecord | None) -> tuple[StoredRecord | None, Any]:
            definition = (
                None if row is None else self._coordinator.served.get(row.workflow)
            )
            if row is None or definition is None:
                return row, None
            return decode_stored(definition, row, resuming=False)

        def loaded(done: outcome.Outcome[Any]) -> None:
            try:
                row, decoded = done.unwrap()
            except Exception as exc:  # noqa: BLE001 - the waiters' error
                self._coordinator.waiters.fail(iid, entry.event_id, exc)
                return
            if row is None or decoded is None:
                self._coordinator.waiters.settle(
                    Applied(entry=entry, status="transitioned")
                )
            elif row.status != "running":
                self._settle_result(entry, row, decoded.fields, row.status)
            else:  # claimed since it saved: the result has the status that save set
                gateway.submit(
                    HistoryOp(workflow_instance_id=iid, limit=SAVE_LOG_DEPTH),
                    lambda done: self._coordinator.post_message(
                        Call(
                            functools.partial(saved, row=row, fields=decoded.fields),
                            done,
                        )
                    ),
                )

        def saved(
            done: outcome.Outcome[Any], *, row: StoredRecord, fields: Any
        ) -> None:
            try:
                log = done.unwrap()
            except Exception as exc:  # noqa: BLE001 - the waiters' error
                self._coordinator.waiters.fail(iid, entry.event_id, exc)
                return
            status = next(
                (s.status for s in log if s.revision == row.revision), row.status
            )
            self._settle_result(entry, row, fields, status)

        gateway.submit(
            LoadOp(workflow_instance_id=iid),
            lambda done: self._coordinator.post_message(Call(loaded, done)),
            finish=decode,
        )

    def _settle_result(
        self,
        entry: InboxEntry,
        row: StoredRecord,
        fields: Any,
        status: InstanceStatus,
    ) -> None:
        result = WorkflowResult(
            state=fields,
            phase=row.phase or FINISH,
            workflow_instance_id=entry.workflow_instance_id,
            revision=row.revision,
            halted=status == "halted",
            workflow=row.workflow,
            status=status,
        )
        self._coordinator.waiters.settle(
            Applied(entry=entry, status="transitioned", result=result)
        )


class Call:
    """A continuation run on the dispatcher with a store operation's outcome (the
    coordinator calls it)."""

    __slots__ = ("done", "fn")

    def __init__(self, fn: Any, done: Any) -> None:
        self.fn, self.done = fn, done

    def __call__(self) -> None:
        self.fn(self.done)


def blames_an_event(feed: Feed, error: BaseException) -> bool:
    """Whether a segment that failed with *error* failed because of an event it
    applied, so that event (:attr:`Feed.culprit`) is never applied again: its action
    raised (the feed was applying it), or the state it led to cannot be saved. Not
    when the segment was cut off or lost its lease, nor when the store failed (a
    save refused by the disk or the server): its events stay pending, applied again
    from the last durable revision."""
    if isinstance(error, (*UNCHANGED, TransientError)):
        return False
    return feed.current is not None or isinstance(error, SerializationError)


def refused_posting(
    posted: PostOutcome | None, error: BaseException
) -> tuple[Consumption, ...]:
    """What the write that gives back a claim refused with *error* consumes: the
    event the claim stored, when the command itself is at fault (a definition that
    does not fit the stored instance, say); otherwise nothing (it stays pending)."""
    if (
        not isinstance(error, UsageError)
        or posted is None
        or posted.outcome != "stored"
        or posted.entry is None
    ):
        return ()
    detail = f"{type(error).__name__}: {error}"[:1000]
    return (Consumption(seq=posted.entry.seq, status="refused", detail=detail),)
