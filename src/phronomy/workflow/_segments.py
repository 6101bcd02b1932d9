"""The life of one segment: admission, hydration from the store, the session, its end."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, cast

import outcome
import trio

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
    refusal,
    release_op,
    runs_on,
    segment_mark,
)
from ._definition import FINISH
from ._events import resolve_event
from ._hydration import (
    DurableBase,
    check_unchanged,
    decode_stored,
    require_durable,
    resume_state,
    start_state,
)
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

if TYPE_CHECKING:
    from phronomy.durability import DurabilityService
    from phronomy.engine import AdmissionTable, Host, Receiver, ResultHandle
    from phronomy.storage import (
        Claimed,
        DeleteOp,
        InstanceStatus,
        MarkOp,
        StoredRecord,
    )

    from ._messages import CancelCommand, EventCounters
    from ._state import State
    from ._watch import Watchers

__all__ = ["PERSISTING", "SegmentLifecycle"]

logger = logging.getLogger(__name__)


PERSISTING = "persisting_terminal"
"""The admission state of a segment whose terminal save is in flight."""


class SegmentLifecycle:
    """How the workflow coordinator runs one segment, from its command to its caller.

    A mixin of :class:`~phronomy.workflow.WorkflowCoordinator` (on the dispatcher).
    """

    gateway: DurabilityService | None
    max_snapshot_bytes: int
    admissions: AdmissionTable
    counters: EventCounters
    sessions: dict[str, WorkflowSession[Any]]
    watchers: Watchers
    cancels: dict[str, list[CancelCommand]]

    if TYPE_CHECKING:

        @property
        def engine(self) -> Host: ...

        def admit(self) -> None: ...

        def post_message(
            self,
            message: Any,
            *,
            admission: bool = False,
            completion: ResultHandle[Any] | None = None,
        ) -> bool: ...

        def _segment_cancelled(
            self,
            iid: str,
            caller: ResultHandle[Any],
            result: WorkflowResult[Any],
            reason: str | None = None,
        ) -> None: ...

        def _cancel_next(self, iid: str) -> None: ...

    def _begin(self, cmd: Command) -> None:
        try:
            self.admit()
            self.admissions.admit(
                cmd.workflow_instance_id, cmd.owner, label=cmd.definition.name
            )
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
        )
        sent = trio.current_time()

        def decode(claimed: Claimed) -> Loaded:
            # Runs in the store's worker thread: decoding stays off the dispatcher.
            # Never raises: a claim that was made must be released.
            record, epoch = claimed.row, claimed.epoch
            try:
                return (
                    record,
                    decode_stored(definition, record, resuming=resuming)[1],
                    None,
                    epoch,
                )
            except Exception as exc:  # noqa: BLE001 - reported on the dispatcher
                return record, None, exc, epoch

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
        record, decoded, problem, epoch = loaded
        assert self.gateway is not None
        claim = None
        if epoch is not None:
            claim = (Lease(owner=self.gateway.leases.owner, epoch=epoch), message.sent)
        error: Exception | None = problem
        if error is None:
            try:
                self._continue_loaded(cmd, record, decoded, claim)
            except Exception as exc:  # noqa: BLE001 - the caller's error
                error = exc
            else:
                return
        if claim is None:
            self._abort(cmd, error)
            return
        # the claim is given back before the caller hears why it did not run
        self.admissions.release(cmd.workflow_instance_id, owner=cmd.owner)
        self._write_then_fail(release_op(cmd, record, claim[0]), cmd.caller, error)

    def _continue_loaded(
        self,
        cmd: Command,
        record: StoredRecord | None,
        decoded: Any,
        claim: tuple[Lease, float] | None,
    ) -> None:
        """Validate the loaded instance, then run the segment on the claim the load
        made; a row the load did not claim refuses the command (the row says why)."""
        definition = cmd.definition
        assert self.gateway is not None
        check_not_quarantined(self.gateway.store.identity, cmd.workflow_instance_id)
        if record is not None:
            check_startable(record, definition.name)
        if claim is None:
            if (
                isinstance(cmd, StartCommand)
                and cmd.if_exists == "return"
                and record is not None
                and decoded is not None
            ):
                self._return_stored(cmd, record, decoded)  # never claimed
                return
            raise refusal(cmd, record)
        base = DurableBase.of(record)
        resume = None
        if isinstance(cmd, StartCommand):
            # Start hydration: stored fields, overridden by the input; the stored
            # phase is ignored (the segment restarts at the entry point).
            stored = decoded.fields if decoded is not None else None
            state = start_state(definition, cmd.input, stored)
        elif cmd.halted is not None:
            if decoded is not None:
                check_unchanged(cmd, decoded.fields, decoded.phase)
            state = resume_state(cmd.input, cmd.halted.state)
            resume = (cmd.halted.phase, cmd.event, cmd.payload)
        else:
            require_durable(decoded, cmd.workflow_instance_id)
            phase = decoded.phase or FINISH
            event = resolve_event(
                definition, phase, cmd.event, cmd.workflow_instance_id
            )
            state = resume_state(cmd.input, decoded.fields)
            resume = (phase, event, cmd.payload)
        self._register(cmd, state, base=base, resume=resume, claim=claim)

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
    ) -> None:
        """Create the segment's session; *base* is what a durable segment started from,
        *claim* its lease and when the claim was sent."""
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
        session: WorkflowSession[Any] = WorkflowSession(
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
        )
        self.admissions.bind(iid, cmd.owner, session.id, caller=cmd.caller)
        self.sessions[iid] = session
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
            else:
                cmd.caller.complete(result)
        else:
            error = done.error
            assert error is not None
            if not isinstance(error, UNCHANGED):
                machine, revision = session.machine, base.expected if base else None
                self._watched(iid, "failed", machine.current, machine.state, revision)
            mark = None
            if base is not None and self.gateway is not None:
                lease = None if claim is None else claim[0]
                mark = segment_mark(cmd, base, error, lease)
            if mark is None:
                cmd.caller.fail(error)
            else:
                self._write_then_fail(mark, cmd.caller, error)
        self._cancel_next(iid)  # cancels that waited for the segment to end

    def _write_then_fail(
        self, op: MarkOp | DeleteOp, caller: ResultHandle[Any], error: BaseException
    ) -> None:
        """Write the row's status after a segment that did not end with its save; the
        caller hears of the failure once the row says it (at shutdown: at once)."""
        assert self.gateway is not None
        what = f"write the status of workflow instance {op.workflow_instance_id!r}"
        if isinstance(error, RuntimeShutdownError):
            self.gateway.submit_quietly(op, what)
            caller.fail(error)
            return

        def written(done: outcome.Outcome[Any]) -> None:
            if isinstance(done, outcome.Error) or done.unwrap() is False:
                logger.warning("could not %s: %r", what, done)
            caller.fail(error)

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
