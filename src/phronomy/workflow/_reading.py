"""Reading an instance as the store says it is: ``runtime.workflows.get``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, TypeVar, final

import msgspec

from phronomy.errors import InvalidInputError, NotFoundError
from phronomy.storage import (
    InboxEntry,
    InboxOp,
    InstanceStatus,
    LoadOp,
    StoredRecord,
    StoredTimer,
    TimersOp,
    check_limit,
    lease_now_ms,
    validate_instance_id,
)

from ._hydration import decode_stored
from ._state import State

if TYPE_CHECKING:
    from ._coordinator import WorkflowCoordinator
    from ._definition import WorkflowDefinition

__all__ = ["InstanceDescription", "InstanceLease", "InstanceReader", "describe"]

S = TypeVar("S", bound=State)


@final
class InstanceLease(msgspec.Struct, frozen=True, kw_only=True):
    """The lease a runtime holds (or held) on an instance, as stored.

    Attributes:
        owner: the owner token of the runtime holding it.
        epoch: the fencing epoch (each claim and takeover increments it).
        expires_at_ms: when it expires unless renewed, on the store's lease clock
            (not the wall clock: see :func:`~phronomy.storage.lease_now_ms`).
        live: whether it had not expired when the instance was read, on that same
            clock (read in the same worker thread as the row: the database server's
            for PostgreSQL, this machine's monotonic clock for SQLite). An expired
            lease is taken over by the recovery sweep of a runtime serving the
            workflow.
    """

    owner: str
    epoch: int
    expires_at_ms: int
    live: bool


@final
class InstanceDescription(msgspec.Struct, Generic[S], frozen=True, kw_only=True):
    """An instance as the store says it is (``runtime.workflows.get``).

    Attributes:
        workflow_instance_id: the instance.
        workflow: the workflow that owns it.
        status: the stored status (``halted``, ``running``, ``finished``, ...).
        phase: the state it is at (``__end__`` when finished; ``None`` before its
            first save).
        revision: the durable revision (0 before the first save).
        state: the stored state, decoded into the workflow's state class (``None``
            before the first save).
        definition_version: the version of the definition that saved it.
        lease: the lease of the runtime holding it (``None``: no runtime does).
        pending_events: the inbox entries not applied yet, oldest first, cut at the
            ``limit`` of the read (holding ``limit`` entries, it may not be all of
            them); their payloads are JSON (``msgspec.json.decode``).
        pending_timers: its pending timers, soonest first.
        error: the stored diagnostic of a ``failed`` or ``recovery_required``
            instance (else ``None``).
        cancel_requested: a cancellation asked for and not yet carried out (its
            reason, or ``""``), else ``None``.
        takeovers: how many times in a row a runtime stopped while running it.
        updated_at_ms: wall-clock milliseconds of the row's last change.
    """

    workflow_instance_id: str
    workflow: str
    status: InstanceStatus
    phase: str | None
    revision: int
    state: S | None
    definition_version: str
    lease: InstanceLease | None
    pending_events: tuple[InboxEntry, ...]
    pending_timers: tuple[StoredTimer, ...]
    error: str | None
    cancel_requested: str | None
    takeovers: int
    updated_at_ms: int


def describe(
    row: StoredRecord,
    state: Any,
    events: tuple[InboxEntry, ...],
    timers: tuple[StoredTimer, ...],
    lease_now: int | None,
) -> InstanceDescription[Any]:
    """The description of a loaded *row* with its decoded *state* (pure), its lease
    judged at *lease_now* on the store's lease clock (``None``: every stored lease
    has expired)."""
    lease = None
    if row.lease_owner is not None:
        expires = row.lease_expires_at_ms or 0
        lease = InstanceLease(
            owner=row.lease_owner,
            epoch=row.lease_epoch,
            expires_at_ms=expires,
            live=lease_now is not None and expires > lease_now,
        )
    return InstanceDescription(
        workflow_instance_id=row.workflow_instance_id,
        workflow=row.workflow,
        status=row.status,
        phase=row.phase,
        revision=row.revision,
        state=state,
        definition_version=row.definition_version,
        lease=lease,
        pending_events=events,
        pending_timers=timers,
        error=row.detail,
        cancel_requested=row.cancel_requested,
        takeovers=row.takeovers,
        updated_at_ms=row.updated_at_ms,
    )


class InstanceReader:
    """Reading instances from the store (a part of
    :class:`~phronomy.workflow.WorkflowClient`)."""

    _coordinator: WorkflowCoordinator

    async def get(
        self,
        workflow: WorkflowDefinition[S],
        workflow_instance_id: str,
        *,
        limit: int = 100,
    ) -> InstanceDescription[S]:
        """Read an instance as the store says it is: for a web handler's GET, a
        dashboard, an operator.

        Reads on the store's read lane, the state decoded in the store's worker
        thread: the trio thread never blocks. The row, its pending inbox entries and
        its timers are read in one batch of the read lane, which the store reads as
        one snapshot (one read transaction): the events and timers are those of the
        revision described, as it was committed (no event it applied is pending). The
        description is the durable truth: a segment running in some runtime may be
        ahead of it (an event it applied stays pending until its next save; follow it
        with :meth:`~phronomy.workflow.WorkflowClient.watch`).

        Example (a GET handler; ``state`` is ``None`` while the instance is being
        created, before its first save: revision 0)::

            try:
                order = await runtime.workflows.get(order_flow, order_id)
            except phronomy.NotFoundError:
                return 404, {"error": f"no order {order_id!r}"}
            if order.state is None:  # being created: ask again shortly
                return 503, {"error": f"order {order_id!r} is being created"}
            return 200, {"phase": order.phase, "total": order.state.total}

        Args:
            workflow: the instance's workflow (its state class decodes the state).
            workflow_instance_id: the instance.
            limit: at most this many pending events (1 to 10000; the oldest):
                ``pending_events`` is cut there (when it holds *limit* entries, more
                may be pending; ask again with a larger limit).

        Returns:
            An :class:`~phronomy.workflow.InstanceDescription`.

        Raises:
            NotFoundError: nothing is stored under the id (an unknown id is an error,
                not ``None``: as for ``post``, ``watch`` and ``deliver``, the message
                names the id, and a web handler maps it to 404 with the others).
            InstanceStateError: the stored instance belongs to another workflow.
            DefinitionMismatchError: another version of the definition saved it, and
                its fields do not fit this one's state class.
            CorruptRecordError: the stored state does not decode.
            InvalidInputError: an invalid id or limit, or the runtime has no store.
            StoreUnavailableError: the store could not be read.
            ReentrancyError: called from a thread that does not run the runtime.

        Cancellation:
            Safe: nothing is changed (cancelling stops the wait for the reads).
        """
        coordinator = self._coordinator
        coordinator.engine.check_thread("runtime.workflows.get()")
        iid = validate_instance_id(workflow_instance_id, workflow=workflow.name)
        limit = check_limit(limit)
        gateway = coordinator.gateway
        if gateway is None:
            raise InvalidInputError("get reads the store (open_runtime(store=...))")
        store = gateway.store

        def decode(
            read: tuple[StoredRecord | None, Any, Any],
        ) -> tuple[StoredRecord | None, Any, Any, Any, int | None]:
            # in the store's worker thread: the state, and the lease clock if needed
            row, events, armed = read
            _, decoded = decode_stored(workflow, row, resuming=False)
            leased = row is not None and row.lease_owner is not None
            now = lease_now_ms(store) if leased else None
            return row, decoded, events, armed, now

        # one batch of reads: one snapshot of the store (the row, its inbox, its timers)
        row, decoded, events, armed, now_ms = await gateway.read_together(
            (
                LoadOp(workflow_instance_id=iid),
                InboxOp(workflow_instance_id=iid, limit=limit),
                TimersOp(workflow_instance_id=iid),
            ),
            finish=decode,
        )
        if row is None:
            raise NotFoundError(
                f"workflow instance {iid!r} does not exist (nothing is stored "
                f"under that id for workflow {workflow.name!r})",
                instance_id=iid,
            )
        state = None if decoded is None else decoded.fields
        return describe(row, state, events, armed, now_ms)
