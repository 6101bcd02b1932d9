"""Cancelling an instance: its live segment here, or its stored row."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from outcome import Error

from phronomy.durability import save_outcome
from phronomy.engine import random_hex
from phronomy.errors import (
    NotFoundError,
    PhronomyError,
    RecoveryRequiredError,
    RuntimeShutdownError,
    WorkflowCancelledError,
)
from phronomy.storage import LoadOp, RequestCancelOp, cancellation

from ._definition import FINISH
from ._hydration import cancelled_state
from ._messages import (
    CancelAsked,
    CancelLoaded,
    CancelRequested,
    CancelSaved,
    WorkflowResult,
)

if TYPE_CHECKING:
    import outcome

    from phronomy.durability import DurabilityService
    from phronomy.engine import AdmissionTable, Host, ResultHandle
    from phronomy.storage import InstanceStatus, StoredRecord

    from ._messages import CancelCommand
    from ._session import WorkflowSession

__all__ = ["Cancelling"]


class Cancelling:
    """How the workflow coordinator cancels (a mixin, on the dispatcher).

    A segment live here stops taking events, its effects' trio work is cancelled and
    their threads are waited for, then it ends as ``cancelled`` (saved, for durable
    segments) and its caller fails with :class:`~phronomy.WorkflowCancelledError`. An
    instance loading or saving here is cancelled once that is done. An instance live
    under another runtime's lease is asked, through its row, to cancel itself; the
    cancel returns once its row says it ended. An instance that no segment runs is
    cancelled in the store: a new revision with the same state and the status
    ``cancelled``.
    """

    gateway: DurabilityService | None
    admissions: AdmissionTable
    sessions: dict[str, WorkflowSession[Any]]
    cancels: dict[str, list[CancelCommand]]
    remote_cancels: dict[str, CancelCommand]

    if TYPE_CHECKING:

        @property
        def engine(self) -> Host: ...

        def admit(self) -> None: ...

        def _watched(
            self,
            iid: str,
            status: InstanceStatus,
            phase: str | None,
            state: Any,
            revision: int | None,
        ) -> None: ...

        def post_message(
            self,
            message: Any,
            *,
            admission: bool = False,
            completion: ResultHandle[Any] | None = None,
        ) -> bool: ...

    def _cancel(self, cmd: CancelCommand) -> None:
        iid = cmd.workflow_instance_id
        admission = self.admissions.get(iid)
        if admission is not None:
            if admission.state == "recovery_required":
                cmd.done.fail(
                    RecoveryRequiredError(
                        f"workflow instance {iid!r} requires recovery; resolve it "
                        "before cancelling it",
                        instance_id=iid,
                    )
                )
                return
            self.cancels.setdefault(iid, []).append(cmd)
            session = self.sessions.get(iid)
            if session is not None and admission.state == "executing":
                session.cancel(cmd.reason)
            return  # loading or saving: cancelled when it is done (see _cancel_next)
        if self.gateway is None:
            cmd.done.fail(
                NotFoundError(
                    f"workflow instance {iid!r} has no live segment in this runtime, "
                    "and the runtime has no store"
                )
            )
            return
        try:
            self.admit()
            self.admissions.admit(iid, cmd.owner, label=cmd.definition.name)
        except Exception as exc:  # noqa: BLE001 - the caller's error
            cmd.done.fail(exc)
            return

        self._cancel_load(cmd)

    def _cancel_load(self, cmd: CancelCommand) -> None:
        """Read the row (and decode its state in the store's worker thread)."""
        assert self.gateway is not None
        definition = cmd.definition

        def decode(record: StoredRecord | None) -> tuple[StoredRecord | None, Any]:
            return record, cancelled_state(definition, record)

        self.gateway.submit(
            LoadOp(workflow_instance_id=cmd.workflow_instance_id),
            lambda done: self._post_cancel(CancelLoaded(command=cmd, loaded=done), cmd),
            finish=decode,
        )

    def _post_cancel(self, message: Any, cmd: CancelCommand) -> None:
        if not self.post_message(message, completion=cmd.done):
            cmd.done.fail(
                RuntimeShutdownError(
                    "the runtime shut down while cancelling workflow instance "
                    f"{cmd.workflow_instance_id!r}"
                )
            )

    def _cancel_loaded(self, message: CancelLoaded) -> None:
        cmd = message.command
        assert self.gateway is not None
        try:
            record, state = message.loaded.unwrap()
            if (
                record is not None
                and record.status == "running"
                and record.lease_owner not in (None, self.gateway.leases.owner)
            ):
                self._cancel_remote(cmd, record)
                return
            op = cancellation(
                record,
                cmd.workflow_instance_id,
                reason=cmd.reason,
                write_id=random_hex(),
                force=cmd.force,
            )
        except Exception as exc:  # noqa: BLE001 - the caller's error, nothing written
            self._cancel_done(cmd, error=exc)
            return
        if op is None:  # cancelled already: the same answer again
            assert record is not None
            self._cancel_done(cmd, record=record, state=state)
            return

        def saved(done: outcome.Outcome[Any]) -> None:
            self._post_cancel(CancelSaved(command=cmd, saved=done), cmd)

        self.gateway.submit(op, saved)

    def _cancel_remote(self, cmd: CancelCommand, record: StoredRecord) -> None:
        """The instance is live in another runtime: ask it (in the row; it sees the
        request at its next heartbeat), then wait until the row says it ended."""
        assert self.gateway is not None
        if record.cancel_requested is not None:  # asked already: wait on
            self._cancel_poll(cmd, record.lease_epoch)
            return
        op = RequestCancelOp(
            workflow_instance_id=cmd.workflow_instance_id, reason=cmd.reason
        )

        def requested(done: outcome.Outcome[Any]) -> None:
            self._post_cancel(CancelRequested(command=cmd, requested=done), cmd)

        self.gateway.submit(op, requested)

    def _cancel_requested(self, message: CancelRequested) -> None:
        try:
            epoch: int | None = message.requested.unwrap()
        except Exception as exc:  # noqa: BLE001 - the caller's error
            self._cancel_done(message.command, error=exc)
            return
        self._cancel_poll(message.command, epoch)

    def _cancel_poll(self, cmd: CancelCommand, epoch: int | None) -> None:
        """Read the row again: at once if the request found no live lease (the row
        changed), else after a quarter heartbeat."""
        assert self.gateway is not None
        iid = cmd.workflow_instance_id
        self.remote_cancels[iid] = cmd
        interval = self.gateway.leases.settings.heartbeat_interval / 4

        def reload() -> None:
            if self.remote_cancels.get(iid) is not cmd:
                return  # the runtime shut down meanwhile
            del self.remote_cancels[iid]
            self._cancel_load(cmd)

        self.engine.timers.schedule(0 if epoch is None else interval, reload)

    def _cancel_asked(self, message: CancelAsked) -> None:
        """Another runtime asked for this live segment's instance to be cancelled."""
        session: WorkflowSession[Any] = message.session
        if self.sessions.get(session.workflow_instance_id) is session:
            session.cancel(message.reason)

    def _cancel_saved(self, message: CancelSaved) -> None:
        cmd = message.command
        assert self.gateway is not None
        error = _write_error(message.saved)
        if error is not None:
            self._cancel_done(cmd, error=error)
            return
        self._cancel_load(cmd)

    def _cancel_done(
        self,
        cmd: CancelCommand,
        *,
        record: StoredRecord | None = None,
        state: Any = None,
        error: BaseException | None = None,
    ) -> None:
        self.admissions.release(cmd.workflow_instance_id, owner=cmd.owner)
        if error is not None:
            cmd.done.fail(error)
            return
        assert record is not None
        self._watched(
            cmd.workflow_instance_id, "cancelled", record.phase, state, record.revision
        )
        cmd.done.complete(
            WorkflowResult(
                state=state,
                phase=record.phase or FINISH,
                workflow_instance_id=cmd.workflow_instance_id,
                revision=record.revision,
                halted=False,
                workflow=record.workflow,
                status="cancelled",
            )
        )

    def _segment_cancelled(
        self,
        iid: str,
        caller: ResultHandle[Any],
        result: WorkflowResult[Any],
        reason: str | None = None,
    ) -> None:
        """A live segment ended as cancelled (*reason*: the session's): its caller
        fails, the cancels complete."""
        reasons = [c.reason for c in self.cancels.get(iid, ()) if c.reason]
        reason = reasons[0] if reasons else reason
        caller.fail(
            WorkflowCancelledError(
                f"workflow instance {iid!r} was cancelled"
                + (f": {reason}" if reason else ""),
                instance_id=iid,
                reason=reason,
            )
        )
        for cmd in self.cancels.pop(iid, []):
            cmd.done.complete(result)

    def _cancel_next(self, iid: str) -> None:
        """The instance's segment ended: cancels waiting for it run now."""
        for cmd in self.cancels.pop(iid, []):
            self._cancel(cmd)


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
