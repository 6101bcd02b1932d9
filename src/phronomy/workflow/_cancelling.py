"""Cancelling an instance: its live segment here, or its stored row."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, final

from outcome import Error

from phronomy.durability import save_outcome
from phronomy.engine import random_hex
from phronomy.errors import (
    NotFoundError,
    PhronomyError,
    RuntimeShutdownError,
)
from phronomy.instance import (
    CANCELLING,
    AdmitCancel,
    Cancel,
    CancelAsked as Asked,
    CancelAwait,
    CancelDone,
    CancelReload,
)
from phronomy.storage import LoadOp, RequestCancelOp, cancellation

from ._continuations import (
    CancelAsked,
    CancelLoaded,
    CancelRequested,
    CancelSaved,
)
from ._definition import FINISH
from ._hydration import cancelled_state
from ._messages import InstanceUpdate, WorkflowResult

if TYPE_CHECKING:
    import outcome

    from phronomy.engine import Caller
    from phronomy.storage import StoredRecord

    from ._context import Coordination
    from ._continuations import WorkflowInstance
    from ._messages import CancelCommand

__all__ = ["CancelRequests"]


@final
class CancelRequests:
    """How the workflow coordinator cancels (its part, on the dispatcher).

    A segment live here stops taking events, its effects' trio work is cancelled and
    their threads are waited for, then it ends as ``cancelled`` (saved, for durable
    segments) and its caller fails with :class:`~phronomy.WorkflowCancelledError`. An
    instance loading or saving here is cancelled once that is done. An instance live
    under another runtime's lease is asked, through its row, to cancel itself; the
    cancel returns once its row says it ended. An instance that no segment runs is
    cancelled in the store: a new revision with the same state and the status
    ``cancelled``.
    """

    __slots__ = ("_coordinator",)

    def __init__(self, coordinator: Coordination) -> None:
        """Cancel for *coordinator*."""
        self._coordinator = coordinator

    def cancel(self, cmd: CancelCommand) -> None:
        iid = cmd.workflow_instance_id
        instance = self._coordinator.instances.get(iid)
        if instance is not None:
            # live here: cancelled now; loading or saving: once it is done (refused
            # while it requires recovery)
            cancel: Cancel[CancelCommand, Caller[Any]]
            cancel = Cancel(command=cmd, caller=cmd.done, reason=cmd.reason)
            self._coordinator.carrier.carry(
                instance, self._coordinator.instances.handle(instance, cancel)
            )
            return
        if self._coordinator.gateway is None:
            cmd.done.fail(
                NotFoundError(
                    f"workflow instance {iid!r} has no live segment in this runtime, "
                    "and the runtime has no store"
                )
            )
            return
        try:
            self._coordinator.admit()
            admit: AdmitCancel[Caller[Any]] = AdmitCancel(
                owner=cmd.owner, label=cmd.definition.name, caller=cmd.done
            )
            instance, _ = self._coordinator.instances.admit(iid, admit)
        except Exception as exc:  # noqa: BLE001 - the caller's error
            cmd.done.fail(exc)
            return
        self._load(cmd, instance)

    def _load(self, cmd: CancelCommand, instance: WorkflowInstance) -> None:
        """Read the row (and decode its state in the store's worker thread)."""
        assert self._coordinator.gateway is not None
        definition = cmd.definition

        def decode(record: StoredRecord | None) -> tuple[StoredRecord | None, Any]:
            return record, cancelled_state(definition, record)

        def loaded(done: outcome.Outcome[tuple[StoredRecord | None, Any]]) -> None:
            message = CancelLoaded(command=cmd, instance=instance, loaded=done)
            self._post(message, cmd)

        self._coordinator.gateway.submit(
            LoadOp(workflow_instance_id=cmd.workflow_instance_id), loaded, finish=decode
        )

    def _post(
        self, message: CancelLoaded | CancelSaved | CancelRequested, cmd: CancelCommand
    ) -> None:
        if not self._coordinator.post_message(message, completion=cmd.done):
            cmd.done.fail(
                RuntimeShutdownError(
                    "the runtime shut down while cancelling workflow instance "
                    f"{cmd.workflow_instance_id!r}"
                )
            )

    def apply_loaded(self, message: CancelLoaded) -> None:
        cmd, instance = message.command, message.instance
        assert self._coordinator.gateway is not None
        try:
            record, state = message.loaded.unwrap()
            if (
                record is not None
                and record.status == "running"
                and record.lease_owner
                not in (None, self._coordinator.gateway.leases.owner)
            ):
                self._remote(cmd, instance, record)
                return
            op = cancellation(
                record,
                cmd.workflow_instance_id,
                reason=cmd.reason,
                write_id=random_hex(),
                force=cmd.force,
            )
        except Exception as exc:  # noqa: BLE001 - the caller's error, nothing written
            self._done(cmd, instance, error=exc)
            return
        if op is None:  # cancelled already: the same answer again
            assert record is not None
            self._done(cmd, instance, record=record, state=state)
            return

        def saved(done: outcome.Outcome[Any]) -> None:
            message = CancelSaved(command=cmd, instance=instance, saved=done)
            self._post(message, cmd)

        self._coordinator.gateway.submit(op, saved)

    def _remote(
        self, cmd: CancelCommand, instance: WorkflowInstance, record: StoredRecord
    ) -> None:
        """The instance is live in another runtime: ask it (in the row; it sees the
        request at its next heartbeat), then wait until the row says it ended."""
        assert self._coordinator.gateway is not None
        if record.cancel_requested is not None:  # asked already: wait on
            self._poll(cmd, instance, record.lease_epoch)
            return
        op = RequestCancelOp(
            workflow_instance_id=cmd.workflow_instance_id, reason=cmd.reason
        )

        def requested(done: outcome.Outcome[tuple[int, bool] | None]) -> None:
            message = CancelRequested(command=cmd, instance=instance, requested=done)
            self._post(message, cmd)

        self._coordinator.gateway.submit(op, requested)

    def apply_requested(self, message: CancelRequested) -> None:
        try:
            asked = message.requested.unwrap()
        except Exception as exc:  # noqa: BLE001 - the caller's error
            self._done(message.command, message.instance, error=exc)
            return
        # not written (the row was busy): the next read finds no request and asks again
        self._poll(
            message.command, message.instance, None if asked is None else asked[0]
        )

    def _poll(
        self, cmd: CancelCommand, instance: WorkflowInstance, epoch: int | None
    ) -> None:
        """Read the row again: at once if the request found no live lease (the row
        changed), else after a quarter heartbeat."""
        assert self._coordinator.gateway is not None
        self._coordinator.instances.handle(instance, CancelAwait())
        interval = self._coordinator.gateway.leases.settings.heartbeat_interval / 4

        def reload() -> None:
            self._coordinator.instances.handle(instance, CancelReload())
            if instance.state == CANCELLING:  # else the runtime shut down meanwhile
                self._load(cmd, instance)

        self._coordinator.engine.timers.schedule(
            0 if epoch is None else interval, reload
        )

    def apply_asked(self, message: CancelAsked) -> None:
        """Another runtime asked for this live segment's instance to be cancelled."""
        instance = message.instance
        outputs = self._coordinator.instances.handle(
            instance, Asked(reason=message.reason)
        )
        self._coordinator.carrier.carry(instance, outputs)

    def apply_saved(self, message: CancelSaved) -> None:
        cmd, instance = message.command, message.instance
        assert self._coordinator.gateway is not None
        error = _write_error(message.saved)
        if error is not None:
            self._done(cmd, instance, error=error)
            return
        self._load(cmd, instance)

    def _done(
        self,
        cmd: CancelCommand,
        instance: WorkflowInstance,
        *,
        record: StoredRecord | None = None,
        state: Any = None,
        error: BaseException | None = None,
    ) -> None:
        iid = cmd.workflow_instance_id
        if error is not None:
            done = CancelDone(error=error)
        else:
            assert record is not None
            update = InstanceUpdate(
                workflow_instance_id=iid,
                status="cancelled",
                phase=record.phase,
                state=state,
                revision=record.revision,
            )
            result = WorkflowResult(
                state=state,
                phase=record.phase or FINISH,
                workflow_instance_id=iid,
                revision=record.revision,
                halted=False,
                workflow=record.workflow,
                status="cancelled",
            )
            done = CancelDone(value=result, update=update)
        self._coordinator.carrier.carry(
            instance, self._coordinator.instances.handle(instance, done)
        )


def _write_error(saved: outcome.Outcome[Any]) -> BaseException | None:
    """Why the cancelling write did not land (``None``: it did). An unknown outcome is
    reported too: cancelling again is safe (a cancelled instance stays cancelled)."""
    if isinstance(saved, Error):
        return saved.error
    value = saved.unwrap()
    if isinstance(value, bool):  # a mark
        return (
            None
            if value
            else PhronomyError("the instance changed meanwhile; cancel it again")
        )
    verdict = save_outcome(saved)
    if verdict.outcome == "success":
        return None
    return verdict.error or PhronomyError("the cancelling save failed")
