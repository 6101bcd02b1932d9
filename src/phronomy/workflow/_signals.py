"""Live instances: their segments, signals, awaited deliveries and statistics."""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import trio

from phronomy.engine import ResultHandle
from phronomy.errors import InvalidInputError, NotFoundError
from phronomy.storage import LoadOp, validate_instance_id

from ._hydration import decode_stored
from ._inbox_client import make_posting
from ._messages import Barrier, EventOutcome, InputOverlay, InstanceUpdate, PostCommand
from ._state import State
from ._watch import InstanceWatch

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator

    from ._coordinator import WorkflowCoordinator
    from ._definition import WorkflowDefinition
    from ._messages import LiveSegment, WorkflowStatistics

__all__ = ["LiveInstances"]

logger = logging.getLogger(__name__)

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
        *,
        event_id: str | None = None,
    ) -> bool:
        """Send *event* to an instance without waiting.

        Callable from any trio task of the runtime and from actions on the dispatcher
        (from another thread: ``runtime.from_thread.signal``). To learn what happened
        to the event, use :meth:`deliver`.

        With a store, the event goes through the instance's inbox (see
        :meth:`~phronomy.workflow.WorkflowClient.post`), so it reaches the instance
        in whichever process runs it, and a halted instance is resumed with it; a
        refusal (no such instance, a closed one) is logged. To know the event is
        stored, await ``post`` instead. Without a store, it reaches only a segment
        live in this runtime.

        Args:
            workflow: the instance's workflow.
            workflow_instance_id: the instance.
            event: the event.
            payload: its payload (with a store: a JSON value, see ``post``).
            event_id: with a store, its idempotency key (see ``post``).

        Returns:
            ``True`` if the event was queued (for the live session, or with a store to
            be stored), not that a transition matched; ``False`` without a store if
            the instance has no executing segment here (not started, still loading,
            saving, finished or recovery-required), and when the runtime is closing.

        Raises:
            InvalidInputError: an empty or invalid *workflow_instance_id*.
            InvalidInputError: the workflow declares no such event, or (with a store)
                a payload that cannot be stored (nothing is queued).
            ReentrancyError: called from a thread that does not run the runtime.
        """
        coordinator = self._coordinator
        coordinator.engine.check_thread("runtime.workflows.signal()")
        iid = _live_event(workflow, workflow_instance_id, event)
        if not self._through_inbox(iid):
            return coordinator.post_to_workflow(iid, workflow.name, event, payload)
        posting = make_posting(
            workflow, iid, event, payload, InputOverlay(), event_id=event_id
        )
        done: ResultHandle[Any] = ResultHandle(f"signal:{iid}:{event}")
        done.on_complete(_log_refusal)
        command = PostCommand(definition=workflow, posting=posting, done=done)
        return coordinator.post_message(command, completion=done)

    async def deliver(
        self,
        workflow: WorkflowDefinition[Any],
        workflow_instance_id: str,
        event: str,
        payload: Any = None,
        *,
        event_id: str | None = None,
    ) -> EventOutcome:
        """Send *event* to an instance and learn what happened to it.

        With a store, the event goes through the instance's inbox as with
        :meth:`signal`, and the call returns once it was applied (by whichever
        runtime runs the instance; bound the wait with :func:`trio.move_on_after`:
        the event stays stored).

        Example::

            outcome = await runtime.workflows.deliver(flow, "order-1", "paid", 10)
            if outcome.status == "dropped": ...   # its current state does not take it

        Returns:
            An :class:`~phronomy.workflow.EventOutcome`: ``transitioned`` (a transition
            fired), ``rejected`` (every guard rejected it), ``dropped`` (the current
            state does not declare it), ``refused`` (with a store: the instance closed
            before it was applied) or, without a store, ``not_live`` (no executing
            segment here).

        Raises:
            InvalidInputError: an invalid id, the workflow declares no such event, or
                (with a store) a payload that cannot be stored.
            NotFoundError: with a store, no such instance (nothing stored).
            InstanceStateError: with a store, the instance is finished or cancelled
                (nothing stored).
            ReentrancyError: called from a thread that does not run the runtime.
            Exception: what the event's transition raised (the segment failed with it).
            RuntimeShutdownError: the runtime shut down before the event was handled.

        Cancellation:
            Cancelling the caller stops the wait only: the event stays queued (with a
            store: stored).
        """
        coordinator = self._coordinator
        coordinator.engine.check_thread("runtime.workflows.deliver()")
        iid = _live_event(workflow, workflow_instance_id, event)
        caller: ResultHandle[EventOutcome | None] = ResultHandle(f"event:{iid}:{event}")
        if self._through_inbox(iid):
            posting = make_posting(
                workflow, iid, event, payload, InputOverlay(), event_id=event_id
            )
            done: ResultHandle[Any] = ResultHandle(f"deliver:{iid}:{event}")
            command = PostCommand(
                definition=workflow, posting=posting, done=done, outcome=caller
            )
            if not coordinator.post_message(command, completion=done):
                raise coordinator.engine.refusal("the delivery")
            await done.result()  # stored (or refused: nothing was)
            applied = await caller.result()
            assert applied is not None
            return applied
        posted = coordinator.post_to_workflow(
            iid, workflow.name, event, payload, caller=caller
        )
        outcome = await caller.result() if posted else None
        if outcome is None:
            return EventOutcome(
                workflow_instance_id=iid, event=event, status="not_live"
            )
        return outcome

    def _through_inbox(self, iid: str) -> bool:
        """Whether an event for *iid* is stored first (a store, and the instance is
        not an ephemeral segment live here)."""
        coordinator = self._coordinator
        if coordinator.gateway is None:
            return False
        session = coordinator.sessions.get(iid)
        return session is None or session.feed is not None

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
        iid = validate_instance_id(workflow_instance_id, workflow=workflow.name)
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
            await queued_before(coordinator)
            current = coordinator.current_update(iid)
            admitted = coordinator.admissions.get(iid) is not None
            if current is None:
                current = await _stored_update(coordinator, workflow, iid)
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


async def queued_before(coordinator: WorkflowCoordinator) -> None:
    """Wait until every command queued so far was delivered (FIFO)."""
    done: ResultHandle[None] = ResultHandle("barrier")
    if coordinator.post_message(Barrier(done=done), completion=done):
        await done.result()
    else:
        await trio.lowlevel.checkpoint()


async def _stored_update(
    coordinator: WorkflowCoordinator, workflow: WorkflowDefinition[Any], iid: str
) -> InstanceUpdate[Any] | None:
    gateway = coordinator.gateway
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
    iid = validate_instance_id(workflow_instance_id, workflow=workflow.name)
    if not workflow.has_event(event):
        raise InvalidInputError(
            f"Unknown event {event!r}. Valid events: {list(workflow.external_events)}"
        )
    return iid


def _log_refusal(done: ResultHandle[Any]) -> None:
    """A signal nobody waits for: its refusal (or failure to store) is logged."""
    if done.status == "failed":
        logger.warning("a signal was not stored: %r", done.error)
