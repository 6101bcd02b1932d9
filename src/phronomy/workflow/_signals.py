"""Live instances: their segments, signals, awaited deliveries and statistics."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from phronomy.engine import ResultHandle
from phronomy.errors import InvalidInputError
from phronomy.storage import validate_instance_id

from ._messages import EventOutcome

if TYPE_CHECKING:
    from ._coordinator import WorkflowCoordinator
    from ._definition import WorkflowDefinition
    from ._messages import LiveSegment, WorkflowStatistics

__all__ = ["LiveInstances"]


class LiveInstances:
    """The part of :class:`~phronomy.workflow.WorkflowClient` that reaches live
    segments (``runtime.workflows.signal``, ``deliver``, ``segment``, ...)."""

    _coordinator: WorkflowCoordinator

    def segment(self, workflow_instance_id: str) -> LiveSegment | None:
        """The live segment of the instance in this runtime, or ``None``.

        A snapshot: it says whether the instance is loading, running, saving its
        terminal state or waiting for recovery here (the store says the rest, see
        :meth:`~phronomy.workflow.RecoveryClient.inspect`).

        Raises:
            InvalidInputError: an empty or invalid *workflow_instance_id*.
            ReentrancyError: called from a thread that does not run the runtime.
        """
        self._coordinator.engine.check_thread("runtime.workflows.segment()")
        return self._coordinator.live_segment(
            validate_instance_id(workflow_instance_id)
        )

    def signal(
        self,
        workflow: WorkflowDefinition[Any],
        workflow_instance_id: str,
        event: str,
        payload: Any = None,
    ) -> bool:
        """Deliver *event* to the live segment of an instance, without waiting.

        Callable from any trio task of the runtime and from actions on the dispatcher
        (from another thread: ``runtime.from_thread.signal``). To learn what happened
        to the event, use :meth:`deliver`.

        Returns:
            ``True`` if the event was queued for the live session (not that a
            transition matched); ``False`` if the instance has no executing segment
            (not started, still loading, saving, finished or recovery-required).

        Raises:
            InvalidInputError: an empty or invalid *workflow_instance_id*.
            InvalidInputError: the workflow declares no such event (nothing is queued).
            ReentrancyError: called from a thread that does not run the runtime.
        """
        self._coordinator.engine.check_thread("runtime.workflows.signal()")
        iid = _live_event(workflow, workflow_instance_id, event)
        return self._coordinator.post_to_workflow(iid, workflow.name, event, payload)

    async def deliver(
        self,
        workflow: WorkflowDefinition[Any],
        workflow_instance_id: str,
        event: str,
        payload: Any = None,
    ) -> EventOutcome:
        """Deliver *event* to the live segment of an instance and learn what happened.

        Example::

            outcome = await runtime.workflows.deliver(flow, "order-1", "paid", 10)
            if outcome.status == "not_live": ...   # send_event(...) if it is halted

        Returns:
            An :class:`~phronomy.workflow.EventOutcome`: ``transitioned`` (a transition
            fired), ``rejected`` (every guard rejected it), ``dropped`` (the current
            state does not declare it) or ``not_live`` (no executing segment here).

        Raises:
            InvalidInputError: an invalid id, or the workflow declares no such event.
            ReentrancyError: called from a thread that does not run the runtime.
            Exception: what the event's transition raised (the segment failed with it).
            RuntimeShutdownError: the runtime shut down before the event was handled.

        Cancellation:
            Cancelling the caller stops the wait only: the event stays queued.
        """
        self._coordinator.engine.check_thread("runtime.workflows.deliver()")
        iid = _live_event(workflow, workflow_instance_id, event)
        caller: ResultHandle[EventOutcome | None] = ResultHandle(f"event:{iid}:{event}")
        posted = self._coordinator.post_to_workflow(
            iid, workflow.name, event, payload, caller=caller
        )
        outcome = await caller.result() if posted else None
        if outcome is None:
            return EventOutcome(
                workflow_instance_id=iid, event=event, status="not_live"
            )
        return outcome

    def statistics(self) -> WorkflowStatistics:
        """Counters of this runtime's workflows (live segments, what events did)."""
        return self._coordinator.statistics()


def _live_event(
    workflow: WorkflowDefinition[Any], workflow_instance_id: object, event: str
) -> str:
    iid = validate_instance_id(workflow_instance_id)
    if not workflow.has_event(event):
        raise InvalidInputError(
            f"Unknown event {event!r}. Valid events: {list(workflow.external_events)}"
        )
    return iid
