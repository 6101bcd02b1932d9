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
    Released,
    Rerun,
    ShutDown,
    StartSession,
    Submit,
)

from ._continuations import CancelAsked, LeaseLost
from ._messages import InstanceUpdate

if TYPE_CHECKING:
    from collections.abc import Callable

    from phronomy.engine import ResultHandle
    from phronomy.errors import LeaseLostError
    from phronomy.storage import DeleteOp, MarkOp

    from ._context import Coordination
    from ._continuations import WorkflowInstance, WorkflowOutput
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
        for output in outputs:
            self._one(instance, output, start)

    def _one(
        self,
        instance: WorkflowInstance,
        output: WorkflowOutput,
        start: Callable[[WorkflowSession[Any]], object] | None,
    ) -> None:
        coordinator = self._coordinator
        session = instance.session
        match output:  # the frequent outputs first: a match tries its cases in order
            case Released():
                pass
            case HoldLease(epoch=epoch, claimed_at=claimed_at):
                assert session is not None
                session.lease = self._hold(instance, epoch, claimed_at)
            case Offer(items=items):
                assert session is not None
                if session.feed is not None and (session.feed.gap or items):
                    coordinator.inbox.offer(session, list(items))
            case StartSession(session=started):
                assert start is not None
                start(started)
            case Submit(op=op, then=then, quiet=quiet):
                self._submit(instance, op, then, quiet=quiet)
            case Complete(caller=caller, value=value):
                caller.complete(value)
            case DropLease():
                assert coordinator.gateway is not None
                coordinator.gateway.leases.drop(instance.key)
            case Publish(update=update):
                assert isinstance(update, InstanceUpdate)
                if coordinator.watchers.watched(instance.key):
                    coordinator.watchers.publish(update)
            case CancelSession(reason=reason):
                if session is not None:
                    session.cancel(reason)
            case FailSession(error=error):
                if session is not None and session.lifecycle == "running":
                    session.finish_with_error(error)
            case Fail(caller=caller, error=error):
                caller.fail(error)
            case FollowUp(call=call):
                call()
            case Rerun(command=command):
                coordinator.cancels.cancel(command)
            case Refused(command=command):
                command.done.fail(
                    RecoveryRequiredError(
                        f"workflow instance {instance.key!r} requires recovery; "
                        "resolve it before cancelling it",
                        instance_id=instance.key,
                    )
                )
            case ShutDown():
                self._shut_down(output)

    def _hold(self, instance: WorkflowInstance, epoch: int, claimed_at: float) -> Any:
        coordinator = self._coordinator
        assert coordinator.gateway is not None
        tell = _LeaseNews(coordinator, instance)
        return coordinator.gateway.leases.hold(
            instance.key, epoch, tell.lost, tell.cancel, claimed_at=claimed_at
        )

    def _submit(
        self,
        instance: WorkflowInstance,
        op: MarkOp | DeleteOp,
        then: tuple[Any, ...],
        *,
        quiet: bool,
    ) -> None:
        gateway = self._coordinator.gateway
        assert gateway is not None
        what = f"write the status of workflow instance {op.workflow_instance_id!r}"
        if quiet:
            gateway.submit_quietly(op, what)
            self.carry(instance, list(then))
            return

        def written(done: outcome.Outcome[Any]) -> None:
            if isinstance(done, outcome.Error) or done.unwrap() is False:
                logger.warning("could not %s: %r", what, done)
            self.carry(instance, list(then))

        gateway.submit(op, written)

    def _shut_down(self, output: ShutDown[ResultHandle[Any]]) -> None:
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
