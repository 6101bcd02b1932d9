"""How the workflow coordinator moves instances through their inboxes (its
``InboxRouter`` part).

Every event for a durable instance is stored first (``PostOp``, or a claim that posts
in the same transaction). Then: a segment live here applies it at once; a halted
instance nobody runs is resumed here (a *drain*: the segment resumes with the oldest
pending entry); an instance another runtime holds is left to it (its poll finds the
entry). Whoever waits for an event hears what became of it once the segment that
applied it ended (its save consumed the entry), or once the store says so.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Literal, final

import trio

from phronomy.engine import ResultHandle, tracked
from phronomy.errors import (
    BusyError,
    InstanceStateError,
    InvalidInputError,
    NotFoundError,
    RecoveryRequiredError,
    RuntimeShutdownError,
)
from phronomy.instance import Answer, Buffer, Withdraw
from phronomy.storage import InboxOp, PostOp

from ._claims import refusal, release_op
from ._drain import select_entry
from ._events import RESUME
from ._hydration import DurableBase, resume_state
from ._inbox import Feed, receipt_of
from ._messages import (
    InputOverlay,
    PostCommand,
    PostReady,
    ResumeCommand,
    StartCommand,
)
from ._settling import PENDING, Call

if TYPE_CHECKING:
    import outcome

    from phronomy.storage import (
        DeleteOp,
        InboxEntry,
        Lease,
        MarkOp,
        PostOutcome,
        StoredRecord,
    )

    from ._claims import Loaded
    from ._context import Coordination
    from ._continuations import WorkflowInstance
    from ._definition import WorkflowDefinition
    from ._messages import Polled
    from ._session import WorkflowSession

__all__ = ["DRAIN_BACKOFF", "MAX_DRAIN_BACKOFF", "InboxRouter"]

logger = logging.getLogger(__name__)

DRAIN_BACKOFF = 1.0
"""Seconds before the poll resumes an instance again whose resume could not run (a
stored state that does not decode, for example); doubled after each failure."""

MAX_DRAIN_BACKOFF = 300.0
"""The longest wait between two such tries."""

Then = Literal["applying", "queued", "waiting", "applied"]


@final
class InboxRouter:
    """The workflow coordinator's inbox part: posts, the poll, and who applies a
    stored entry (on the dispatcher)."""

    __slots__ = ("_coordinator", "polls")

    def __init__(self, coordinator: Coordination) -> None:
        """Route for *coordinator*."""
        self._coordinator = coordinator
        self.polls = 0
        """Inbox polls begun (see :attr:`Feed.polls_before`)."""

    # --- resuming from the inbox ------------------------------------------------------

    def resume_from_inbox(
        self,
        cmd: ResumeCommand,
        instance: WorkflowInstance,
        loaded: Loaded,
        claim: tuple[Lease, float] | None,
    ) -> None:
        """A durable resume: its event is stored (or was); the segment, if the claim
        was made, resumes with the oldest pending entry; the caller waits for its
        own."""
        iid = cmd.workflow_instance_id
        record, posted = loaded.record, loaded.posted
        own = self._await_own(cmd, record, posted)
        instances = self._coordinator.instances
        if claim is None:  # nothing runs here
            if record is None:
                raise refusal(cmd, record)
            if record.status == "recovery_required":
                raise RecoveryRequiredError(
                    f"workflow instance {iid!r} requires recovery; the event is "
                    "stored and is applied once an operator resolved it",
                    instance_id=iid,
                )
            if own is None:  # a drain that lost a race: another runtime runs it
                outputs = instances.handle(instance, Answer(value=None))
            elif record.status == "failed" and record.lease_owner is None:
                definition = cmd.definition  # raced with a write: try again
                drain: Withdraw[MarkOp | DeleteOp] = Withdraw(
                    after=lambda: self.drain(definition, iid)
                )
                outputs = instances.handle(instance, drain)
            else:  # whoever runs the instance applies it; the caller waits for that
                wait: Withdraw[MarkOp | DeleteOp] = Withdraw()
                outputs = instances.handle(instance, wait)
            self._coordinator.carrier.carry(instance, outputs)
            return
        if record is None:  # a halted result, on a store that did not have it
            assert cmd.halted is not None
            assert own is not None
            state = resume_state(cmd.input, cmd.halted.state)
            rest = tuple(e for e in loaded.pending if e.seq != own.seq)
            feed = Feed(rest, current=own)
            resume = (cmd.halted.phase, cmd.event, cmd.payload)
            base = DurableBase.of(None)
            self._coordinator.segments.register(
                cmd, instance, state, base=base, resume=resume, claim=claim, feed=feed
            )
            return
        decoded = loaded.decoded
        if decoded is None:  # a placeholder that never saved: nothing to resume
            raise NotFoundError(
                f"workflow instance {iid!r} has no durable state to resume (its first "
                f"segment is {record.status} before it saved anything)",
                instance_id=iid,
            )
        selection = select_entry(
            cmd.definition,
            stored=decoded.fields,
            phase=decoded.phase,
            revision=record.revision,
            entries=loaded.pending,
        )
        selection.feed.gap = len(loaded.pending) >= PENDING
        selection.feed.on_record = self._coordinator.settlement.on_judged
        for entry, consumption in selection.feed.judged:
            self._coordinator.settlement.judged(entry, consumption)
        if selection.resume is None:  # nothing can fire: the claim goes back
            consumed = selection.feed.consumed
            release = release_op(cmd, record, claim[0], consumed)
            feed, phase, revision = selection.feed, decoded.phase, record.revision
            withdraw: Withdraw[MarkOp | DeleteOp] = Withdraw(
                write=release,
                after=lambda: self._coordinator.settlement.settled(
                    feed, phase, revision, drain=cmd
                ),
                answered=own is None,
            )
            self._coordinator.carrier.carry(
                instance, instances.handle(instance, withdraw)
            )
            return
        base = DurableBase.of(record)
        self._coordinator.segments.register(
            cmd,
            instance,
            selection.state,
            base=base,
            resume=selection.resume,
            claim=claim,
            feed=selection.feed,
        )

    def _await_own(
        self,
        cmd: ResumeCommand,
        record: StoredRecord | None,
        posted: PostOutcome | None,
    ) -> InboxEntry | None:
        """Register the caller as waiting for its stored event (``None``: a drain).

        Raises:
            InvalidInputError: its event id was used for another event.
            InstanceStateError: the instance is finished or cancelled (nothing stored).
        """
        if posted is None:
            return None
        if posted.outcome == "mismatch":
            assert posted.entry is not None
            raise InvalidInputError(
                f"event_id {posted.entry.event_id!r} of workflow instance "
                f"{cmd.workflow_instance_id!r} was used for another event "
                f"({posted.entry.event!r}, seq {posted.entry.seq}); an event id names "
                "one event"
            )
        if posted.outcome in ("closed", "missing") or posted.entry is None:
            raise refusal(cmd, record)
        own = posted.entry
        self._coordinator.waiters.add(
            cmd.workflow_instance_id, own.event_id, cmd.caller, cmd.wants
        )
        if own.status != "pending":  # a repeat of an event applied earlier
            self._coordinator.settlement.check_applied(
                [((cmd.workflow_instance_id, own.event_id), own)]
            )
        return own

    def post_to_live(self, cmd: StartCommand | ResumeCommand) -> None:
        """An event for an instance this runtime runs already (a durable resume, or a
        post that would start it): store it; the live segment applies it (or the next
        one, once this one halted)."""
        assert cmd.posting is not None
        if isinstance(cmd, StartCommand):  # it exists: the post only posts
            done = tracked(cmd.caller)
            assert done is not None  # a post's caller is the client's handle
            post = PostCommand(
                definition=cmd.definition,
                posting=cmd.posting,
                done=done,
                starting=True,
            )
            self.post(post)
            return
        assert self._coordinator.gateway is not None

        def posted(done: outcome.Outcome[Any]) -> None:
            try:
                result: PostOutcome = done.unwrap()
                self._await_own(cmd, result.row, result)
            except Exception as exc:  # noqa: BLE001 - the caller's error
                cmd.caller.fail(exc)
                return
            assert result.entry is not None
            self._wake(cmd.definition, [result.entry], result.row)

        self._coordinator.gateway.submit(
            PostOp(posting=cmd.posting),
            lambda done: self._coordinator.post_message(
                Call(posted, done), completion=cmd.caller
            ),
        )

    # --- posting (runtime.workflows.post) ---------------------------------------------

    def post(self, cmd: PostCommand) -> None:
        assert self._coordinator.gateway is not None
        self._coordinator.served.setdefault(cmd.definition.name, cmd.definition)
        self._coordinator.gateway.submit(
            PostOp(posting=cmd.posting),
            lambda done: self._coordinator.post_message(
                PostReady(command=cmd, posted=done), completion=cmd.done
            ),
        )

    def apply_post(self, message: PostReady) -> None:
        cmd = message.command
        try:
            posted: PostOutcome = message.posted.unwrap()
            entry = posted.entry
            if cmd.outcome is not None and entry is not None:
                # before it can be applied (the receipt wakes whoever applies it)
                iid = entry.workflow_instance_id
                self._coordinator.waiters.add(
                    iid, entry.event_id, cmd.outcome, "outcome"
                )
                self._coordinator.settlement.judged_before(entry)
            iid = cmd.posting.workflow_instance_id
            receipt = self._receipt(
                cmd.definition, iid, posted, started=False, starting=cmd.starting
            )
        except Exception as exc:  # noqa: BLE001 - the caller's error
            cmd.done.fail(exc)
            if cmd.outcome is not None:
                cmd.outcome.fail(exc)
            return
        cmd.done.complete(receipt)
        if cmd.outcome is not None and receipt.status != "pending":
            assert entry is not None
            self._coordinator.settlement.check_applied(
                [((entry.workflow_instance_id, entry.event_id), entry)]
            )

    def posted(self, cmd: StartCommand, loaded: Loaded) -> Any:
        """A post that would start its instance found it: it only posted (the
        receipt)."""
        assert loaded.posted is not None
        iid = cmd.workflow_instance_id
        # "missing": another runtime's transaction is creating it (busy, not missing)
        return self._receipt(
            cmd.definition, iid, loaded.posted, started=False, starting=True
        )

    def announce_start(self, cmd: StartCommand, loaded: Loaded) -> None:
        """A post that starts its instance made it: the post's caller hears now."""
        posted = loaded.posted
        if posted is not None and posted.entry is not None:
            receipt = receipt_of(
                posted.entry, duplicate=False, started=True, then="applying"
            )
            cmd.caller.complete(receipt)

    def _receipt(
        self,
        definition: WorkflowDefinition[Any],
        iid: str,
        posted: PostOutcome,
        *,
        started: bool,
        starting: bool = False,
    ) -> Any:
        """The receipt of a post (and what it wakes here).

        Raises:
            NotFoundError: no such instance (nothing stored).
            BusyError: *starting* (a post with ``start=``) and the instance is being
                created by a transaction not committed yet (nothing stored).
            InstanceStateError: it is finished or cancelled (nothing stored).
            InvalidInputError: its event id was used for another event.
        """
        entry, row = posted.entry, posted.row
        if posted.outcome == "missing" and starting:  # someone is creating it now
            raise BusyError(
                f"workflow instance {iid!r} is being started; nothing was stored"
            )
        if posted.outcome == "missing":
            raise NotFoundError(
                f"workflow instance {iid!r} does not exist: nothing was stored (post "
                "with start=... to start it with the event)",
                instance_id=iid,
            )
        if posted.outcome == "closed":
            assert row is not None
            raise InstanceStateError(
                f"workflow instance {iid!r} is {row.status} (revision {row.revision}): "
                "it accepts no events, and nothing was stored",
                instance_id=iid,
            )
        assert entry is not None
        assert row is not None
        if posted.outcome == "mismatch":
            raise InvalidInputError(
                f"event_id {entry.event_id!r} of workflow instance {iid!r} was used "
                f"for another event ({entry.event!r}, seq {entry.seq}); nothing was "
                "stored"
            )
        then = self._wake(definition, [entry], row)
        return receipt_of(
            entry, duplicate=posted.outcome == "duplicate", started=started, then=then
        )

    def _wake(
        self,
        definition: WorkflowDefinition[Any],
        entries: list[InboxEntry],
        row: StoredRecord | None,
    ) -> Then:
        """Stored *entries* of one instance: who applies them (and start that here)."""
        if not entries or row is None:
            return "queued"
        iid = row.workflow_instance_id
        if all(e.status != "pending" for e in entries):
            return "applied"
        session = self._coordinator.sessions.get(iid)
        assert self._coordinator.gateway is not None
        if session is not None and session.feed is not None:
            self.offer(session, entries)
            return "applying"
        if row.status in ("failed", "recovery_required"):
            return "waiting"
        if row.lease_owner not in (None, self._coordinator.gateway.leases.owner):
            return "queued"
        instance = self._coordinator.instances.get(iid)
        if instance is not None:
            # a segment is loading here: it takes them once it runs
            self._coordinator.instances.handle(instance, Buffer(items=tuple(entries)))
            return "applying"
        if row.status == "halted":
            self.drain(definition, iid)
            return "applying"
        return "queued"

    def offer(
        self,
        session: WorkflowSession[Any],
        entries: list[InboxEntry],
        *,
        complete: bool = False,
    ) -> None:
        """Offer stored entries to a live segment; if it may have missed some, ask
        the store for its pending entries (one ask at a time)."""
        feed = session.feed
        assert feed is not None
        session.offer(entries, complete=complete)
        if not feed.gap or feed.refilling:
            return
        assert self._coordinator.gateway is not None
        feed.refilling = True
        iid = session.workflow_instance_id
        op = InboxOp(workflow_instance_id=iid, after=feed.last_seq or 0, limit=PENDING)

        def refilled(done: outcome.Outcome[Any]) -> None:
            feed.refilling = False
            if self._coordinator.sessions.get(iid) is not session:
                return  # it ended: the next segment takes them
            try:
                found: tuple[InboxEntry, ...] = done.unwrap()
            except Exception as exc:  # noqa: BLE001 - the next poll offers them
                logger.warning("could not read the inbox of %r: %r", iid, exc)
                return
            feed.gap = len(found) >= PENDING
            self.offer(session, list(found), complete=True)

        self._coordinator.gateway.submit(
            op, lambda done: self._coordinator.post_message(Call(refilled, done))
        )

    # --- the poll ----------------------------------------------------------------------

    def polled(self, message: Polled) -> None:
        """What the inbox poll found (see :class:`~phronomy.workflow.Polled`)."""
        assert self._coordinator.gateway is not None
        by_instance: dict[str, list[InboxEntry]] = {}
        rows: dict[str, tuple[str, str, str | None]] = {}
        for entry, status, workflow, owner in message.pending:
            iid = entry.workflow_instance_id
            by_instance.setdefault(iid, []).append(entry)
            rows[iid] = (status, workflow, owner)
        mine = self._coordinator.gateway.leases.owner
        for iid, entries in by_instance.items():
            status, workflow, owner = rows[iid]
            session = self._coordinator.sessions.get(iid)
            definition = self._coordinator.served.get(workflow)
            if session is not None and owner == mine:
                assert session.feed is not None
                if message.poll > session.feed.polls_before:  # read after its load
                    self.offer(session, entries, complete=True)
            elif owner is None and status == "halted" and definition is not None:
                self.drain(definition, iid, polled=True)
        self._coordinator.settlement.check_applied(list(message.checked))

    # --- draining ---------------------------------------------------------------------

    def drain(
        self, definition: WorkflowDefinition[Any], iid: str, *, polled: bool = False
    ) -> None:
        """Resume a halted instance with its pending entries (unless a segment of it
        is admitted here already; for the poll, unless its last drain failed and the
        retry is not due yet)."""
        coordinator = self._coordinator
        if iid in coordinator.instances:
            return
        if polled and coordinator.stuck.get(iid, (0, 0.0))[1] > trio.current_time():
            return
        caller: ResultHandle[Any] = ResultHandle(f"drain:{iid}")
        caller.on_complete(lambda done: self._drained(iid, done))
        coordinator.segments.begin(
            ResumeCommand(
                definition=definition,
                halted=None,
                event=RESUME,
                payload=None,
                input=InputOverlay(),
                workflow_instance_id=iid,
                owner=object(),
                recursion_limit=coordinator.recursion_limit,
                caller=caller,
            )
        )

    def _drained(self, iid: str, done: ResultHandle[Any]) -> None:
        """A drain that could not run is retried by the poll later and later (its
        entries stay pending: the error is logged, with when the next try is)."""
        stuck = self._coordinator.stuck
        if done.status != "failed" or isinstance(done.error, RuntimeShutdownError):
            stuck.pop(iid, None)  # resumed, or left to the next runtime
            return
        failures = stuck.get(iid, (0, 0.0))[0] + 1
        delay = min(DRAIN_BACKOFF * 2 ** (failures - 1), MAX_DRAIN_BACKOFF)
        stuck[iid] = (failures, trio.current_time() + delay)
        logger.warning(
            "workflow instance %r has pending events but could not be resumed (%r); "
            "the inbox poll tries again in %.0f s",
            iid,
            done.error,
            delay,
        )
