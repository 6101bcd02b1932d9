"""The workflow coordinator: admission, hydration and finalisation of segments.

It is the engine's receiver for workflow commands and owns the admission table of
one runtime: at most one live segment per ``workflow_instance_id``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, cast, final

from phronomy.durability import mark_op
from phronomy.engine import Admission, AdmissionTable, Event, ExecutionReceiver
from phronomy.errors import (
    BusyError,
    EventRejectedError,
    PhronomyInternalError,
    RecoveryRequiredError,
    RuntimeShutdownError,
)
from phronomy.storage import (
    BeginOp,
    LoadOp,
    check_not_quarantined,
    check_startable,
    quarantine,
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
    EventCounters,
    LiveSegment,
    LoadReady,
    ResolveCommand,
    ResumeCommand,
    SegmentResult,
    StartCommand,
    WorkflowResult,
    WorkflowStatistics,
)
from ._persistence import TerminalPersistence
from ._session import WorkflowSession

if TYPE_CHECKING:
    import outcome

    from phronomy.durability import DurabilityService
    from phronomy.engine import Host, ResultHandle
    from phronomy.storage import StoredRecord

    from ._messages import SegmentStatus
    from ._state import State

__all__ = ["WorkflowCoordinator"]

logger = logging.getLogger(__name__)

Command = StartCommand | ResumeCommand

PERSISTING = "persisting_terminal"
"""The admission state of a segment whose terminal save is in flight."""

_BUSY = frozenset({"admitting", "executing", PERSISTING})
_MARKABLE = frozenset({"executing", PERSISTING, "recovery_required"})

_UNCHANGED = (RuntimeShutdownError, RecoveryRequiredError, EventRejectedError)
"""Segment errors that leave the durable instance as it was (its status is not
touched): a cut-off at shutdown, an unknown save outcome (marked separately), a
rejected event."""


def _busy(current: Admission) -> BusyError:
    return BusyError(
        f"Workflow instance {current.key!r} already has a live execution segment "
        f"({current.state})"
    )


@final
class WorkflowCoordinator(ExecutionReceiver):
    """Runs workflow commands on the dispatcher (one per runtime).

    Durable segments (a store is configured and the start names its instance, or any
    resume) load the instance first, validate it, run, and end behind the terminal
    barrier. Ephemeral segments skip both round trips.

    Admission per instance::

        (absent) --admit--> admitting --bind(session)--> executing
        executing --terminal save--> persisting_terminal
        admitting | executing | persisting_terminal --release--> (absent)
        any --session retired (unknown save outcome)--> recovery_required
        recovery_required --operator resolution or runtime shutdown--> (absent)
    """

    def __init__(
        self,
        engine: Host,
        *,
        gateway: DurabilityService | None,
        max_snapshot_bytes: int,
    ) -> None:
        """Create the coordinator (register it with ``engine.receiver``)."""
        super().__init__(engine)
        self.gateway = gateway
        self.max_snapshot_bytes = max_snapshot_bytes
        self.counters = EventCounters()
        self.admissions = AdmissionTable(
            noun="workflow instance",
            busy_states=_BUSY,
            markable=_MARKABLE,
            busy_error=_busy,
        )

    # --- the receiver contract ------------------------------------------------------

    def idle(self) -> bool:
        """No admission is admitting, executing or persisting (recovery does not block)."""
        return self.admissions.busy == 0

    def deliver(self, message: Any) -> None:
        """Handle one workflow command (dispatcher only)."""
        self.assert_dispatcher()
        match message:
            case StartCommand() | ResumeCommand():
                self._begin(message)
            case LoadReady():
                self._apply_load(message)
            case ResolveCommand():
                self._resolve(message)
            case _:
                raise PhronomyInternalError(f"unknown workflow command {message!r}")

    def shutdown(self, error: BaseException | None) -> None:
        """Clear every admission; pending recovery callers get a :class:`~phronomy.RecoveryRequiredError`."""
        for record in self.admissions.clear():
            caller: ResultHandle[Any] | None = record.caller
            if caller is None or caller.done:
                continue
            if record.state == "recovery_required":
                caller.fail(
                    error
                    or RecoveryRequiredError(
                        f"workflow instance {record.key!r} requires recovery: the "
                        f"outcome of its terminal save is unknown ({record.error!r}); "
                        "the runtime shut down before an operator resolved it",
                        instance_id=record.key,
                    )
                )
            elif error is not None:
                caller.fail(error)

    async def flush(self) -> None:
        """Wait for the store writes the workflows owe (cut-off marks, failures)."""
        if self.gateway is not None:
            await self.gateway.wait_idle()
        else:
            await super().flush()

    def session_retired(
        self,
        session_id: str,
        *,
        waiter: ResultHandle[Any] | None,
        error: BaseException | None,
    ) -> None:
        """The session's save outcome is unknown: the admission becomes recovery-required."""
        record = self.admissions.retire(session_id, error)
        if record is None:
            return
        iid = record.key
        logger.warning(
            "workflow instance %r requires recovery (the outcome of its terminal save is "
            "unknown: %r); its caller stays pending until an operator resolves it or "
            "the runtime shuts down",
            iid,
            error,
        )
        if self.gateway is not None:
            quarantine(
                self.gateway.store.identity,
                iid,
                f"the outcome of its terminal save is unknown: {error!r}",
            )
            self.gateway.submit_quietly(
                mark_op(
                    iid,
                    "recovery_required",
                    expected_revision=None,
                    detail=f"terminal save outcome unknown: {error!r}",
                ),
                f"mark workflow instance {iid!r} recovery_required",
            )

    def describe_live(self) -> list[str]:
        """Describe busy admissions (for the shutdown report)."""
        return [
            f"workflow {r.label} instance {r.key} ({r.state})"
            for r in self.admissions
            if r.state in _BUSY
        ]

    # --- reads and live signals (any trio task on the runtime's thread) ---------------

    def post_to_workflow(
        self,
        workflow_instance_id: str,
        workflow: str,
        event: str,
        payload: Any,
        caller: ResultHandle[Any] | None = None,
    ) -> bool:
        """Route *event* to the live session of the instance, if it is ``executing``
        a segment of *workflow* (*caller* learns what happened to it)."""
        record = self.admissions.get(workflow_instance_id)
        if (
            record is None
            or record.state != "executing"
            or record.holder is None
            or record.label != workflow
        ):
            return False
        return self.engine.post_nowait(
            Event(type=event, target_id=record.holder, payload=payload, caller=caller)
        )

    def statistics(self) -> WorkflowStatistics:
        """Live segments, recovery-required instances and what live events did."""
        counters = self.counters
        return WorkflowStatistics(
            live_segments=self.admissions.busy,
            recovery_required=len(self.admissions.in_state("recovery_required")),
            events_transitioned=counters.transitioned,
            events_rejected=counters.rejected,
            events_dropped=counters.dropped,
        )

    def live_segment(self, workflow_instance_id: str) -> LiveSegment | None:
        """A snapshot of the instance's admission, or ``None``."""
        record = self.admissions.get(workflow_instance_id)
        if record is None:
            return None
        error = record.error
        return LiveSegment(
            workflow_instance_id=record.key,
            workflow=record.label,
            status=cast("SegmentStatus", record.state),
            segment_id=record.holder,
            error=None if error is None else f"{type(error).__name__}: {error}",
        )

    # --- admission and hydration --------------------------------------------------------

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
        assert self.gateway is not None
        iid = cmd.workflow_instance_id
        definition = cmd.definition
        resuming = isinstance(cmd, ResumeCommand)

        def decode(record: StoredRecord | None) -> tuple[StoredRecord | None, Any]:
            # Runs in the store's worker thread: decoding stays off the dispatcher.
            return decode_stored(definition, record, resuming=resuming)

        def loaded(done: outcome.Outcome[Any]) -> None:
            message = LoadReady(command=cmd, loaded=done)
            if not self.post_message(message, completion=cmd.caller):
                cmd.caller.fail(
                    RuntimeShutdownError(
                        f"the runtime shut down while loading workflow instance {iid!r}"
                    )
                )

        # Only a read: a batch of reads needs no write transaction (no fsync), and a
        # rejected start or resume never touches the stored status.
        self.gateway.submit(LoadOp(workflow_instance_id=iid), loaded, finish=decode)

    def _apply_load(self, message: LoadReady) -> None:
        cmd = message.command
        try:
            record, decoded = message.loaded.unwrap()
            definition = cmd.definition
            assert self.gateway is not None
            check_not_quarantined(self.gateway.store.identity, cmd.workflow_instance_id)
            if record is not None:
                check_startable(record, definition.name)
            base = DurableBase.of(record)
            if isinstance(cmd, StartCommand):
                # Start hydration: stored fields, overridden by the input; the stored
                # phase is ignored (the segment restarts at the entry point).
                stored = decoded.fields if decoded is not None else None
                state = start_state(definition, cmd.input, stored)
                self._register(cmd, state, base=base, resume=None)
                return
            if cmd.halted is not None:
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
            self._register(cmd, state, base=base, resume=resume)
        except Exception as exc:  # noqa: BLE001 - the caller's error
            self._abort(cmd, exc)

    # --- sessions ----------------------------------------------------------------------

    def _register(
        self,
        cmd: Command,
        state: State,
        *,
        base: DurableBase | None,
        resume: tuple[str, str, Any] | None,
    ) -> None:
        """Create the segment's session; *base* is what a durable segment started from."""
        iid = cmd.workflow_instance_id
        policy = on_park = None
        if base is not None:
            gateway = self.gateway
            assert gateway is not None
            expected = base.expected
            admissions, owner = self.admissions, cmd.owner
            policy = TerminalPersistence(
                gateway=gateway,
                on_persisting=lambda: admissions.mark(iid, PERSISTING, owner=owner),
                instance_id=iid,
                workflow=cmd.definition.name,
                version=cmd.definition.version,
                expected_revision=expected,
                max_snapshot_bytes=self.max_snapshot_bytes,
            )

            def on_park() -> None:
                # Queued before any terminal save of the segment (the batcher is FIFO).
                gateway.submit_quietly(
                    BeginOp(
                        workflow_instance_id=iid,
                        workflow=cmd.definition.name,
                        expected_revision=expected,
                    ),
                    f"mark workflow instance {iid!r} running",
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
            on_park=on_park,
            counters=self.counters,
        )
        self.admissions.bind(iid, cmd.owner, session.id, caller=cmd.caller)
        waiter = self.engine.register_session(session, receiver=self)
        waiter.on_complete(lambda done: self._finalize(cmd, base, session, done))

    def _finalize(
        self,
        cmd: Command,
        base: DurableBase | None,
        session: WorkflowSession[Any],
        done: ResultHandle[Any],
    ) -> None:
        # Release before settling the caller: a caller that immediately starts the
        # same instance again is admitted.
        iid = cmd.workflow_instance_id
        self.admissions.release(iid, owner=cmd.owner)
        if done.status == "completed":
            segment: SegmentResult = done.result_nowait()
            cmd.caller.complete(
                WorkflowResult(
                    state=segment.state,
                    phase=segment.phase,
                    workflow_instance_id=iid,
                    revision=segment.revision if base is not None else None,
                    halted=segment.phase != FINISH,
                    workflow=cmd.definition.name,
                )
            )
            return
        error = done.error
        assert error is not None
        if base is not None and self.gateway is not None:
            self._mark_failed_segment(cmd, base, session, error)
        cmd.caller.fail(error)

    def _mark_failed_segment(
        self,
        cmd: Command,
        base: DurableBase,
        session: WorkflowSession[Any],
        error: BaseException,
    ) -> None:
        assert self.gateway is not None
        iid, expected = cmd.workflow_instance_id, base.expected or 0
        if isinstance(error, RuntimeShutdownError) and session.parked:
            # The row says "running" but nothing runs it any more: back to what its
            # last durable revision says.
            unchanged = (
                f"revision {base.expected} is unchanged"
                if base.expected
                else "it had not saved yet"
            )
            status, detail = (
                base.status,
                f"its segment was cut off when the runtime shut down; {unchanged}",
            )
        elif not isinstance(error, _UNCHANGED):
            status, detail = "failed", f"{type(error).__name__}: {error}"
        else:
            return
        mark = mark_op(
            iid,
            status,
            expected_revision=expected,
            detail=detail,
            workflow=cmd.definition.name,
        )
        self.gateway.submit_quietly(mark, f"mark workflow instance {iid!r} {status}")

    def _resolve(self, cmd: ResolveCommand) -> None:
        record = self.admissions.resolve(cmd.workflow_instance_id)
        if record is not None and record.caller is not None:
            record.caller.fail(
                RecoveryRequiredError(
                    f"workflow instance {cmd.workflow_instance_id!r} was resolved by an "
                    f"operator ({cmd.action}); this segment's result is unavailable, "
                    "load the instance again",
                    instance_id=cmd.workflow_instance_id,
                )
            )
        cmd.done.complete(record)
