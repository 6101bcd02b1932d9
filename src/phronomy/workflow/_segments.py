"""The life of one segment: admission, hydration from the store, the session, its end."""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any, cast, final

import trio

from phronomy.engine import tracked
from phronomy.errors import (
    RuntimeShutdownError,
    WorkflowCancelledError,
)
from phronomy.instance import (
    BUSY,
    Admit,
    Answer,
    Claim,
    End,
    LeaseLost,
    Load,
    Persist,
    Refuse,
    Run,
)
from phronomy.storage import (
    ClaimOp,
    Lease,
    check_not_quarantined,
    check_startable,
)

from ._checkpoint import rebase
from ._claims import (
    UNCHANGED,
    Command,
    Loaded,
    checked_workflow,
    decode_claim,
    refusal,
    release_op,
    runs_on,
    segment_mark,
    stored_result,
)
from ._continuations import LeaseLost as LeaseLostMessage, LoadReady
from ._hydration import (
    DurableBase,
    resume_state,
    start_state,
)
from ._inbox import Feed
from ._messages import (
    InstanceUpdate,
    ResumeCommand,
    StartCommand,
    WorkflowResult,
)
from ._persistence import TerminalPersistence
from ._session import WorkflowSession
from ._settling import PENDING, refused_posting

if TYPE_CHECKING:
    import outcome

    from phronomy.engine import Receiver, SessionEnded
    from phronomy.storage import (
        DeleteOp,
        InstanceStatus,
        MarkOp,
    )

    from ._context import Coordination
    from ._continuations import WorkflowInstance
    from ._state import State

__all__ = ["Segments"]

logger = logging.getLogger(__name__)

LOAD, PERSIST = Load(), Persist()  # events without fields: one of each will do


@final
class Segments:
    """How the workflow coordinator runs one segment, from its command to its caller:
    admission, the load that claims its lease, the session, its end (on the
    dispatcher)."""

    __slots__ = ("_coordinator", "_ended", "_persisting", "_start")

    def __init__(self, coordinator: Coordination) -> None:
        """Run segments for *coordinator*."""
        self._coordinator = coordinator
        # bound once: every segment passes them on (a closure or a partial each was
        # several objects per segment for the cyclic GC)
        self._start = self._run_session
        self._ended = self._session_ended
        self._persisting = self._persist

    def begin(self, cmd: Command) -> None:
        iid = cmd.workflow_instance_id
        current = self._coordinator.instances.get(iid)
        if cmd.posting is not None and current is not None and current.state in BUSY:
            # live here already: its event is stored, then the live segment applies it
            self._coordinator.inbox.post_to_live(cmd)
            return
        try:
            self._coordinator.admit()
            admit = Admit(owner=cmd.owner, label=cmd.definition.name, caller=cmd.caller)
            instance, _ = self._coordinator.instances.admit(iid, admit)
            self._coordinator.served.setdefault(cmd.definition.name, cmd.definition)
        except Exception as exc:  # noqa: BLE001 - the caller's error (busy, shutting down)
            cmd.caller.fail(exc)
            return
        try:
            durable = isinstance(cmd, ResumeCommand) or cmd.explicit_id
            if self._coordinator.gateway is not None and durable:
                self._load(cmd, instance)
            elif isinstance(cmd, StartCommand):
                state = start_state(cmd.definition, cmd.input, None)
                self.register(cmd, instance, state, base=None, resume=None)
            else:
                # resume by id requires a store (checked by the client)
                assert cmd.halted is not None
                state = resume_state(cmd.input, cmd.halted.state)
                resume = (cmd.halted.phase, cmd.event, cmd.payload)
                self.register(cmd, instance, state, base=None, resume=resume)
        except Exception as exc:  # noqa: BLE001 - the caller's error
            self._abort(instance, exc)

    def _abort(self, instance: WorkflowInstance, error: BaseException) -> None:
        """The command does not run and claimed nothing: its caller fails."""
        self._coordinator.carrier.carry(
            instance, self._coordinator.instances.handle(instance, Refuse(error=error))
        )

    def _load(self, cmd: Command, instance: WorkflowInstance) -> None:
        """Load the instance and, when its status lets the command run, claim its
        lease in the same write (the common case: one store round trip)."""
        gateway = self._coordinator.gateway
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
        self._coordinator.instances.handle(instance, LOAD)
        # partials, not closures: they wait for the store (64 claims in flight are 64
        # of each), and a partial is fewer objects for the cyclic GC than the cells
        gateway.submit(
            op,
            functools.partial(self._loaded, cmd, instance, sent),
            finish=functools.partial(decode_claim, cmd, resuming),
        )

    def _loaded(
        self,
        cmd: Command,
        instance: WorkflowInstance,
        sent: float,
        done: outcome.Outcome[Loaded],
    ) -> None:
        message = LoadReady(command=cmd, instance=instance, loaded=done, sent=sent)
        if self._coordinator.engine.is_dispatcher():  # handed to the dispatcher in
            self.apply_load(message)  # its queue's order: what it would post, now
        else:
            self._continue_with(message, cmd, "loading")

    def _continue_with(self, message: LoadReady, cmd: Command, what: str) -> None:
        """Post the continuation of *cmd*'s admission; once the engine no longer
        accepts it, the admission is refused here, on the trio thread (a claim the
        load made is given back), and its caller fails: through the protocol while
        the instance is admitted; after the shutdown closed it, the caller was
        settled then, and this call changes nothing."""
        if not self._coordinator.post_message(message, completion=tracked(cmd.caller)):
            error = RuntimeShutdownError(
                f"the runtime shut down while {what} workflow instance "
                f"{cmd.workflow_instance_id!r}"
            )
            self.apply_load(message, refusal=error)
            cmd.caller.fail(error)

    def apply_load(
        self, message: LoadReady, *, refusal: Exception | None = None
    ) -> None:
        """Run the segment the load prepared, or refuse it (with *refusal*, say)."""
        cmd, instance = message.command, message.instance
        try:
            loaded = message.loaded.unwrap()
        except Exception as exc:  # noqa: BLE001 - the caller's error
            self._abort(instance, exc)
            return
        assert self._coordinator.gateway is not None
        claim = None
        if loaded.epoch is not None:
            lease = Lease(
                owner=self._coordinator.gateway.leases.owner, epoch=loaded.epoch
            )
            claim = (lease, message.sent)
            if (telemetry := self._coordinator.telemetry) is not None:
                telemetry.claimed(cmd.workflow_instance_id, loaded, message.sent)
            self._coordinator.instances.handle(
                instance, Claim(epoch=loaded.epoch, claimed_at=message.sent)
            )
        error = loaded.problem if loaded.problem is not None else refusal
        if error is None:
            try:
                self._continue_loaded(cmd, instance, loaded, claim)
            except Exception as exc:  # noqa: BLE001 - the caller's error
                error = exc
            else:
                return
        self._refuse_loaded(cmd, instance, loaded, claim, error)

    def _refuse_loaded(
        self,
        cmd: Command,
        instance: WorkflowInstance,
        loaded: Loaded,
        claim: tuple[Lease, float] | None,
        error: BaseException,
    ) -> None:
        """The command does not run: its claim (if any) is given back before its
        caller hears why. The event the claim stored for it is refused in the same
        write when the command itself is at fault (a definition that does not fit the
        stored instance, say); otherwise it stays pending for the next segment."""
        if claim is None:
            self._abort(instance, error)
            return
        consumed = refused_posting(loaded.posted, error)
        release = release_op(cmd, loaded.record, claim[0], consumed)
        outputs = self._coordinator.instances.handle(
            instance, Refuse(error=error, write=release)
        )
        self._coordinator.carrier.carry(instance, outputs)

    def _continue_loaded(
        self,
        cmd: Command,
        instance: WorkflowInstance,
        loaded: Loaded,
        claim: tuple[Lease, float] | None,
    ) -> None:
        """Validate the loaded instance, then run the segment on the claim the load
        made; a row the load did not claim refuses the command (the row says why)."""
        definition = cmd.definition
        record, decoded = loaded.record, loaded.decoded
        assert self._coordinator.gateway is not None
        check_not_quarantined(
            self._coordinator.gateway.store.identity, cmd.workflow_instance_id
        )
        if record is not None:
            check_startable(record, checked_workflow(cmd, record))
        if isinstance(cmd, ResumeCommand):
            self._coordinator.inbox.resume_from_inbox(cmd, instance, loaded, claim)
            return
        if claim is None:
            if cmd.posting is not None:
                # a post to an instance that exists
                answer = self._coordinator.inbox.posted(cmd, loaded)
            elif (
                cmd.if_exists == "return" and record is not None and decoded is not None
            ):
                answer = stored_result(cmd, record, decoded)  # never claimed
            else:
                raise refusal(cmd, record)
            outputs = self._coordinator.instances.handle(instance, Answer(value=answer))
            self._coordinator.carrier.carry(instance, outputs)
            return
        # Start hydration: stored fields, overridden by the input; the stored phase is
        # ignored (the segment restarts at the entry point).
        stored = decoded.fields if decoded is not None else None
        state = start_state(definition, cmd.input, stored)
        self._coordinator.inbox.announce_start(cmd, loaded)
        pending = loaded.pending
        feed = Feed(
            pending,
            horizon=0 if record is None else None,  # a new instance's first entry
            truncated=len(pending) >= PENDING,
        )
        base = DurableBase.of(record)
        self.register(
            cmd, instance, state, base=base, resume=None, claim=claim, feed=feed
        )

    def lease_lost(self, message: LeaseLostMessage) -> None:
        instance = message.instance
        outputs = self._coordinator.instances.handle(
            instance, LeaseLost(error=message.error)
        )
        self._coordinator.carrier.carry(instance, outputs)

    def register(
        self,
        cmd: Command,
        instance: WorkflowInstance,
        state: State,
        *,
        base: DurableBase | None,
        resume: tuple[str, str, Any] | None,
        claim: tuple[Lease, float] | None = None,
        feed: Feed | None = None,
    ) -> None:
        """Create the segment's session and run it; *base* is what a durable segment
        started from, *claim* its lease and when the claim was sent, *feed* its inbox
        entries."""
        iid = cmd.workflow_instance_id
        policy = trace = None
        if (telemetry := self._coordinator.telemetry) is not None:
            trace = telemetry.segment(cmd, start=isinstance(cmd, StartCommand))
        if base is not None:
            gateway = self._coordinator.gateway
            assert gateway is not None
            policy = TerminalPersistence(
                gateway=gateway,
                on_persisting=self._persisting,
                instance_id=iid,
                workflow=cmd.definition.name,
                version=cmd.definition.version,
                expected_revision=base.expected,
                max_snapshot_bytes=self._coordinator.max_snapshot_bytes,
                lease=None if claim is None else claim[0],
                trace=None if trace is None else trace.traceparent,
            )
        session: WorkflowSession[Any] = WorkflowSession(
            self._coordinator.engine,
            cmd.definition,
            state,
            workflow_instance_id=iid,
            recursion_limit=cmd.recursion_limit,
            revision=base.expected if base is not None else None,
            policy=policy,
            observer=cmd.observer,
            resume=resume,
            counters=self._coordinator.counters,
            watchers=self._coordinator.watchers,
            feed=feed,
            retry=self._coordinator.retry,
        )
        if feed is not None:
            feed.on_record = self._coordinator.settlement.on_judged
            feed.polls_before = self._coordinator.inbox.polls
        session.trace = trace  # (its effect runner takes it when it is made)
        session.segment = (cmd, base, claim)
        outputs = self._coordinator.instances.handle(
            instance, Run(session=session, holder=session.id)
        )
        self._coordinator.carrier.carry(instance, outputs, start=self._start)

    def _run_session(self, session: WorkflowSession[Any]) -> None:
        """Run the session of a segment (the protocol's ``StartSession``)."""
        coordinator = cast("Receiver", self._coordinator)  # a registered receiver
        self._coordinator.engine.run_session(
            session, receiver=coordinator, on_end=self._ended
        )

    def _persist(self, workflow_instance_id: str) -> None:
        """A segment's terminal save is submitted (the protocol's ``Persist``)."""
        instance = self._coordinator.instances.get(workflow_instance_id)
        assert instance is not None  # admitted until its session ends
        self._coordinator.instances.handle(instance, PERSIST)

    def _session_ended(self, done: SessionEnded) -> None:
        """A segment's session ended (or was cut off): its segment ends."""
        instance = self._coordinator.instances.held_by(done.session_id)
        session = None if instance is None else instance.session
        if instance is None or session is None or session.segment is None:
            logger.error(  # pragma: no cover - defensive: it is admitted until it ends
                "no segment of session %s is admitted", done.session_id
            )
            return
        cmd, base, claim = session.segment
        self._finalize(cmd, instance, base, session, claim, done)

    def _finalize(
        self,
        cmd: Command,
        instance: WorkflowInstance,
        base: DurableBase | None,
        session: WorkflowSession[Any],
        claim: tuple[Lease, float] | None,
        done: SessionEnded,
    ) -> None:
        # The protocol releases before settling the caller: a caller that immediately
        # starts the same instance again is admitted.
        iid = cmd.workflow_instance_id
        base = rebase(base, session)  # a checkpoint saved since the segment began
        if session.trace is not None:
            session.trace.ended(done.result, done.error)
        feed = session.feed  # without one, the settlement has nothing to settle
        inbox = isinstance(cmd, ResumeCommand) and feed is not None
        watched = self._coordinator.watchers.watched(iid)  # else no update is made
        event: End[MarkOp | DeleteOp]
        if done.error is None:  # finished, halted or cancelled: its result
            result: WorkflowResult[Any] = done.result  # (the session's terminal_result)
            update = None
            if watched:
                update = _update(
                    iid, result.status, result.phase, result.state, result.revision
                )

            after = None  # (nothing to settle for a feed that took no entry)
            if feed is not None and not (feed.idle and not inbox):

                def applied() -> None:
                    self._coordinator.settlement.segment_applied(
                        cmd.definition, session, result
                    )
                    if inbox and cmd.posting is None:
                        cmd.caller.complete(None)  # a drain: nobody waits for it

                after = applied

            if result.status == "cancelled":
                reason = instance.cancel_reason() or session.cancel_reason
                cancelled = WorkflowCancelledError(
                    f"workflow instance {iid!r} was cancelled"
                    + (f": {reason}" if reason else ""),
                    instance_id=iid,
                    reason=reason,
                )
                event = End(
                    value=result,
                    error=cancelled,
                    cancelled=True,
                    update=update,
                    after=after,
                )
            else:
                event = End(value=result, update=update, settle=not inbox, after=after)
        else:
            error = done.error
            assert error is not None
            update = None
            if watched and not isinstance(error, UNCHANGED):
                machine, revision = session.machine, base.expected if base else None
                update = _update(
                    iid, "failed", machine.current, machine.state, revision
                )
            mark = None
            if base is not None and self._coordinator.gateway is not None:
                lease = None if claim is None else claim[0]
                consumed = self._coordinator.settlement.segment_failing(session, error)
                mark = segment_mark(cmd, base, error, lease, consumed)
            event = End(
                error=error,
                write=mark,
                update=update,
                settle=not inbox,
                after=None
                if feed is None
                else lambda: self._coordinator.settlement.segment_ended(
                    cmd.definition, session, error
                ),
            )
        self._coordinator.carrier.carry(
            instance, self._coordinator.instances.handle(instance, event)
        )


def _update(
    iid: str,
    status: InstanceStatus,
    phase: str | None,
    state: Any,
    revision: int | None,
) -> InstanceUpdate[Any]:
    return InstanceUpdate(
        workflow_instance_id=iid,
        status=status,
        phase=phase,
        state=state,
        revision=revision,
    )
