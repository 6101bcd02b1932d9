"""Live instances: their segments, signals, awaited deliveries and statistics."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import trio

from phronomy.engine import ResultHandle
from phronomy.errors import InvalidInputError, NotFoundError
from phronomy.storage import LoadOp, validate_instance_id

from ._hydration import decode_stored
from ._messages import Barrier, EventOutcome, InstanceUpdate
from ._state import State
from ._watch import InstanceWatch

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator

    from ._coordinator import WorkflowCoordinator
    from ._definition import WorkflowDefinition
    from ._messages import LiveSegment, WorkflowStatistics

__all__ = ["LiveInstances"]

S = TypeVar("S", bound=State)


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

    @asynccontextmanager
    async def watch(
        self,
        workflow: WorkflowDefinition[S],
        workflow_instance_id: str,
        *,
        buffer: int = 1024,
        if_missing: Literal["raise", "wait"] = "raise",
    ) -> AsyncGenerator[InstanceWatch[S]]:
        """Follow an instance's stable states from any trio task, across segments.

        The first update is the current one (the live segment's, or what the store
        says); then every stable state a segment passes or waits at (``running``)
        and how each segment ends (``halted``, ``finished``, ``cancelled``,
        ``failed``), in order. Nothing is coalesced unless the consumer falls more
        than *buffer* updates behind (then the next update says how many it missed).

        An instance that exists nowhere yet (no live segment here, no start queued
        here before the watch, nothing in the store) raises
        :class:`~phronomy.NotFoundError`, unless *if_missing* is ``"wait"``: then
        the watch waits for its first update (bound the wait with
        :func:`trio.move_on_after`).

        Example::

            async with runtime.workflows.watch(flow, "order-1") as updates:
                async for update in updates:
                    print(update.status, update.phase)
                    if update.status in ("finished", "cancelled", "failed"):
                        break

        Args:
            workflow: the instance's workflow (its state class decodes stored states).
            workflow_instance_id: the instance.
            buffer: updates kept for a slow consumer.
            if_missing: ``"raise"`` (:class:`~phronomy.NotFoundError` for an
                instance that does not exist) or ``"wait"`` (for one about to be
                started, for example by another process).

        Yields:
            An :class:`~phronomy.workflow.InstanceWatch` (an async iterator of
            :class:`~phronomy.workflow.InstanceUpdate`).

        Raises:
            NotFoundError: the instance does not exist (with ``if_missing="raise"``).
            InvalidInputError: an invalid id, buffer or *if_missing*.
            InstanceStateError: the stored instance belongs to another workflow.
            ReentrancyError: called from a thread that does not run the runtime.
            CorruptRecordError: the stored state does not decode.

        Cancellation:
            Safe: cancelling the consumer loses no update and changes nothing; leaving the
            block stops the watch.
        """
        self._coordinator.engine.check_thread("runtime.workflows.watch()")
        iid = validate_instance_id(workflow_instance_id)
        given: object = buffer  # checked at run time: callers are not typed
        if isinstance(given, bool) or not isinstance(given, int) or given < 1:
            raise InvalidInputError(f"buffer must be an integer >= 1, got {buffer!r}")
        if if_missing not in ("raise", "wait"):
            raise InvalidInputError(
                f"if_missing must be 'raise' or 'wait', got {if_missing!r}"
            )
        coordinator = self._coordinator
        watch: InstanceWatch[S] = InstanceWatch(iid, buffer)
        coordinator.watchers.add(watch)
        try:
            # commands queued before the watch (a start just made) are admitted first
            await self._queued_before()
            current = coordinator.current_update(iid)
            admitted = coordinator.admissions.get(iid) is not None
            if current is None:
                current = await self._stored_update(workflow, iid)
                if current is None and not admitted and if_missing == "raise":
                    raise NotFoundError(
                        f"workflow instance {iid!r} does not exist (nothing live in "
                        "this runtime, nothing stored); to wait for one about to be "
                        "started, watch it with if_missing='wait'",
                        instance_id=iid,
                    )
                if watch.published:  # a segment moved on while the store was read
                    current = None
            if current is not None:
                watch.publish(current)
            yield watch
        finally:
            coordinator.watchers.remove(watch)

    async def _queued_before(self) -> None:
        """Wait until every command queued so far was delivered (FIFO)."""
        done: ResultHandle[None] = ResultHandle("barrier")
        if self._coordinator.post_message(Barrier(done=done), completion=done):
            await done.result()
        else:
            await trio.lowlevel.checkpoint()

    async def _stored_update(
        self, workflow: WorkflowDefinition[Any], iid: str
    ) -> InstanceUpdate[Any] | None:
        gateway = self._coordinator.gateway
        if gateway is None:
            return None

        record, decoded = await gateway.run(
            LoadOp(workflow_instance_id=iid),
            finish=lambda row: decode_stored(workflow, row, resuming=False),
        )
        if record is None:
            return None
        return InstanceUpdate(
            workflow_instance_id=iid,
            status=record.status,
            phase=record.phase,
            state=None if decoded is None else decoded.fields,
            revision=record.revision,
        )


def _live_event(
    workflow: WorkflowDefinition[Any], workflow_instance_id: object, event: str
) -> str:
    iid = validate_instance_id(workflow_instance_id)
    if not workflow.has_event(event):
        raise InvalidInputError(
            f"Unknown event {event!r}. Valid events: {list(workflow.external_events)}"
        )
    return iid
