"""The life of one segment: admission, hydration from the store, the session, its end."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, cast

import outcome
import trio

from phronomy.engine import ResultHandle
from phronomy.errors import (
    LeaseLostError,
    RuntimeShutdownError,
)
from phronomy.storage import (
    ClaimOp,
    Lease,
    check_not_quarantined,
    check_startable,
)

from ._claims import (
    UNCHANGED,
    Command,
    Loaded,
    checked_workflow,
    refusal,
    release_op,
    runs_on,
    segment_mark,
)
from ._definition import FINISH
from ._hydration import (
    DurableBase,
    decode_stored,
    resume_state,
    start_state,
)
from ._inbox import Feed
from ._inboxing import Inboxing
from ._messages import (
    CancelAsked,
    InstanceUpdate,
    LeaseLost,
    LoadReady,
    ResumeCommand,
    SegmentResult,
    StartCommand,
    WorkflowResult,
)
from ._persistence import TerminalPersistence
from ._session import WorkflowSession
from ._settling import PENDING, consumed_by_failure, refused_posting

if TYPE_CHECKING:
    from collections.abc import Callable

    from phronomy.durability import DurabilityService
    from phronomy.engine import AdmissionTable, Host, Receiver
    from phronomy.storage import (
        Claimed,
        DeleteOp,
        InboxEntry,
        InstanceStatus,
        MarkOp,
        StoredRecord,
    )

    from ._definition import WorkflowDefinition
    from ._messages import CancelCommand, EventCounters
    from ._retries import RetryPolicy
    from ._state import State
    from ._watch import Watchers

__all__ = ["PERSISTING", "SegmentLifecycle"]

logger = logging.getLogger(__name__)


PERSISTING = "persisting_terminal"
"""The admission state of a segment whose terminal save is in flight."""


class SegmentLifecycle(Inboxing):
    """How the workflow coordinator runs one segment, from its command to its caller.

    A mixin of :class:`~phronomy.workflow.WorkflowCoordinator` (on the dispatcher),
    built on its inbox part.
    """

    gateway: DurabilityService | None
    max_snapshot_bytes: int
    admissions: AdmissionTable
    counters: EventCounters
    sessions: dict[str, WorkflowSession[Any]]
    watchers: Watchers
    cancels: dict[str, list[CancelCommand]]
    served: dict[str, WorkflowDefinition[Any]]
    retry: RetryPolicy | None
    early: dict[str, tuple[object, list[InboxEntry]]]

    if TYPE_CHECKING:

        @property
        def engine(self) -> Host: ...

        def admit(self) -> None: ...

        def _segment_cancelled(
            self,
            iid: str,
            caller: ResultHandle[Any],
            result: WorkflowResult[Any],
            reason: str | None = None,
        ) -> None: ...

        def _cancel_next(self, iid: str) -> None: ...

    def _begin(self, cmd: Command) -> None:
        iid = cmd.workflow_instance_id
        admissions = self.admissions
        if cmd.posting is not None and admissions.state(iid) in admissions.busy_states:
            # live here already: its event is stored, then the live segment applies it
            self._post_to_live(cmd)
            return
        try:
            self.admit()
            admissions.admit(iid, cmd.owner, label=cmd.definition.name)
            self.served.setdefault(cmd.definition.name, cmd.definition)
        except Exception as exc:  # noqa: BLE001 - the caller's error (busy, shutting down)
            cmd.caller.fail(exc)
            return
        try:
            durable = isinstance(cmd, ResumeCommand) or cmd.explicit_id
            if self.gateway is not None and durable:
                self._load(cmd)
            elif isinstance(cmd, StartCommand):
                state = start_state(cmd.definition, cmd.input, None)
                self._register(cmd, state, base=None, resume=None)
            else:
                # resume by id requires a store (checked by the client)
                assert cmd.halted is not None
                state = resume_state(cmd.input, cmd.halted.state)
                resume = (cmd.halted.phase, cmd.event, cmd.payload)
                self._register(cmd, state, base=None, resume=resume)
        except Exception as exc:  # noqa: BLE001 - the caller's error
            self._abort(cmd, exc)

    def _abort(self, cmd: Command, error: BaseException) -> None:
        self.admissions.release(cmd.workflow_instance_id, owner=cmd.owner)
        cmd.caller.fail(error)

    def _load(self, cmd: Command) -> None:
        """Load the instance and, when its status lets the command run, claim its
        lease in the same write (the common case: one store round trip)."""
        gateway = self.gateway
        assert gateway is not None
        iid = cmd.workflow_instance_id
        definition = cmd.definition
        resuming = isinstance(cmd, ResumeCommand)
        statuses, create, placeholders = runs_on(cmd)
        op = ClaimOp(
            workflow_instance_id=iid,
            workflow=definition.name,
            lease_owner=gateway.leases.owner,
            ttl_ms=gateway.leases.ttl_ms,
            statuses=statuses,
            create=create,
            placeholders=placeholders,
            post=cmd.posting,
            pending=PENDING if resuming or cmd.posting is not None else 0,
        )
        sent = trio.current_time()

        def decode(claimed: Claimed) -> Loaded:
            # Runs in the store's worker thread: decoding stays off the dispatcher.
            # Never raises: a claim that was made must be released.
            record, decoded, problem = claimed.row, None, None
            try:
                if record is None or checked_workflow(cmd, record):
                    decoded = decode_stored(definition, record, resuming=resuming)[1]
                # else a new execution of a key: its input is its whole state
            except Exception as exc:  # noqa: BLE001 - reported on the dispatcher
                problem = exc
            return Loaded(
                record=record,
                decoded=decoded,
                problem=problem,
                epoch=claimed.epoch,
                pending=claimed.pending,
                posted=claimed.posted,
            )

        def loaded(done: outcome.Outcome[Any]) -> None:
            message = LoadReady(command=cmd, loaded=done, sent=sent)
            self._continue_with(message, cmd, "loading")

        gateway.submit(op, loaded, finish=decode)

    def _continue_with(self, message: Any, cmd: Command, what: str) -> None:
        """Post the continuation of *cmd*'s admission (or fail its caller)."""
        if not self.post_message(message, completion=cmd.caller):
            cmd.caller.fail(
                RuntimeShutdownError(
                    f"the runtime shut down while {what} workflow instance "
                    f"{cmd.workflow_instance_id!r}"
                )
            )

    def _apply_load(self, message: LoadReady) -> None:
        cmd = message.command
        try:
            loaded: Loaded = message.loaded.unwrap()
        except Exception as exc:  # noqa: BLE001 - the caller's error
            self._abort(cmd, exc)
            return
        assert self.gateway is not None
        claim = None
        if loaded.epoch is not None:
            lease = Lease(owner=self.gateway.leases.owner, epoch=loaded.epoch)
            claim = (lease, message.sent)
        error: Exception | None = loaded.problem
        if error is None:
            try:
                self._continue_loaded(cmd, loaded, claim)
            except Exception as exc:  # noqa: BLE001 - the caller's error
                error = exc
            else:
                return
        self._refuse_loaded(cmd, loaded, claim, error)

    def _refuse_loaded(
        self,
        cmd: Command,
        loaded: Loaded,
        claim: tuple[Lease, float] | None,
        error: BaseException,
    ) -> None:
        """The command does not run: its claim (if any) is given back before its
        caller hears why. The event the claim stored for it is refused in the same
        write when the command itself is at fault (a definition that does not fit the
        stored instance, say); otherwise it stays pending for the next segment."""
        if claim is None:
            self._abort(cmd, error)
            return
        self.admissions.release(cmd.workflow_instance_id, owner=cmd.owner)
        consumed = refused_posting(loaded.posted, error)
        release = release_op(cmd, loaded.record, claim[0], consumed)
        self._write_then_fail(release, cmd.caller, error)

    def _continue_loaded(
        self, cmd: Command, loaded: Loaded, claim: tuple[Lease, float] | None
    ) -> None:
        """Validate the loaded instance, then run the segment on the claim the load
        made; a row the load did not claim refuses the command (the row says why)."""
        definition = cmd.definition
        record, decoded = loaded.record, loaded.decoded
        assert self.gateway is not None
        check_not_quarantined(self.gateway.store.identity, cmd.workflow_instance_id)
        if record is not None:
            check_startable(record, checked_workflow(cmd, record))
        if isinstance(cmd, ResumeCommand):
            self._resume_from_inbox(cmd, loaded, claim)
            return
        if claim is None:
            if cmd.posting is not None:
                self._posted(cmd, loaded)  # a post to an instance that exists
                return
            if cmd.if_exists == "return" and record is not None and decoded is not None:
                self._return_stored(cmd, record, decoded)  # never claimed
                return
            raise refusal(cmd, record)
        # Start hydration: stored fields, overridden by the input; the stored phase is
        # ignored (the segment restarts at the entry point).
        stored = decoded.fields if decoded is not None else None
        state = start_state(definition, cmd.input, stored)
        self._announce_start(cmd, loaded)
        pending = loaded.pending
        feed = Feed(
            pending,
            horizon=0 if record is None else None,  # a new instance's first entry
            truncated=len(pending) >= PENDING,
        )
        base = DurableBase.of(record)
        self._register(cmd, state, base=base, resume=None, claim=claim, feed=feed)

    def _lease_lost(self, message: LeaseLost) -> None:
        session: WorkflowSession[Any] = message.session
        if self.sessions.get(session.workflow_instance_id) is not session:
            return  # it ended meanwhile
        if session.lifecycle == "running":
            # A terminal save in flight is fenced by the store: it decides.
            session.finish_with_error(message.error)

    def _return_stored(
        self, cmd: StartCommand, record: StoredRecord, decoded: Any
    ) -> None:
        """``if_exists="return"``: the stored result, without running anything."""
        self.admissions.release(cmd.workflow_instance_id, owner=cmd.owner)
        phase = record.phase or FINISH
        cmd.caller.complete(
            WorkflowResult(
                state=decoded.fields,
                phase=phase,
                workflow_instance_id=cmd.workflow_instance_id,
                revision=record.revision,
                halted=record.status in ("halted", "running") and phase != FINISH,
                workflow=cmd.definition.name,
                status=record.status,
            )
        )

    def _register(
        self,
        cmd: Command,
        state: State,
        *,
        base: DurableBase | None,
        resume: tuple[str, str, Any] | None,
        claim: tuple[Lease, float] | None = None,
        feed: Feed | None = None,
    ) -> None:
        """Create the segment's session; *base* is what a durable segment started from,
        *claim* its lease and when the claim was sent, *feed* its inbox entries."""
        iid = cmd.workflow_instance_id
        policy = None
        if base is not None:
            gateway = self.gateway
            assert gateway is not None
            admissions, owner = self.admissions, cmd.owner
            policy = TerminalPersistence(
                gateway=gateway,
                on_persisting=lambda: admissions.mark(iid, PERSISTING, owner=owner),
                instance_id=iid,
                workflow=cmd.definition.name,
                version=cmd.definition.version,
                expected_revision=base.expected,
                max_snapshot_bytes=self.max_snapshot_bytes,
                lease=None if claim is None else claim[0],
            )
        held = None
        session: WorkflowSession[Any]
        if claim is not None:
            assert self.gateway is not None
            lease, sent = claim

            def lost(error: LeaseLostError) -> None:
                self.post_message(LeaseLost(session=session, error=error))

            def cancel(reason: str | None) -> None:  # asked for by another runtime
                self.post_message(CancelAsked(session=session, reason=reason))

            held = self.gateway.leases.hold(
                iid, lease.epoch, lost, cancel, claimed_at=sent
            )
        session = WorkflowSession(
            self.engine,
            cmd.definition,
            state,
            workflow_instance_id=iid,
            recursion_limit=cmd.recursion_limit,
            revision=base.expected if base is not None else None,
            policy=policy,
            observer=cmd.observer,
            resume=resume,
            counters=self.counters,
            watchers=self.watchers,
            lease=held,
            feed=feed,
            retry=self.retry,
        )
        if feed is not None:
            feed.on_record = self._judged
        self.admissions.bind(iid, cmd.owner, session.id, caller=cmd.caller)
        self.sessions[iid] = session
        poster, early = self.early.pop(iid, (None, []))
        if poster is not cmd.owner:
            early = []  # stored while another segment of it loaded (that one ended)
        if feed is not None and (feed.gap or early):
            self._offer(session, early)  # stored while this segment loaded
        coordinator = cast("Receiver", self)  # a registered receiver
        waiter = self.engine.register_session(session, receiver=coordinator)
        waiting = self.cancels.get(iid)
        if waiting:  # cancelled while it loaded: it ends before running anything
            session.cancel(waiting[0].reason)
        waiter.on_complete(lambda done: self._finalize(cmd, base, session, done, claim))

    def _finalize(
        self,
        cmd: Command,
        base: DurableBase | None,
        session: WorkflowSession[Any],
        done: ResultHandle[Any],
        claim: tuple[Lease, float] | None,
    ) -> None:
        # Release before settling the caller: a caller that immediately starts the
        # same instance again is admitted.
        iid = cmd.workflow_instance_id
        self.admissions.release(iid, owner=cmd.owner)
        if claim is not None and self.gateway is not None:
            self.gateway.leases.drop(iid)
        if self.sessions.get(iid) is session:
            del self.sessions[iid]
        inbox = isinstance(cmd, ResumeCommand) and session.feed is not None
        if done.status == "completed":
            segment: SegmentResult = done.result_nowait()
            result = WorkflowResult(
                state=segment.state,
                phase=segment.phase,
                workflow_instance_id=iid,
                revision=segment.revision if base is not None else None,
                halted=segment.status == "halted",
                workflow=cmd.definition.name,
                status=segment.status,
            )
            self._watched(
                iid, result.status, result.phase, result.state, result.revision
            )
            if segment.status == "cancelled":
                reason = session.cancel_reason
                self._segment_cancelled(iid, cmd.caller, result, reason)
            elif not inbox:
                cmd.caller.complete(result)
            self._segment_applied(cmd.definition, session, result)
            if inbox and cmd.posting is None:
                cmd.caller.complete(None)  # a drain: nobody waits for it as such
        else:
            error = done.error
            assert error is not None
            if not isinstance(error, UNCHANGED):
                machine, revision = session.machine, base.expected if base else None
                self._watched(iid, "failed", machine.current, machine.state, revision)
            mark = None
            if base is not None and self.gateway is not None:
                lease = None if claim is None else claim[0]
                mark = segment_mark(
                    cmd, base, error, lease, consumed_by_failure(session, error)
                )
            caller = ResultHandle[Any](f"ended:{iid}") if inbox else cmd.caller

            def ended() -> None:
                caller.fail(error)
                self._segment_ended(cmd.definition, session, error)

            if mark is None:
                ended()
            else:
                self._write_then(mark, ended)
        self._cancel_next(iid)  # cancels that waited for the segment to end

    def _write_then_fail(
        self, op: MarkOp | DeleteOp, caller: ResultHandle[Any], error: BaseException
    ) -> None:
        """Write the row's status after a segment that did not end with its save; the
        caller hears of the failure once the row says it (at shutdown: at once)."""
        if isinstance(error, RuntimeShutdownError):
            assert self.gateway is not None
            what = f"write the status of workflow instance {op.workflow_instance_id!r}"
            self.gateway.submit_quietly(op, what)
            caller.fail(error)
            return
        self._write_then(op, lambda: caller.fail(error))

    def _write_then(self, op: MarkOp | DeleteOp, then: Callable[[], object]) -> None:
        """Write *op* (a status, or a claim given back), then call *then* (whether the
        write landed or not: a failure is logged)."""
        assert self.gateway is not None
        what = f"write the status of workflow instance {op.workflow_instance_id!r}"

        def written(done: outcome.Outcome[Any]) -> None:
            if isinstance(done, outcome.Error) or done.unwrap() is False:
                logger.warning("could not %s: %r", what, done)
            then()

        self.gateway.submit(op, written)

    def _watched(
        self,
        iid: str,
        status: InstanceStatus,
        phase: str | None,
        state: Any,
        revision: int | None,
    ) -> None:
        if self.watchers.watched(iid):
            self.watchers.publish(
                InstanceUpdate(
                    workflow_instance_id=iid,
                    status=status,
                    phase=phase,
                    state=state,
                    revision=revision,
                )
            )
