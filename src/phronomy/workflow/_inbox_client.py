"""The part of the workflow client that stores events and reads what became of
them: ``post``, ``receipt``, ``history``."""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any, TypeVar, cast

import trio

from phronomy.engine import ResultHandle, random_uuid
from phronomy.errors import BusyError, InvalidInputError
from phronomy.storage import (
    EntryOp,
    HistoryOp,
    InboxEntry,
    InboxOp,
    Posting,
    Takeover,
    check_limit,
    validate_event_id,
    validate_instance_id,
)

from ._events import RESUME
from ._inbox import EventReceipt, encode_input, encode_payload, receipt_of
from ._inputs import input_overlay
from ._messages import PostCommand, StartCommand
from ._state import State

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

    from phronomy.storage import SaveLogEntry

    from ._coordinator import WorkflowCoordinator
    from ._definition import WorkflowDefinition
    from ._messages import InputOverlay

__all__ = ["InboxClient", "interleave", "make_posting"]

S = TypeVar("S", bound=State)
T = TypeVar("T")

BUSY_RETRIES = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
"""Pauses before a post is sent again (with its event id) that found its instance's
row written by another transaction and stored nothing: a start another runtime is
committing, or (PostgreSQL) a write of the runtime that holds it (a group commit)."""


class InboxClient:
    """Storing events for instances by id, and their history (a part of
    :class:`~phronomy.workflow.WorkflowClient`)."""

    _coordinator: WorkflowCoordinator
    _recursion_limit: int

    async def post(
        self,
        workflow: WorkflowDefinition[S],
        workflow_instance_id: str,
        event: str,
        payload: Any = None,
        *,
        event_id: str | None = None,
        input: Mapping[str, Any] | S | None = None,  # noqa: A002 - the event's input
        start: Mapping[str, Any] | S | None = None,
    ) -> EventReceipt:
        """Store *event* in the instance's inbox and return once it is durable.

        The event is applied exactly once, in the order events were stored, by
        whichever runtime runs the instance: this one at once if the instance is live
        here or halted (it resumes it), the one that holds it otherwise (its inbox
        poll finds the event). Its outcome is recorded with the revision it produced;
        look it up with :meth:`receipt`, or wait for it with :meth:`send_event` (which
        stores the same way).

        Example (a webhook: answer 202 once the approval is stored)::

            receipt = await runtime.workflows.post(
                order_flow, order_id, "approve", {"by": user}, event_id=request_id
            )

        Args:
            workflow: the instance's workflow (the event must be one of its events,
                or ``"resume"``: the halted phase's first event).
            workflow_instance_id: the instance.
            event: the event's name.
            payload: what guards and actions see as ``event.payload``: a JSON value
                (text, numbers, booleans, ``None``, lists, dicts with text keys), at
                most 1 MiB encoded.
            event_id: the idempotency key (default: a new UUID). A repeat of an id
                stores nothing and is answered with the first receipt
                (``duplicate=True``); an id used for another event is refused.
            input: field values merged into the state when the event is applied.
            start: start the instance with this input if it does not exist (an empty
                mapping: with no input), storing the event in the same transaction
                (it is applied once the first segment waits for it); exactly one of
                concurrent posts that start the same id starts it.

        Returns:
            The :class:`~phronomy.workflow.EventReceipt`: its sequence number, whether
            it was a repeat or started the instance, and what happens next.

        Raises:
            NotFoundError: no such instance, and *start* was not given (nothing
                stored).
            InstanceStateError: the instance is finished or cancelled (nothing stored).
            InvalidInputError: no store, an unknown event, a payload or input that
                cannot be stored, an invalid id or event id, or an event id used for
                another event (nothing stored).
            ReentrancyError: called from a thread that does not run the runtime.
            BusyError: with *start*, another runtime was still creating the instance
                after every retry (nothing stored: post it again).
            StoreUnavailableError: the store could not be reached (the event may be
                stored: post it again with the same *event_id* to know).

        Cancellation:
            Cancelling the caller stops the wait only: the event may be stored (post
            it again with the same *event_id* to learn its receipt).
        """
        coordinator = self._coordinator
        coordinator.engine.check_thread("runtime.workflows.post()")
        if coordinator.gateway is None:
            raise InvalidInputError(
                "post stores the event: it needs a store (open_runtime(store=...))"
            )
        iid = validate_instance_id(workflow_instance_id, workflow=workflow.name)
        posting = make_posting(
            workflow,
            iid,
            event,
            payload,
            input_overlay(workflow, input),
            event_id=event_id,
        )
        attempt = functools.partial(self._post_once, workflow, posting, start)
        if start is None:  # a plain post waits for the row (it never finds it busy)
            return await attempt()
        return await sent_again_while_busy(attempt)

    async def _post_once(
        self,
        workflow: WorkflowDefinition[S],
        posting: Posting,
        start: Mapping[str, Any] | S | None,
    ) -> EventReceipt:
        coordinator = self._coordinator
        iid, event = posting.workflow_instance_id, posting.event
        done: ResultHandle[EventReceipt] = ResultHandle(f"post:{iid}:{event}")
        message: PostCommand | StartCommand
        if start is None:
            message = PostCommand(definition=workflow, posting=posting, done=done)
        else:
            message = StartCommand(
                definition=workflow,
                input=input_overlay(workflow, start),
                workflow_instance_id=iid,
                explicit_id=True,
                owner=object(),
                recursion_limit=self._recursion_limit,
                caller=done,
                posting=posting,
            )
        # a post that may start the instance is an admission (refused while the
        # runtime drains); one that only stores is not: a live segment here takes it
        starts = start is not None
        if not coordinator.post_message(message, admission=starts, completion=done):
            done.fail(coordinator.engine.refusal("the post"))
        return await done.result()

    async def receipt(
        self, workflow_instance_id: str, event_id: str
    ) -> EventReceipt | None:
        """The receipt of a stored event as it stands now (``None``: the store has no
        event with that id for the instance; consumed events are kept as deep as the
        save log).

        Raises:
            InvalidInputError: no store, or an invalid id or event id.

        Cancellation:
            Safe: nothing is changed.
        """
        gateway = self._coordinator.gateway
        if gateway is None:
            raise InvalidInputError("receipt needs a store (open_runtime(store=...))")
        iid = validate_instance_id(workflow_instance_id)
        op = EntryOp(workflow_instance_id=iid, event_id=validate_event_id(event_id))
        entry = await gateway.run(op)
        if entry is None:
            return None
        return receipt_of(entry, duplicate=False, started=False, then="queued")

    async def history(
        self, workflow_instance_id: str, *, limit: int = 100, events: bool = True
    ) -> list[SaveLogEntry | InboxEntry]:
        """The instance's last saves and events, newest first.

        A save (:class:`~phronomy.storage.SaveLogEntry`) says its revision, status,
        phase, time, ``write_id`` and definition version; an event
        (:class:`~phronomy.storage.InboxEntry`) its id, name, payload, when it was
        stored and consumed, its outcome and the revision it produced. An event is
        listed where it was consumed (just below the save that consumed it), or on top
        while it is pending. The store keeps ``save_log_depth`` of each.

        Args:
            workflow_instance_id: the instance.
            limit: at most this many items.
            events: include events (else saves only).

        Raises:
            InvalidInputError: an invalid id or limit, or the runtime has no store.

        Cancellation:
            Safe: nothing is changed.
        """
        iid = validate_instance_id(workflow_instance_id)
        limit = check_limit(limit)
        gateway = self._coordinator.gateway
        if gateway is None:
            raise InvalidInputError("history needs a store (open_runtime(store=...))")
        saves: list[SaveLogEntry] = await gateway.run(
            HistoryOp(workflow_instance_id=iid, limit=limit)
        )
        if not events:
            return list(saves)
        inbox: tuple[InboxEntry, ...] = await gateway.run(
            InboxOp(workflow_instance_id=iid, pending_only=False, limit=limit)
        )
        merged = interleave(saves, inbox)[:limit]  # (no takeovers asked for)
        return cast("list[SaveLogEntry | InboxEntry]", merged)


async def sent_again_while_busy(attempt: Callable[[], Awaitable[T]]) -> T:
    """Run *attempt* (a store of one event, by its event id) and run it again after
    each pause of :data:`BUSY_RETRIES` while it raises :class:`~phronomy.BusyError`
    (it stored nothing; a repeat of the id is one event).

    Raises:
        BusyError: the last attempt was busy too.

    Cancellation:
        Stops between attempts; an attempt in flight may have stored the event.
    """
    for pause in BUSY_RETRIES:
        try:
            return await attempt()
        except BusyError:
            await trio.sleep(pause)
    return await attempt()


def make_posting(
    workflow: WorkflowDefinition[Any],
    iid: str,
    event: str,
    payload: Any,
    overlay: InputOverlay,
    *,
    event_id: str | None,
    expected_revision: int | None = None,
) -> Posting:
    """An event for the instance's inbox, checked and encoded.

    Raises:
        InvalidInputError: an unknown event, a payload or input that cannot be stored,
            or an invalid event id.
    """
    if not isinstance(event, str):
        raise InvalidInputError(f"the event's name must be a string, got {event!r}")
    if event != RESUME and not workflow.has_event(event):
        raise InvalidInputError(
            f"Unknown event {event!r} for workflow instance {iid!r}. Valid events: "
            f"{list(workflow.external_events)}"
        )
    return Posting(
        workflow_instance_id=iid,
        event_id=random_uuid() if event_id is None else validate_event_id(event_id),
        event=event,
        payload=encode_payload(payload, event=event, instance=iid),
        input=encode_input(overlay, instance=iid),
        expected_revision=expected_revision,
    )


def interleave(
    saves: list[SaveLogEntry],
    entries: tuple[InboxEntry, ...],
    takeovers: tuple[Takeover, ...] = (),
) -> list[SaveLogEntry | InboxEntry | Takeover]:
    """Saves, events and takeovers in one history, newest first: a consumed event
    just below the save that consumed it (the revision it names), pending ones on top,
    a takeover just above the save it put the instance back at."""

    def key(item: SaveLogEntry | InboxEntry | Takeover) -> tuple[float, int, int]:
        if isinstance(item, InboxEntry):
            if item.status == "pending" or item.revision is None:
                return (math.inf, 0, item.seq)
            return (item.revision, 0, item.seq)
        if isinstance(item, Takeover):
            return (item.revision, 2, item.epoch)
        return (item.revision, 1, 0)

    return sorted([*saves, *entries, *takeovers], key=key, reverse=True)
