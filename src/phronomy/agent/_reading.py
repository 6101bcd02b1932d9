"""Reading executions as the store says they are (a part of
:class:`~phronomy.agent.Executions`): ``record``, ``get`` and ``list``."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import trio

from phronomy.errors import InvalidInputError, NotFoundError
from phronomy.storage import InboxOp, LoadOp, TimersOp, check_limit

from ._arguments import agent_id_of
from ._messages import ExecutionDescription, ExecutionPage, ExecutionRecord
from ._records import agent_key, listing, record_of

if TYPE_CHECKING:
    from phronomy.durability import DurabilityService
    from phronomy.storage import StoredRecord

    from ._messages import RecordStatus
    from ._table import ExecutionTable

__all__ = ["ExecutionReader"]


class ExecutionReader:
    """Reading executions from the store (a part of
    :class:`~phronomy.agent.Executions`)."""

    _table: ExecutionTable

    @property
    def _gateway(self) -> DurabilityService | None:
        return self._table.coordinator.gateway

    async def record(self, agent_id: str) -> ExecutionRecord | None:
        """The key's latest execution as the store says (``None`` without a store or
        an execution).

        Raises:
            InstanceStateError: the row under the key is not a supervised execution's.
            CorruptRecordError: the stored record does not decode.

        Cancellation:
            Safe: nothing is changed.
        """
        key = agent_id_of(agent_id)
        gateway = self._gateway
        if gateway is None:
            await trio.lowlevel.checkpoint()
            return None
        record: ExecutionRecord | None = await gateway.run(
            LoadOp(workflow_instance_id=agent_key(key)),
            finish=functools.partial(record_of, gateway.store),  # in its thread
        )
        return record

    async def get(self, agent_id: str, *, limit: int = 100) -> ExecutionDescription:
        """Read a key's latest execution as the store says it is, with what is
        pending: for a web handler's GET, a dashboard, an operator.

        Reads on the store's read lane, decoded in the store's worker thread: the trio
        thread never blocks. The row, its pending inbox entries and its timers are
        read in one batch of the read lane (one snapshot of the store). The
        description is the durable truth: the runtime running the execution may be
        ahead of it (a step it finished is saved with the next checkpoint).

        Example::

            try:
                found = await runtime.executions.get("agent-7")
            except phronomy.NotFoundError:
                return 404, {"error": "no execution of agent-7"}
            request = found.record.pending_approval  # None unless it waits on one

        Args:
            agent_id: the key.
            limit: at most this many pending events (1 to 10000; the oldest).

        Returns:
            An :class:`~phronomy.agent.ExecutionDescription`.

        Raises:
            NotFoundError: no execution is stored under the key (an error, not
                ``None``: as for ``runtime.workflows.get``).
            InstanceStateError: the row under the key is not a supervised execution's.
            CorruptRecordError: the stored record does not decode.
            InvalidInputError: an invalid key or limit, or the runtime has no store.
            StoreUnavailableError: the store could not be read.
            ReentrancyError: called from a thread that does not run the runtime.

        Cancellation:
            Safe: nothing is changed (cancelling stops the wait for the reads).
        """
        self._table.engine.check_thread("runtime.executions.get()")
        key = agent_id_of(agent_id)
        limit = check_limit(limit)
        gateway = self._gateway
        if gateway is None:
            raise InvalidInputError("get reads the store (open_runtime(store=...))")
        iid = agent_key(key)
        store = gateway.store

        def finish(read: tuple[StoredRecord | None, Any, Any]) -> Any:
            row, events, timers = read  # (in the store's worker thread)
            return row, record_of(store, row), events, timers

        row, record, events, timers = await gateway.read_together(
            (
                LoadOp(workflow_instance_id=iid),
                InboxOp(workflow_instance_id=iid, limit=limit),
                TimersOp(workflow_instance_id=iid),
            ),
            finish=finish,
        )
        if row is None or record is None:
            raise NotFoundError(
                f"agent {key!r} has no execution (nothing is stored under its key)",
                instance_id=iid,
            )
        return ExecutionDescription(
            record=record,
            pending_events=events,
            pending_timers=timers,
            cancel_requested=row.cancel_requested,
            takeovers=row.takeovers,
        )

    async def list(
        self,
        *,
        status: RecordStatus | None = None,
        prefix: str = "",
        after: str | None = None,
        limit: int = 100,
    ) -> ExecutionPage:
        """The executions in the store, by agent id (one page).

        Args:
            status: only those the store says are so (see
                :data:`~phronomy.agent.RecordStatus`).
            prefix: only agent ids that start with it.
            after: the ``next_after`` of the previous page.
            limit: executions per page (1 to 10000).

        Returns:
            The page (empty without a store).

        Raises:
            InvalidInputError: an unknown status or a bad limit.

        Cancellation:
            Safe: nothing is changed.
        """
        steps = listing(status=status, after=after, limit=limit, prefix=prefix)
        gateway = self._gateway
        if gateway is None:
            await trio.lowlevel.checkpoint()
            return ExecutionPage(records=())
        try:
            op = next(steps)
            while True:
                op = steps.send(await gateway.run(op))
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
