"""The workflow coordinator's driver of the instance protocol: it carries out what
:meth:`Instance.handle <phronomy.instance.Instance.handle>` returns."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, final

import outcome

from phronomy.errors import RecoveryRequiredError, RuntimeShutdownError
from phronomy.instance import (
    CancelSession,
    Complete,
    DropLease,
    Fail,
    FailSession,
    FollowUp,
    HoldLease,
    Offer,
    Publish,
    Refused,
    Rerun,
    ShutDown,
    StartSession,
    Submit,
)

from ._continuations import CancelAsked, LeaseLost
from ._messages import InstanceUpdate

if TYPE_CHECKING:
    from collections.abc import Callable

    from phronomy.engine import Caller
    from phronomy.errors import LeaseLostError
    from phronomy.storage import DeleteOp, InboxEntry, MarkOp

    from ._context import Coordination
    from ._continuations import WorkflowInstance, WorkflowOutput
    from ._messages import CancelCommand
    from ._session import WorkflowSession

__all__ = ["Carrier"]

logger = logging.getLogger(__name__)


@final
class Carrier:
    """Carries the protocol's outputs out for the coordinator (on the dispatcher)."""

    __slots__ = ("_coordinator",)

    def __init__(self, coordinator: Coordination) -> None:
        """Carry out for *coordinator*."""
        self._coordinator = coordinator

    def carry(
        self,
        instance: WorkflowInstance,
        outputs: list[WorkflowOutput],
        *,
        start: Callable[[WorkflowSession[Any]], object] | None = None,
    ) -> None:
        """Carry *outputs* out, in order (*start* registers a session that runs)."""
        by_type = _BY_TYPE
        for output in outputs:
            # by the output's type (one lookup; a match would try its cases in turn)
            carry_out = by_type.get(type(output))
            if carry_out is not None:
                carry_out(self, instance, output, start)

    def _hold_lease(
        self, instance: WorkflowInstance, output: HoldLease, _: Any
    ) -> None:
        coordinator = self._coordinator
        assert coordinator.gateway is not None
        assert instance.session is not None
        instance.session.lease = coordinator.gateway.leases.hold(
            instance.key,
            output.epoch,
            _LeaseNews(coordinator, instance),
            claimed_at=output.claimed_at,
        )

    def _offer(
        self, instance: WorkflowInstance, output: Offer[InboxEntry], _: Any
    ) -> None:
        session = instance.session
        assert session is not None
        if session.feed is not None and (session.feed.gap or output.items):
            self._coordinator.inbox.offer(session, list(output.items))

    def _start(
        self,
        _: WorkflowInstance,
        output: StartSession[WorkflowSession[Any]],
        start: Callable[[WorkflowSession[Any]], object] | None,
    ) -> None:
        assert start is not None
        start(output.session)

    def _complete(
        self, _: WorkflowInstance, output: Complete[Caller[Any]], __: Any
    ) -> None:
        output.caller.complete(output.value)

    def _drop_lease(self, instance: WorkflowInstance, _: DropLease, __: Any) -> None:
        assert self._coordinator.gateway is not None
        self._coordinator.gateway.leases.drop(instance.key)

    def _publish(self, instance: WorkflowInstance, output: Publish, _: Any) -> None:
        assert isinstance(output.update, InstanceUpdate)
        watchers = self._coordinator.watchers
        if watchers.watched(instance.key):
            watchers.publish(output.update)

    def _cancel_session(
        self, instance: WorkflowInstance, output: CancelSession, _: Any
    ) -> None:
        if instance.session is not None:
            instance.session.cancel(output.reason)

    def _fail_session(
        self, instance: WorkflowInstance, output: FailSession, _: Any
    ) -> None:
        session = instance.session
        if session is not None and session.lifecycle == "running":
            session.finish_with_error(output.error)

    def _fail(self, _: WorkflowInstance, output: Fail[Caller[Any]], __: Any) -> None:
        output.caller.fail(output.error)

    def _follow_up(self, _: WorkflowInstance, output: FollowUp, __: Any) -> None:
        output.call()

    def _rerun(
        self, _: WorkflowInstance, output: Rerun[CancelCommand], __: Any
    ) -> None:
        self._coordinator.cancels.cancel(output.command)

    def _refused(
        self, instance: WorkflowInstance, output: Refused[CancelCommand], _: Any
    ) -> None:
        output.command.done.fail(
            RecoveryRequiredError(
                f"workflow instance {instance.key!r} requires recovery; "
                "resolve it before cancelling it",
                instance_id=instance.key,
            )
        )

    def _submit(
        self,
        instance: WorkflowInstance,
        output: Submit[MarkOp | DeleteOp, Any],
        _: Any,
    ) -> None:
        gateway = self._coordinator.gateway
        assert gateway is not None
        op, then = output.op, output.then
        what = f"write the status of workflow instance {op.workflow_instance_id!r}"
        if output.quiet:
            gateway.submit_quietly(op, what)
            self.carry(instance, list(then))
            return

        def written(done: outcome.Outcome[Any]) -> None:
            if isinstance(done, outcome.Error) or done.unwrap() is False:
                logger.warning("could not %s: %r", what, done)
            self.carry(instance, list(then))

        gateway.submit(op, written)

    def _shut_down(
        self, _: WorkflowInstance, output: ShutDown[Caller[Any]], __: Any
    ) -> None:
        key, caller = output.key, output.caller
        if output.what == "remote_cancel":
            caller.fail(
                RuntimeShutdownError(
                    "the runtime shut down while workflow instance "
                    f"{key!r} was being cancelled in another runtime"
                )
            )
        elif output.what == "recovery_required":
            recovery = output.error or RecoveryRequiredError(
                f"workflow instance {key!r} requires recovery: the "
                f"outcome of its terminal save is unknown ({output.cause!r}); "
                "the runtime shut down before an operator resolved it",
                instance_id=key,
            )
            self._coordinator.waiters.fail_instance(key, recovery)
            caller.fail(recovery)
        elif output.error is not None:
            caller.fail(output.error)


_BY_TYPE: dict[type[Any], Callable[[Carrier, WorkflowInstance, Any, Any], None]] = {
    HoldLease: Carrier._hold_lease,  # noqa: SLF001 - the class's own table
    Offer: Carrier._offer,  # noqa: SLF001
    StartSession: Carrier._start,  # noqa: SLF001
    Submit: Carrier._submit,  # noqa: SLF001
    Complete: Carrier._complete,  # noqa: SLF001
    DropLease: Carrier._drop_lease,  # noqa: SLF001
    Publish: Carrier._publish,  # noqa: SLF001
    CancelSession: Carrier._cancel_session,  # noqa: SLF001
    FailSession: Carrier._fail_session,  # noqa: SLF001
    Fail: Carrier._fail,  # noqa: SLF001
    FollowUp: Carrier._follow_up,  # noqa: SLF001
    Rerun: Carrier._rerun,  # noqa: SLF001
    Refused: Carrier._refused,  # noqa: SLF001
    ShutDown: Carrier._shut_down,  # noqa: SLF001
}
"""How each output is carried out (``Released`` needs nothing)."""


@final
class _LeaseNews:
    """What the lease service tells a held lease's segment, as messages to the
    coordinator (one small object per live segment: 100k of them wait at once)."""

    __slots__ = ("_coordinator", "_instance")

    def __init__(self, coordinator: Coordination, instance: WorkflowInstance) -> None:
        self._coordinator = coordinator
        self._instance = instance

    def lost(self, error: LeaseLostError) -> None:
        """The lease could not be renewed, or another runtime took it."""
        self._coordinator.post_message(LeaseLost(instance=self._instance, error=error))

    def cancel(self, reason: str | None) -> None:
        """Another runtime asked for the instance to be cancelled."""
        message = CancelAsked(instance=self._instance, reason=reason)
        self._coordinator.post_message(message)
