"""The runner: start, resume, durable hydration and finalisation of segments (spec §2.12)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, cast, final

import msgspec

from phronomy.durability import mark_op
from phronomy.errors import (
    ConflictError,
    EventRejectedError,
    NotFoundError,
    PhronomyInternalError,
    RecoveryRequiredError,
    RuntimeShutdownError,
)
from phronomy.storage import (
    BeginOp,
    InstanceStatus,
    LoadOp,
    check_not_quarantined,
    check_startable,
    decode_snapshot,
    normalize,
    quarantine,
)

from ._definition import FINISH
from ._events import resolve_event
from ._messages import (
    InputOverlay,
    LoadReady,
    ResolveCommand,
    ResumeCommand,
    SegmentResult,
    StartCommand,
    WorkflowResult,
)
from ._persistence import TerminalPersistence
from ._registry import WorkflowRegistry
from ._session import WorkflowSession
from ._state import build_state

if TYPE_CHECKING:
    import outcome

    from phronomy.durability import DurabilityService
    from phronomy.engine import Engine, ResultHandle
    from phronomy.storage import StoredRecord

    from ._definition import WorkflowDefinition
    from ._state import State

__all__ = ["WorkflowRunner"]

logger = logging.getLogger(__name__)

Command = StartCommand | ResumeCommand

_UNCHANGED = (RuntimeShutdownError, RecoveryRequiredError, EventRejectedError)


@final
class _DurableBase(msgspec.Struct, frozen=True, kw_only=True):
    """What a durable segment started from: the revision it read and what it says."""

    expected: int | None
    status: InstanceStatus

    @classmethod
    def of(cls, record: StoredRecord | None) -> _DurableBase:
        if record is None or record.revision == 0 or record.phase is None:
            return cls(expected=None, status="failed")  # nothing durable yet
        return cls(
            expected=record.revision,
            status="finished" if record.phase == FINISH else "halted",
        )


"""Segment errors that leave the durable instance as it was (its status is not
touched): a cut-off at shutdown, an unknown save outcome (marked separately), a
rejected event."""


@final
class WorkflowRunner:
    """Runs workflow commands on the dispatcher (one runner per runtime).

    Durable segments (a store is configured and the start names its instance, or any
    resume) load the instance first, validate it, run, and end behind the terminal
    barrier. Ephemeral segments skip both round trips.
    """

    def __init__(
        self,
        engine: Engine,
        gateway: DurabilityService | None,
        *,
        max_snapshot_bytes: int,
    ) -> None:
        """Create the runner and register its admission registry on *engine*."""
        self.engine = engine
        self.gateway = gateway
        self.max_snapshot_bytes = max_snapshot_bytes
        self.registry: WorkflowRegistry = engine.receiver(
            WorkflowRegistry,
            lambda e: WorkflowRegistry(
                e,
                self.deliver,
                on_retired=self._retired,
                flush=gateway.wait_idle if gateway is not None else None,
            ),
        )

    # --- dispatch ----------------------------------------------------------------------

    def deliver(self, message: object) -> None:
        """Handle one workflow command (dispatcher only)."""
        self.engine.assert_dispatcher()
        match message:
            case StartCommand() | ResumeCommand():
                self._begin(message)
            case LoadReady():
                self._apply_load(message)
            case ResolveCommand():
                self._resolve(message)
            case _:
                raise PhronomyInternalError(
                    f"unknown Workflow control command {message!r}"
                )

    def _begin(self, cmd: Command) -> None:
        try:
            self.registry.admit_workflow(
                cmd.workflow_instance_id, cmd.owner, cmd.definition.name
            )
        except Exception as exc:  # noqa: BLE001 - the caller's error (busy, shutting down)
            cmd.caller.fail(exc)
            return
        try:
            durable = isinstance(cmd, ResumeCommand) or cmd.explicit_id
            if self.gateway is not None and durable:
                self._load(cmd)
            elif isinstance(cmd, StartCommand):
                self._register(
                    cmd,
                    _overlay(cmd.definition, cmd.input, None),
                    base=None,
                    resume=None,
                )
            else:
                assert (
                    cmd.halted is not None
                )  # resume by id requires a store (checked by the client)
                state = _merge_input(cmd.input, cmd.halted.state)
                self._register(
                    cmd,
                    state,
                    base=None,
                    resume=(cmd.halted.phase, cmd.event, cmd.payload),
                )
        except Exception as exc:  # noqa: BLE001 - the caller's error
            self._abort(cmd, exc)

    def _abort(self, cmd: Command, error: BaseException) -> None:
        self.registry.release_workflow(cmd.workflow_instance_id, cmd.owner)
        cmd.caller.fail(error)

    # --- durable hydration --------------------------------------------------------------

    def _load(self, cmd: Command) -> None:
        assert self.gateway is not None
        iid = cmd.workflow_instance_id
        state_type = cmd.definition.state_type

        def decode(record: StoredRecord | None) -> tuple[StoredRecord | None, Any]:
            # Runs in the store's worker thread: decoding stays off the dispatcher.
            if record is None or record.snapshot is None:
                return record, None
            return record, decode_snapshot(
                record.snapshot,
                workflow_instance_id=iid,
                revision=record.revision,
                state_type=state_type,
            )

        def loaded(done: outcome.Outcome[Any]) -> None:
            if not self.registry.post_message(
                LoadReady(command=cmd, loaded=done), completion=cmd.caller
            ):
                cmd.caller.fail(
                    RuntimeShutdownError(
                        f"Runtime rejected Workflow load_result for {iid!r} while shutting down"
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
            base = _DurableBase.of(record)
            if isinstance(cmd, StartCommand):
                # Start hydration: stored fields, overridden by the input; the stored
                # phase is ignored (the segment restarts at the entry point).
                stored = decoded.fields if decoded is not None else None
                self._register(
                    cmd, _overlay(definition, cmd.input, stored), base=base, resume=None
                )
                return
            if cmd.halted is not None:
                if decoded is not None:
                    _check_unchanged(cmd, decoded.fields, decoded.phase)
                state = _merge_input(cmd.input, cmd.halted.state)
                resume = (cmd.halted.phase, cmd.event, cmd.payload)
            else:
                _require_durable(decoded, cmd.workflow_instance_id)
                phase = decoded.phase or FINISH
                event = resolve_event(
                    definition, phase, cmd.event, cmd.workflow_instance_id
                )
                state = _merge_input(cmd.input, decoded.fields)
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
        base: _DurableBase | None,
        resume: tuple[str, str, Any] | None,
    ) -> None:
        """Create the segment's session; *base* is what a durable segment started from."""
        iid = cmd.workflow_instance_id
        durable = base is not None
        expected = base.expected if base is not None else None
        policy = None
        if durable:
            assert self.gateway is not None
            policy = TerminalPersistence(
                gateway=self.gateway,
                registry=self.registry,
                owner=cmd.owner,
                instance_id=iid,
                workflow=cmd.definition.name,
                expected_revision=expected,
                max_snapshot_bytes=self.max_snapshot_bytes,
            )
        on_park = None
        if durable:
            gateway = self.gateway
            assert gateway is not None

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
            revision=expected,
            policy=policy,
            observer=cmd.observer,
            resume=resume,
            on_park=on_park,
        )
        self.registry.bind_workflow_session(iid, cmd.owner, session.id, cmd.caller)
        waiter = self.engine.register_session(session, receiver=self.registry)
        waiter.on_complete(lambda done: self._finalize(cmd, base, session, done))

    def _finalize(
        self,
        cmd: Command,
        base: _DurableBase | None,
        session: WorkflowSession[Any],
        done: ResultHandle[Any],
    ) -> None:
        # Release before settling the caller: a caller that immediately starts the
        # same instance again is admitted.
        iid = cmd.workflow_instance_id
        self.registry.release_workflow(iid, cmd.owner)
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
            mark = None
            if isinstance(error, RuntimeShutdownError) and session.parked:
                # The row says "running" but nothing runs it any more: back to what
                # its last durable revision says.
                mark = mark_op(
                    iid,
                    base.status,
                    expected_revision=base.expected or 0,
                    detail="its segment was cut off when the runtime shut down; "
                    + (
                        f"revision {base.expected} is unchanged"
                        if base.expected
                        else "it had not saved yet"
                    ),
                    workflow=cmd.definition.name,
                )
            elif not isinstance(error, _UNCHANGED):
                mark = mark_op(
                    iid,
                    "failed",
                    expected_revision=base.expected or 0,
                    detail=f"{type(error).__name__}: {error}",
                    workflow=cmd.definition.name,
                )
            if mark is not None:
                self.gateway.submit_quietly(
                    mark, f"mark workflow instance {iid!r} {mark.status}"
                )
        cmd.caller.fail(error)

    def _retired(self, workflow_instance_id: str, error: BaseException | None) -> None:
        if self.gateway is not None:
            quarantine(
                self.gateway.store.identity,
                workflow_instance_id,
                f"the outcome of its terminal save is unknown: {error!r}",
            )
            self.gateway.submit_quietly(
                mark_op(
                    workflow_instance_id,
                    "recovery_required",
                    expected_revision=None,
                    detail=f"terminal save outcome unknown: {error!r}",
                ),
                f"mark workflow instance {workflow_instance_id!r} recovery_required",
            )

    def _resolve(self, cmd: ResolveCommand) -> None:
        record = self.registry.resolve(cmd.workflow_instance_id)
        if record is not None and record.caller is not None:
            record.caller.fail(
                RecoveryRequiredError(
                    f"workflow instance {cmd.workflow_instance_id!r} was resolved by an operator "
                    f"({cmd.action}); this segment's result is unavailable, load the instance again",
                    instance_id=cmd.workflow_instance_id,
                )
            )
        cmd.done.complete(record)


def _overlay(
    definition: WorkflowDefinition[Any], overlay: InputOverlay, base: State | None
) -> State:
    if overlay.state is not None:
        return cast("State", overlay.state)
    state_type: type[State] = definition.state_type
    return build_state(state_type, overlay.fields, base)


def _require_durable(decoded: object, workflow_instance_id: str) -> None:
    if decoded is None:
        raise NotFoundError(
            f"workflow instance {workflow_instance_id!r} has no durable state to resume"
        )


def _merge_input(overlay: InputOverlay, halted: State) -> State:
    """Resume input is merged into the halted state through its reducers (spec §3.4)."""
    if overlay.state is not None:
        return cast("State", overlay.state)
    return halted.merge(**overlay.fields) if overlay.fields else halted


def _check_unchanged(
    cmd: ResumeCommand, durable_fields: State, durable_phase: str | None
) -> None:
    """Resume validation (spec §4.4): the halted result must match the durable snapshot."""
    halted = cmd.halted
    assert halted is not None
    if (
        normalize(halted.state) != normalize(durable_fields)
        or halted.phase != durable_phase
    ):
        raise ConflictError(
            "Workflow state changed since the supplied halted result for "
            f"workflow_instance_id {cmd.workflow_instance_id!r}; explicit reload/reconciliation "
            "is required (resume by id to continue from the durable state)"
        )
