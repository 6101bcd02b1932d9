"""``runtime.from_thread``: call a runtime from threads that do not run its trio loop."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, TypeVar, final

import trio

from phronomy.errors import ReentrancyError, RuntimeShutdownError
from phronomy.workflow import State

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

    from phronomy.workflow import (
        EventOutcome,
        IfExists,
        WorkflowClient,
        WorkflowDefinition,
        WorkflowResult,
    )

__all__ = ["ThreadPortal"]

T = TypeVar("T")
S = TypeVar("S", bound=State)


@final
class ThreadPortal:
    """Blocking twins of the runtime's operations for code outside trio.

    Web framework threads (Django, Flask), callbacks from C libraries and other plain
    threads reach the runtime here; each call runs on the runtime's trio thread through
    its trio token and blocks the calling thread until it is done::

        # in a Flask view, while the runtime runs in another thread
        result = runtime.from_thread.send_event(
            order_flow, "approve", workflow_instance_id=order_id
        )

    The calls behave exactly like the async ones (same arguments, results and
    errors). Calling them from a thread that runs a trio loop would block that loop
    (and deadlock on the runtime's own thread), so it raises
    :class:`~phronomy.ReentrancyError`; once the trio run that hosts the
    runtime has ended they raise :class:`~phronomy.RuntimeShutdownError`.

    Thread-safety: every method may be called from any number of threads at once.
    """

    def __init__(self, client: WorkflowClient, token: trio.lowlevel.TrioToken) -> None:
        """Internal: reached as ``runtime.from_thread``."""
        self._client = client
        self._token = token

    def invoke(
        self,
        workflow: WorkflowDefinition[S],
        input: Mapping[str, Any] | S | None = None,  # noqa: A002 - the workflow's input
        *,
        workflow_instance_id: str | None = None,
        if_exists: IfExists = "refuse",
        recursion_limit: int | None = None,
    ) -> WorkflowResult[S]:
        """Blocking :meth:`~phronomy.workflow.WorkflowClient.invoke`.

        Raises:
            ReentrancyError: called from a thread that runs a trio loop.
            RuntimeShutdownError: the runtime's trio run has ended.
        """
        return self.run(
            functools.partial(
                self._client.invoke,
                workflow,
                input,
                workflow_instance_id=workflow_instance_id,
                if_exists=if_exists,
                recursion_limit=recursion_limit,
            )
        )

    def send_event(
        self,
        workflow: WorkflowDefinition[S],
        event: str,
        *,
        halted: WorkflowResult[S] | None = None,
        workflow_instance_id: str | None = None,
        payload: Any = None,
        input: Mapping[str, Any] | S | None = None,  # noqa: A002
    ) -> WorkflowResult[S]:
        """Blocking :meth:`~phronomy.workflow.WorkflowClient.send_event`.

        Raises:
            ReentrancyError: called from a thread that runs a trio loop.
            RuntimeShutdownError: the runtime's trio run has ended.
        """
        return self.run(
            functools.partial(
                self._client.send_event,
                workflow,
                event,
                halted=halted,
                workflow_instance_id=workflow_instance_id,
                payload=payload,
                input=input,
            )
        )

    def resume(
        self,
        workflow: WorkflowDefinition[S],
        halted: WorkflowResult[S] | None = None,
        *,
        workflow_instance_id: str | None = None,
    ) -> WorkflowResult[S]:
        """Blocking :meth:`~phronomy.workflow.WorkflowClient.resume`.

        Raises:
            ReentrancyError: called from a thread that runs a trio loop.
            RuntimeShutdownError: the runtime's trio run has ended.
        """
        return self.run(
            functools.partial(
                self._client.resume,
                workflow,
                halted,
                workflow_instance_id=workflow_instance_id,
            )
        )

    def signal(
        self,
        workflow: WorkflowDefinition[Any],
        workflow_instance_id: str,
        event: str,
        payload: Any = None,
    ) -> bool:
        """:meth:`~phronomy.workflow.WorkflowClient.signal` from a thread (waits only
        for the event to be queued).

        Raises:
            ReentrancyError: called from a thread that runs a trio loop.
            RuntimeShutdownError: the runtime's trio run has ended.
        """
        return self.run_sync(
            self._client.signal, workflow, workflow_instance_id, event, payload
        )

    def deliver(
        self,
        workflow: WorkflowDefinition[Any],
        workflow_instance_id: str,
        event: str,
        payload: Any = None,
    ) -> EventOutcome:
        """Blocking :meth:`~phronomy.workflow.WorkflowClient.deliver`.

        Raises:
            ReentrancyError: called from a thread that runs a trio loop.
            RuntimeShutdownError: the runtime's trio run has ended.
        """
        return self.run(
            functools.partial(
                self._client.deliver, workflow, workflow_instance_id, event, payload
            )
        )

    def cancel(
        self,
        workflow: WorkflowDefinition[S],
        workflow_instance_id: str,
        *,
        reason: str | None = None,
        force: bool = False,
    ) -> WorkflowResult[S]:
        """Blocking :meth:`~phronomy.workflow.WorkflowClient.cancel`.

        Raises:
            ReentrancyError: called from a thread that runs a trio loop.
            RuntimeShutdownError: the runtime's trio run has ended.
        """
        return self.run(
            functools.partial(
                self._client.cancel,
                workflow,
                workflow_instance_id,
                reason=reason,
                force=force,
            )
        )

    def run(self, fn: Callable[[], Awaitable[T]]) -> T:
        """Run ``await fn()`` on the runtime's trio thread and return its result.

        For operations without a twin here, for example
        ``runtime.from_thread.run(functools.partial(runtime.executions.invoke, key, steps))``.

        Raises:
            ReentrancyError: called from a thread that runs a trio loop.
            RuntimeShutdownError: the runtime's trio run has ended.
        """
        _check_not_in_trio()
        try:
            return trio.from_thread.run(fn, trio_token=self._token)
        except trio.RunFinishedError:
            raise _closed() from None

    def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the runtime's trio thread and return its result.

        Raises:
            ReentrancyError: called from a thread that runs a trio loop.
            RuntimeShutdownError: the runtime's trio run has ended.
        """
        _check_not_in_trio()
        try:
            return trio.from_thread.run_sync(fn, *args, trio_token=self._token)
        except trio.RunFinishedError:
            raise _closed() from None


def _check_not_in_trio() -> None:
    if trio.lowlevel.in_trio_run():
        raise ReentrancyError(
            "runtime.from_thread blocks its thread until the runtime answers, so it "
            "cannot be called from a thread that runs a trio loop (that loop would "
            "stop); from trio code, await the runtime's async methods instead"
        )


def _closed() -> RuntimeShutdownError:
    return RuntimeShutdownError(
        "the trio run that hosted this runtime has ended; runtime.from_thread cannot "
        "reach it any more"
    )
