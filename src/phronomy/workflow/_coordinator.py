"""The workflow coordinator: admission, hydration and finalisation of segments.

It is the engine's receiver for workflow commands and owns the admission table of
one runtime: at most one live segment per ``workflow_instance_id``. Its work is done
by four parts it owns (see ``_context.py``): ``Segments``, ``InboxRouter``,
``Settlement`` and ``CancelRequests``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, cast, final

from phronomy.durability import mark_op
from phronomy.engine import Event, ExecutionReceiver
from phronomy.errors import (
    BusyError,
    PhronomyInternalError,
    RecoveryRequiredError,
    RuntimeShutdownError,
)
from phronomy.instance import BUSY, Instances, Resolve, Retire
from phronomy.storage import (
    quarantine,
)

from ._cancelling import CancelRequests
from ._carrier import Carrier
from ._continuations import (
    CancelAsked,
    CancelLoaded,
    CancelRequested,
    CancelSaved,
    LeaseLost,
    LoadReady,
)
from ._inboxing import InboxRouter
from ._messages import (
    Barrier,
    CancelCommand,
    EventCounters,
    InstanceUpdate,
    LiveSegment,
    Polled,
    PostCommand,
    PostReady,
    ResolveCommand,
    ResumeCommand,
    StartCommand,
    WorkflowStatistics,
)
from ._segments import Segments
from ._settling import Call, Settlement
from ._waiters import Waiters
from ._watch import Watchers

if TYPE_CHECKING:
    from collections.abc import Iterable

    from phronomy._telemetry import Telemetry
    from phronomy.durability import DurabilityService
    from phronomy.engine import Host, ResultHandle
    from phronomy.instance import Sessions

    from ._continuations import WorkflowInstance, WorkflowInstances
    from ._definition import WorkflowDefinition
    from ._messages import SegmentStatus
    from ._retries import RetryPolicy
    from ._session import WorkflowSession

__all__ = ["WorkflowCoordinator"]

logger = logging.getLogger(__name__)


def _busy(current: WorkflowInstance) -> BusyError:
    return BusyError(
        f"Workflow instance {current.key!r} already has a live execution segment "
        f"({current.status})"
    )


@final
class WorkflowCoordinator(ExecutionReceiver):
    """Runs workflow commands on the dispatcher (one per runtime).

    Durable segments (a store is configured and the start names its instance, or any
    resume) load the instance first, validate it, run, and end behind the terminal
    barrier. Ephemeral segments skip both round trips.

    The lifecycle of each instance is the instance protocol's
    (``phronomy.instance``): the coordinator feeds its ``Instances`` what happened and
    carries the outputs out (``Carrier``). The work is done by its parts, each a plain
    object holding a reference to it: ``segments`` (a segment from its command to its
    caller), ``inbox`` (posts, the poll, wakes), ``settlement`` (waiters of inbox
    entries) and ``cancels`` (cancels, here or through the row).
    """

    telemetry: Telemetry | None = None
    """The runtime's OpenTelemetry (``None``: off; see ``phronomy._telemetry``)."""

    def __init__(
        self,
        engine: Host,
        *,
        gateway: DurabilityService | None,
        max_snapshot_bytes: int,
        recursion_limit: int = 25,
        serves: Iterable[WorkflowDefinition[Any]] = (),
        retry: RetryPolicy | None = None,
    ) -> None:
        """Create the coordinator (register it with ``engine.receiver``); *serves*
        are the workflows it runs instances of from the inbox (besides those it is
        asked to run); *retry* is the retry policy of effects that name none."""
        super().__init__(engine)
        self.gateway = gateway
        self.max_snapshot_bytes = max_snapshot_bytes
        self.recursion_limit = recursion_limit
        self.served: dict[str, WorkflowDefinition[Any]] = {d.name: d for d in serves}
        self.retry = retry
        self.waiters = Waiters()
        self.stuck: dict[str, tuple[int, float]] = {}
        """Instances whose resume from the inbox could not run: failures in a row,
        and when the poll tries again (trio time)."""
        self.counters = EventCounters()
        self.watchers = Watchers()
        self.instances: WorkflowInstances = Instances(
            noun="workflow instance", busy_error=_busy
        )
        """Every admitted instance (the instance protocol's objects)."""
        self.carrier = Carrier(self)
        self.segments = Segments(self)
        self.inbox = InboxRouter(self)
        self.settlement = Settlement(self)
        self.cancels = CancelRequests(self)

    @property
    def admissions(self) -> WorkflowInstances:
        """The admitted instances (the name ``runtime.recovery`` reads)."""
        return self.instances

    @property
    def sessions(self) -> Sessions[WorkflowSession[Any]]:
        """The live sessions by instance id (a read-only view)."""
        return self.instances.sessions

    # --- the receiver contract ------------------------------------------------------

    def idle(self) -> bool:
        """No admission is admitting, executing or persisting (recovery does not block)."""
        return self.instances.busy == 0

    def deliver(self, message: Any) -> None:
        """Handle one workflow command (dispatcher only)."""
        self.engine.assert_dispatcher()
        match message:
            case StartCommand() | ResumeCommand():
                self.segments.begin(message)
            case LoadReady():
                self.segments.apply_load(message)
            case LeaseLost():
                self.segments.lease_lost(message)
            case PostCommand():
                self.inbox.post(message)
            case PostReady():
                self.inbox.apply_post(message)
            case Polled():
                self.inbox.polled(message)
            case Call():
                message()
            case ResolveCommand():
                self._resolve(message)
            case CancelCommand():
                self.cancels.cancel(message)
            case CancelAsked():
                self.cancels.apply_asked(message)
            case CancelLoaded():
                self.cancels.apply_loaded(message)
            case CancelSaved():
                self.cancels.apply_saved(message)
            case CancelRequested():
                self.cancels.apply_requested(message)
            case Barrier(done=done):
                done.complete(None)
            case _:
                raise PhronomyInternalError(f"unknown workflow command {message!r}")

    def shutdown(self, error: BaseException | None) -> None:
        """Clear every admission; pending recovery callers (and whoever waits for an
        event of such an instance) get a :class:`~phronomy.RecoveryRequiredError`."""
        self.watchers.close()
        for instance, outputs in self.instances.shutdown(error):
            self.carrier.carry(instance, outputs)
        self.waiters.close(
            error
            or RuntimeShutdownError(
                "the runtime shut down before the event was applied; it is stored and "
                "applied by the runtime that runs the instance next"
            )
        )

    async def flush(self) -> None:
        """Wait for the store writes the workflows owe (cut-off marks, failures).

        Cancellation:
            Bounded by the shutdown's grace deadline (writes already submitted still run).
        """
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
        instance = self.instances.held_by(session_id)
        if instance is None:
            return
        iid, session = instance.key, instance.session
        if session is not None and self.watchers.watched(iid):
            self.watchers.publish(
                InstanceUpdate(
                    workflow_instance_id=iid,
                    status="recovery_required",
                    phase=session.machine.current,
                    state=session.machine.state,
                    revision=session.revision,
                )
            )
        logger.warning(
            "workflow instance %r requires recovery (the outcome of its terminal save is "
            "unknown: %r); its caller stays pending until an operator resolves it or "
            "the runtime shuts down",
            iid,
            error,
        )
        mark = None
        if self.gateway is not None:
            # No longer renewed: if the mark below fails, the lease expires and the
            # sweep settles the row; if it lands, the row waits for an operator.
            quarantine(
                self.gateway.store.identity,
                iid,
                f"the outcome of its terminal save is unknown: {error!r}",
            )
            # Fenced like every write of the segment: only while the row still holds
            # its lease at the revision it started from. Once the lease has gone,
            # whoever holds the instance next settles it (by the save log).
            lease = None if session is None or session.lease is None else session.lease
            mark = mark_op(
                iid,
                "recovery_required",
                expected_revision=(session.revision or 0) if session else None,
                detail=f"terminal save outcome unknown: {error!r}",
                workflow=instance.label,
                lease=None if lease is None else lease.lease,
            )
        outputs = self.instances.handle(instance, Retire(error=error, write=mark))
        self.carrier.carry(instance, outputs)

    def describe_live(self) -> list[str]:
        """Describe busy admissions (for the shutdown report)."""
        return [
            f"workflow {r.label} instance {r.key} ({r.status})"
            for r in self.instances
            if r.state in BUSY
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
        record = self.instances.get(workflow_instance_id)
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
            live_segments=self.instances.busy,
            recovery_required=len(self.instances.recovery_required()),
            events_transitioned=counters.transitioned,
            events_rejected=counters.rejected,
            events_dropped=counters.dropped,
        )

    def current_update(self, workflow_instance_id: str) -> InstanceUpdate[Any] | None:
        """The stable state of the instance's live segment here, or ``None``."""
        session = self.sessions.get(workflow_instance_id)
        if session is None:
            return None
        return InstanceUpdate(
            workflow_instance_id=workflow_instance_id,
            status="running",
            phase=session.machine.current,
            state=session.machine.state,
            revision=session.revision,
        )

    def live_segment(self, workflow_instance_id: str) -> LiveSegment | None:
        """A snapshot of the instance's admission, or ``None``."""
        record = self.instances.get(workflow_instance_id)
        if record is None:
            return None
        error = record.error
        return LiveSegment(
            workflow_instance_id=record.key,
            workflow=record.label,
            status=cast("SegmentStatus", record.status),
            segment_id=record.holder,
            error=None if error is None else f"{type(error).__name__}: {error}",
        )

    def _resolve(self, cmd: ResolveCommand) -> None:
        iid = cmd.workflow_instance_id
        instance = self.instances.get(iid)
        if instance is None or instance.state != "recovery_required":
            cmd.done.complete(None)
            return
        error = RecoveryRequiredError(
            f"workflow instance {iid!r} was resolved by an operator ({cmd.action}); "
            "this segment's result is unavailable, load the instance again",
            instance_id=iid,
        )
        self.carrier.carry(
            instance, self.instances.handle(instance, Resolve(error=error))
        )
        cmd.done.complete(instance)
