"""Resolving ``recovery_required`` instances: list, inspect, adopt or release."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, final

import msgspec
import trio

from phronomy.engine import ResultHandle
from phronomy.errors import (
    ConflictError,
    InvalidInputError,
    NotFoundError,
)
from phronomy.storage import (
    EXECUTION_KEY_PREFIX,
    LoadOp,
    StoredRecord,
    decode_snapshot_builtins,
    quarantined,
    quarantined_instances,
    release_quarantine,
    resolution,
    validate_instance_id,
)

from ._messages import RecoveryEntry, ResolveCommand

if TYPE_CHECKING:
    from ._continuations import WorkflowInstance
    from ._coordinator import WorkflowCoordinator

__all__ = ["InstanceView", "RecoveryClient"]


@final
class InstanceView(msgspec.Struct, frozen=True, kw_only=True):
    """What an operator sees of one instance.

    Attributes:
        record: the durable row (``snapshot`` omitted), or ``None``.
        fields: the stored state as plain JSON values, or ``None``.
        phase: the stored phase.
        admission: this runtime's admission state of the instance, or ``None``.
        error: the in-process recovery error, if any.
    """

    record: StoredRecord | None
    fields: dict[str, Any] | None
    phase: str | None
    admission: str | None
    error: str | None = None


@final
class RecoveryClient:
    """List, inspect and resolve instances whose save outcome is unknown.

    An instance becomes ``recovery_required`` when a terminal save failed and neither
    its post-state nor its pre-state could be proven. It then refuses new segments (in
    this process, and in every process sharing the store) until an operator resolves
    it, and its caller stays pending until then (or until the runtime shuts down).
    """

    def __init__(self, coordinator: WorkflowCoordinator) -> None:
        """Internal: reached as ``runtime.recovery``."""
        self._coordinator = coordinator

    async def list(self) -> list[RecoveryEntry]:
        """Instances requiring recovery, in this process and in the store.

        Cancellation:
            Safe: nothing is changed.
        """
        local = {
            r.key: r for r in self._coordinator.admissions.in_state("recovery_required")
        }
        stored: dict[str, StoredRecord] = {}
        fenced: dict[str, str] = {}
        gateway = self._coordinator.gateway
        if gateway is not None:
            fenced = {
                iid: reason
                for iid, reason in quarantined_instances(gateway.store.identity).items()
                if not iid.startswith(EXECUTION_KEY_PREFIX)  # see runtime.executions
            }
            stored = {
                r.workflow_instance_id: r
                for r in await gateway.list_all("workflow", "recovery_required")
            }
        return [
            RecoveryEntry(
                workflow_instance_id=iid,
                workflow=(
                    local[iid].label
                    if iid in local
                    else (stored[iid].workflow if iid in stored else "")
                ),
                in_process=iid in local,
                stored=stored.get(iid),
                error=_describe(local.get(iid)) or fenced.get(iid),
            )
            for iid in sorted(set(local) | set(stored) | set(fenced))
        ]

    async def inspect(self, workflow_instance_id: str) -> InstanceView:
        """Return the durable record and the in-process admission of an instance.

        Raises:
            CorruptRecordError: the stored snapshot does not decode.

        Cancellation:
            Safe: nothing is changed.
        """
        iid = validate_instance_id(workflow_instance_id)
        admission = self._coordinator.admissions.get(iid)
        record: StoredRecord | None = None
        fields: dict[str, Any] | None = None
        phase: str | None = None
        gateway = self._coordinator.gateway
        if gateway is not None:
            record = await gateway.run(LoadOp(workflow_instance_id=iid))
            if record is not None and record.snapshot is not None:
                decoded = decode_snapshot_builtins(
                    record.snapshot, workflow_instance_id=iid, revision=record.revision
                )
                fields, phase = decoded.fields, decoded.phase
                record = msgspec.structs.replace(record, snapshot=None)
        return InstanceView(
            record=record,
            fields=fields,
            phase=phase,
            admission=None if admission is None else admission.status,
            error=_describe(admission),
        )

    async def resolve(
        self, workflow_instance_id: str, *, action: Literal["adopt", "release"]
    ) -> StoredRecord | None:
        """Resolve a recovery-required instance.

        ``adopt``: the durable record is the truth; the instance's status becomes
        ``halted`` or ``finished`` from the stored phase. ``release``: the status becomes
        ``failed`` so the instance can be retried (from its last durable revision).
        Either way this runtime's admission is cleared and its pending caller fails with
        a :class:`~phronomy.RecoveryRequiredError` that says it was resolved.

        Returns:
            The durable record after resolution (``None`` without a store).

        Raises:
            NotFoundError: the instance does not require recovery here or in the store.
            InvalidInputError: an unknown *action*.

        Cancellation:
            The resolution runs to completion once started (shielded).
        """
        if action not in ("adopt", "release"):
            raise InvalidInputError(
                f"action must be 'adopt' or 'release', got {action!r}"
            )
        iid = validate_instance_id(workflow_instance_id)
        with trio.CancelScope(shield=True):
            resolved = await self._resolve(iid, action)
        return resolved

    async def _resolve(
        self, iid: str, action: Literal["adopt", "release"]
    ) -> StoredRecord | None:
        done: ResultHandle[WorkflowInstance | None] = ResultHandle(f"resolve:{iid}")
        command = ResolveCommand(workflow_instance_id=iid, action=action, done=done)
        if not self._coordinator.post_message(command, completion=done):
            raise self._coordinator.engine.refusal("the recovery resolution")
        local = await done.result()
        gateway = self._coordinator.gateway
        if gateway is None:
            if local is None:
                raise NotFoundError(
                    f"workflow instance {iid!r} does not require recovery"
                )
            return None
        record = await gateway.run(LoadOp(workflow_instance_id=iid))
        identity = gateway.store.identity
        try:
            op = resolution(
                record,
                iid,
                action,
                by="runtime.recovery.resolve()",
                quarantined=quarantined(identity, iid) is not None,
            )
        except NotFoundError:
            # nothing durable to settle: only this process's admission or quarantine
            if not (release_quarantine(identity, iid) or local is not None):
                raise
        else:
            if not await gateway.run(op):
                raise ConflictError(
                    f"workflow instance {iid!r} changed during resolution; retry"
                )
            release_quarantine(identity, iid)
            record = await gateway.run(LoadOp(workflow_instance_id=iid))
        return (
            None if record is None else msgspec.structs.replace(record, snapshot=None)
        )


def _describe(admission: WorkflowInstance | None) -> str | None:
    if admission is None or admission.error is None:
        return None
    return f"{type(admission.error).__name__}: {admission.error}"
