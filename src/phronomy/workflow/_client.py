"""The public workflow API of a runtime: invoke, start, stream, send_event, resume, signal."""

from __future__ import annotations

import contextlib
import math
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar, final

import trio

from phronomy.engine import ResultHandle, random_uuid, tracked
from phronomy.errors import InvalidInputError
from phronomy.storage import validate_instance_id

from ._events import RESUME
from ._inbox_client import InboxClient, make_posting, sent_again_while_busy
from ._inputs import input_overlay, policy, resume_target
from ._messages import (
    CancelCommand,
    InputOverlay,
    ResumeCommand,
    StartCommand,
    Step,
    WorkflowResult,
)
from ._reading import InstanceReader
from ._signals import LiveInstances
from ._state import State
from ._stream import WorkflowStream
from ._timer_client import TimerClient

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Callable, Mapping

    from phronomy.engine import Caller

    from ._coordinator import WorkflowCoordinator
    from ._definition import WorkflowDefinition
    from ._messages import IfExists

__all__ = ["WorkflowClient"]

S = TypeVar("S", bound=State)


@final
class WorkflowClient(InboxClient, LiveInstances, TimerClient, InstanceReader):
    """Runs workflow definitions on one runtime (the workflow part of :class:`~phronomy.Runtime`)."""

    def __init__(
        self, coordinator: WorkflowCoordinator, *, recursion_limit: int
    ) -> None:
        """Internal: created by :func:`phronomy.open_runtime`."""
        if recursion_limit < 1:
            raise InvalidInputError(
                f"recursion_limit must be >= 1, got {recursion_limit}"
            )
        self._coordinator = coordinator
        self._recursion_limit = recursion_limit

    @property
    def durable(self) -> bool:
        """Whether a store is configured."""
        return self._coordinator.gateway is not None

    # --- starting ---------------------------------------------------------------------

    def start(
        self,
        workflow: WorkflowDefinition[S],
        input: Mapping[str, Any] | S | None = None,  # noqa: A002 - the workflow's input
        *,
        workflow_instance_id: str | None = None,
        recursion_limit: int | None = None,
        on_step: Callable[[Step[S]], object] | None = None,
        if_exists: IfExists = "refuse",
    ) -> ResultHandle[WorkflowResult[S]]:
        """Start a segment at the entry point without waiting for it.

        With a store and an explicit *workflow_instance_id*, the segment is durable:
        the stored fields are loaded first (the input overrides them) and the halted or
        finished state is saved before the handle settles. An id the store already
        holds follows *if_exists*: by default it is refused (whatever its status; see
        :data:`~phronomy.workflow.IfExists`).

        Args:
            workflow: a compiled :class:`~phronomy.WorkflowDefinition`.
            input: field values (validated) or a complete state.
            workflow_instance_id: the instance id (a UUID is generated if omitted).
            recursion_limit: transitions allowed in this segment (default: the runtime's).
            on_step: called on the dispatcher with each stable :class:`Step`; an exception
                fails the segment.
            if_exists: ``"refuse"``, ``"return"`` or ``"restart"`` (see
                :data:`~phronomy.workflow.IfExists`).

        Returns:
            A handle settled with the :class:`~phronomy.WorkflowResult` (or the
            segment's error: :class:`~phronomy.InstanceExistsError` for a refused
            stored instance, :class:`~phronomy.RuntimeShutdownError` when the runtime
            is closing, ...).

        Raises:
            InvalidInputError: *input* does not fit the state class.
            InvalidInputError: an empty or oversized *workflow_instance_id*.
            ReentrancyError: called from a thread that does not run the runtime (see
                :attr:`~phronomy.Runtime.from_thread`).
        """
        self._coordinator.engine.check_thread("runtime.workflows.start()")
        overlay = input_overlay(workflow, input)
        explicit = workflow_instance_id is not None
        iid = (
            validate_instance_id(workflow_instance_id, workflow=workflow.name)
            if explicit
            else random_uuid()
        )
        caller: ResultHandle[WorkflowResult[S]] = ResultHandle(
            f"workflow:{workflow.name}:{iid}"
        )
        command = StartCommand(
            definition=workflow,
            input=overlay,
            workflow_instance_id=iid,
            explicit_id=explicit,
            owner=object(),
            recursion_limit=self._limit(recursion_limit),
            caller=caller,
            observer=on_step,
            if_exists=policy(if_exists),
        )
        self._post(command, caller, "start")
        return caller

    def start_as(
        self,
        workflow: WorkflowDefinition[S],
        state: S,
        *,
        workflow_instance_id: str,
        caller: Caller[WorkflowResult[S]],
        on_step: Callable[[Step[S]], object] | None,
        if_exists: IfExists,
    ) -> None:
        """Internal (the executions' driver): :meth:`start` for a caller of its own
        (settled by its owner at shutdown: it is not tracked); *state* is complete,
        the id valid and the thread checked."""
        command = StartCommand(
            definition=workflow,
            input=InputOverlay(state=state),
            workflow_instance_id=workflow_instance_id,
            explicit_id=True,
            owner=object(),
            recursion_limit=self._recursion_limit,
            caller=caller,
            observer=on_step,
            if_exists=if_exists,
        )
        self._post(command, caller, "start")

    async def invoke(
        self,
        workflow: WorkflowDefinition[S],
        input: Mapping[str, Any] | S | None = None,  # noqa: A002
        *,
        workflow_instance_id: str | None = None,
        recursion_limit: int | None = None,
        on_step: Callable[[Step[S]], object] | None = None,
        if_exists: IfExists = "refuse",
    ) -> WorkflowResult[S]:
        """Run a segment and return its result; see :meth:`start` for the arguments.

        Returns:
            The finished or halted :class:`~phronomy.WorkflowResult`.

        Raises:
            Exception: whatever failed the segment (an action's exception,
                :class:`~phronomy.BusyError`, :class:`~phronomy.ConflictError`, ...).

        Cancellation:
            Cancelling the caller stops the wait only; the segment keeps running (its
            durable outcome is saved as usual).
        """
        handle = self.start(
            workflow,
            input,
            workflow_instance_id=workflow_instance_id,
            recursion_limit=recursion_limit,
            on_step=on_step,
            if_exists=if_exists,
        )
        return await handle.result()

    @asynccontextmanager
    async def stream(
        self,
        workflow: WorkflowDefinition[S],
        input: Mapping[str, Any] | S | None = None,  # noqa: A002
        *,
        workflow_instance_id: str | None = None,
        recursion_limit: int | None = None,
        if_exists: IfExists = "refuse",
    ) -> AsyncGenerator[WorkflowStream[S]]:
        """Start a segment and iterate over its stable states, in order.

        A halted (or declared-leaf) state of a durable segment is published only after
        its save succeeded. Leaving the block early stops the iteration; the segment
        itself keeps running to its end.

        Example::

            async with runtime.workflows.stream(flow, {"item": "lamp"}) as steps:
                async for step in steps:
                    print(step.phase, step.state)
            result = await steps.result()

        Yields:
            A :class:`~phronomy.workflow.WorkflowStream`.

        Cancellation:
            Leaving the block (or cancelling the consumer) stops the iteration only; the
            segment runs on to its end.
        """
        send, receive = trio.open_memory_channel[Step[S]](math.inf)

        def observe(step: Step[S]) -> None:
            # The consumer may have left the block: its steps are then dropped.
            with contextlib.suppress(
                trio.BrokenResourceError, trio.ClosedResourceError
            ):
                send.send_nowait(step)

        handle = self.start(
            workflow,
            input,
            workflow_instance_id=workflow_instance_id,
            recursion_limit=recursion_limit,
            on_step=observe,
            if_exists=if_exists,
        )
        handle.on_complete(lambda _: send.close())
        with receive:
            yield WorkflowStream(receive, handle)

    # --- resuming ---------------------------------------------------------------------

    async def send_event(
        self,
        workflow: WorkflowDefinition[S],
        event: str,
        *,
        halted: WorkflowResult[S] | None = None,
        workflow_instance_id: str | None = None,
        payload: Any = None,
        input: Mapping[str, Any] | S | None = None,  # noqa: A002
        recursion_limit: int | None = None,
        on_step: Callable[[Step[S]], object] | None = None,
        event_id: str | None = None,
    ) -> WorkflowResult[S]:
        """Fire *event* at a halted instance and wait for the segment it starts.

        Give either the *halted* result (its state is the starting point; with a store
        it must still match the durable snapshot, else :class:`~phronomy.ConflictError`)
        or just the *workflow_instance_id* (the halted state is loaded from the store).

        With a store the event goes through the instance's inbox (see :meth:`post`): it
        is stored first (with the claim of the instance, in one transaction), then
        applied once, in order; the call returns the saved result of the segment that
        applied it. An instance another runtime holds applies it from its inbox: the
        call waits for that (bound the wait with :func:`trio.move_on_after`; the
        event stays stored). *on_step* sees the steps of a segment this runtime runs.

        Example::

            done = await runtime.workflows.send_event(flow, "approve", workflow_instance_id="order-1")
            done = await runtime.workflows.send_event(flow, "approve", halted=halted, payload="ok")

        Args:
            workflow: the compiled workflow.
            event: the event to fire (``"resume"``: the first event of the halted phase).
            halted: a halted :class:`~phronomy.WorkflowResult`.
            workflow_instance_id: resume by id (requires a store).
            payload: the event's payload (guards and actions see ``event.payload``).
            input: field values merged into the state before the event fires.
            recursion_limit: transitions allowed (default: the runtime's).
            on_step: as in :meth:`start`.
            event_id: with a store, the event's idempotency key (see :meth:`post`): a
                retried call with the same id waits for the first one's event.

        Returns:
            The new segment's result.

        Raises:
            InvalidInputError: the workflow declares no such event.
            InstanceStateError: the instance is finished, or has no event for ``resume``.
            TransitionError: the event does not leave the halted phase.
            NotFoundError: resume by id, but the store has no state for the instance.
            ConflictError: the durable state diverged from *halted*.
            EventRejectedError: every guard rejected the event (nothing changed).
            RecoveryRequiredError: the instance requires recovery (with a store, the
                event stays stored and is applied once an operator resolved it).
            BusyError: with a store, another transaction kept writing the instance's
                row through every retry (nothing was stored: send it again).

        Cancellation:
            As :meth:`invoke` (with a store, the event stays stored and is applied).
        """
        if self.durable and event_id is None:  # one id for every try: a repeat is one
            event_id = random_uuid()

        async def attempt() -> WorkflowResult[S]:
            handle = self.start_event(
                workflow,
                event,
                halted=halted,
                workflow_instance_id=workflow_instance_id,
                payload=payload,
                input=input,
                recursion_limit=recursion_limit,
                on_step=on_step,
                event_id=event_id,
            )
            return await handle.result()

        if not self.durable:  # nothing is stored: a busy instance stays busy
            return await attempt()
        return await sent_again_while_busy(attempt)

    async def resume(
        self,
        workflow: WorkflowDefinition[S],
        halted: WorkflowResult[S] | None = None,
        *,
        workflow_instance_id: str | None = None,
        input: Mapping[str, Any] | S | None = None,  # noqa: A002
    ) -> WorkflowResult[S]:
        """``send_event(workflow, "resume", halted=halted, ...)``: fire the halted phase's
        first event.

        Cancellation:
            As :meth:`send_event`.
        """
        return await self.send_event(
            workflow,
            RESUME,
            halted=halted,
            workflow_instance_id=workflow_instance_id,
            input=input,
        )

    def start_event(
        self,
        workflow: WorkflowDefinition[S],
        event: str,
        *,
        halted: WorkflowResult[S] | None = None,
        workflow_instance_id: str | None = None,
        payload: Any = None,
        input: Mapping[str, Any] | S | None = None,  # noqa: A002
        recursion_limit: int | None = None,
        on_step: Callable[[Step[S]], object] | None = None,
        event_id: str | None = None,
    ) -> ResultHandle[WorkflowResult[S]]:
        """:meth:`send_event` without waiting: queue the new segment, return its handle.

        With a store, the event is acknowledged only by the handle (once the segment
        that applied it saved); to return as soon as it is stored, use :meth:`post`.

        Returns:
            A handle settled with the segment's :class:`~phronomy.WorkflowResult` or
            its error (see :meth:`send_event` for both).

        Raises:
            InvalidInputError: a bad argument (checked before anything is queued).
            ReentrancyError: called from a thread that does not run the runtime.
        """
        self._coordinator.engine.check_thread("runtime.workflows.start_event()")
        iid, event = resume_target(
            workflow, event, halted, workflow_instance_id, durable=self.durable
        )
        overlay = input_overlay(workflow, input)
        posting = None
        if self.durable:
            posting = make_posting(
                workflow,
                iid,
                event,
                payload,
                overlay,
                event_id=event_id,
                expected_revision=None if halted is None else halted.revision,
            )
        caller: ResultHandle[WorkflowResult[S]] = ResultHandle(
            f"workflow-resume:{workflow.name}:{iid}"
        )
        command = ResumeCommand(
            definition=workflow,
            halted=halted,
            event=event,
            payload=payload,
            input=overlay,
            workflow_instance_id=iid,
            owner=object(),
            recursion_limit=self._limit(recursion_limit),
            caller=caller,
            observer=on_step,
            posting=posting,
        )
        self._post(command, caller, "resume")
        return caller

    # --- cancelling ----------------------------------------------------------

    async def cancel(
        self,
        workflow: WorkflowDefinition[S],
        workflow_instance_id: str,
        *,
        reason: str | None = None,
        force: bool = False,
    ) -> WorkflowResult[S]:
        """Cancel an instance; it ends with the status ``cancelled`` (a closed status).

        A segment live in this runtime stops taking events, its effects' trio work is
        cancelled and their worker threads are waited for (never abandoned), then the
        instance is saved as ``cancelled`` and the segment's caller fails with
        :class:`~phronomy.WorkflowCancelledError`. A halted (or failed) instance is
        saved as ``cancelled`` directly. An instance loading or saving here is
        cancelled once that is done. An instance live in another runtime (process or
        machine) is asked through its row: that runtime cancels it at its next
        heartbeat, and this call returns once the row says so. Cancelling a cancelled
        instance returns it again.

        Example::

            await runtime.workflows.cancel(flow, "order-1", reason="customer left")

        Args:
            workflow: the instance's workflow.
            workflow_instance_id: the instance.
            reason: saved with the instance (and given to the segment's caller).
            force: also cancel a stored ``running`` instance that holds no lease (left
                by a release without leases): only when you know no process runs it.

        Returns:
            The cancelled instance (``status="cancelled"``; its revision with a store).

        Raises:
            NotFoundError: nothing is live or stored under that id.
            InstanceStateError: it is finished, or ``running`` without a lease
                (unless *force*).
            RecoveryRequiredError: it requires recovery first.
            InvalidInputError: an invalid id or reason.
            ReentrancyError: called from a thread that does not run the runtime.

        Cancellation:
            Cancelling the caller stops the wait only: the cancellation goes on.
        """
        self._coordinator.engine.check_thread("runtime.workflows.cancel()")
        iid = validate_instance_id(workflow_instance_id, workflow=workflow.name)
        if reason is not None and not isinstance(reason, str):
            raise InvalidInputError(f"reason must be text, got {type(reason).__name__}")
        done: ResultHandle[WorkflowResult[S]] = ResultHandle(f"cancel:{iid}")
        command = CancelCommand(
            definition=workflow,
            workflow_instance_id=iid,
            reason=reason,
            force=bool(force),
            owner=object(),
            done=done,
        )
        self._post(command, done, "cancel")
        return await done.result()

    # --- internals -----------------------------------------------------------------

    def _limit(self, recursion_limit: int | None) -> int:
        if recursion_limit is None:
            return self._recursion_limit
        if recursion_limit < 1:
            raise InvalidInputError(
                f"recursion_limit must be >= 1, got {recursion_limit}"
            )
        return recursion_limit

    def _post(
        self,
        command: StartCommand | ResumeCommand | CancelCommand,
        caller: Caller[Any],
        what: str,
    ) -> None:
        if not self._coordinator.post_message(
            command, admission=True, completion=tracked(caller)
        ):
            caller.fail(self._coordinator.engine.refusal(f"the workflow {what}"))
