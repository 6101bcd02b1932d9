"""A started supervised execution: its id, result and controls."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, final

import trio

from phronomy.errors import (
    InstanceStateError,
)

if TYPE_CHECKING:
    from phronomy.engine import HandleStatus

    from ._driver import Driver
    from ._messages import (
        ApprovalRequest,
        ExecutionOwner,
        ExecutionResult,
    )


__all__ = ["ExecutionHandle"]


class _Controls(Protocol):
    """What a handle asks of ``runtime.executions`` (see :class:`Executions`)."""

    def owner(self, execution_id: str) -> ExecutionOwner | None: ...

    def cancel(self, execution_id: str, reason: str | None = None) -> bool: ...

    def approve(self, execution_id: str, response: Any = None) -> None: ...

    def reject(self, execution_id: str, reason: Any = None) -> None: ...


@final
class ExecutionHandle:
    """A started execution: its id, its result, and its controls.

    Attributes:
        execution_id: the execution.
        agent_id: its key.
        plan: its plan (the generated workflow it runs as: watch it with
            ``runtime.workflows.watch(handle.plan, "agent:" + agent_id)``).
        handle: the caller's :class:`~phronomy.ResultHandle`.
    """

    def __init__(self, executions: _Controls, driver: Driver) -> None:
        """Internal: returned by :meth:`Executions.start`."""
        self._executions = executions
        self._driver = driver
        self.execution_id = driver.execution_id
        self.agent_id = driver.agent_id
        self.plan = driver.plan
        self.handle = driver.caller

    @property
    def done(self) -> bool:
        """Whether the execution's caller has settled."""
        return self.handle.done

    @property
    def status(self) -> HandleStatus:
        """``pending``, ``completed``, ``failed`` or ``cancelled``."""
        return self.handle.status

    async def result(self) -> ExecutionResult:
        """Wait for the execution's terminal outcome.

        Returns:
            The :class:`~phronomy.ExecutionResult` (``completed`` or ``rejected``).

        Raises:
            CancellationError: the execution was cancelled (:class:`~phronomy.DeadlineExceededError`
                for a deadline), once everything it started has physically finished.
            BusyError: the key was busy.
            RuntimeShutdownError: the runtime shut down first (the message says what
                the store keeps: a suspended execution stays suspended).
            Exception: whatever failed a step.

        Cancellation:
            Cancelling the waiter does not cancel the execution (use :meth:`cancel`).
        """
        return await self.handle.result()

    def owner(self) -> ExecutionOwner | None:
        """The read-only view of the live execution (``None`` once it ended)."""
        return self._executions.owner(self.execution_id)

    async def wait_for_approval(self) -> ApprovalRequest:
        """Wait until the execution suspends for an approval; return what it asks.

        Returns:
            The pending :class:`~phronomy.ApprovalRequest` (answer with :meth:`approve` or
            :meth:`reject`).

        Raises:
            InstanceStateError: the execution ended without asking (see :meth:`result`).

        Cancellation:
            Safe: the execution is not affected.
        """
        while True:
            owner = self.owner()
            if (
                owner is not None
                and owner.status == "suspended"
                and owner.pending_approval is not None
            ):
                await trio.lowlevel.checkpoint()
                return owner.pending_approval
            if self.handle.done:  # ended (or its caller settled directly)
                raise InstanceStateError(
                    f"execution {self.execution_id!r} ended ({self.handle.status}) without asking for an approval"
                )
            await self._driver.changed().wait()

    def cancel(self, reason: str | None = None) -> bool:
        """See :meth:`Executions.cancel`."""
        return self._executions.cancel(self.execution_id, reason)

    def approve(self, response: Any = None) -> None:
        """See :meth:`Executions.approve`."""
        self._executions.approve(self.execution_id, response)

    def reject(self, reason: Any = None) -> None:
        """See :meth:`Executions.reject`."""
        self._executions.reject(self.execution_id, reason)

    def __repr__(self) -> str:
        return f"<ExecutionHandle {self.execution_id!r} agent={self.agent_id!r} {self.status}>"
