"""The durability service: the runtime's one path to its store.

Workflows and supervised executions both reach the store through one
:class:`DurabilityService`: one batched write path with group commit, one read lane, and
typed record kinds (a workflow instance's row, or an execution key's record).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, final

import msgspec
import outcome

from phronomy.engine import Batcher, ResultHandle
from phronomy.errors import BackpressureError, InvalidInputError, RuntimeShutdownError
from phronomy.storage import (
    READ_OPS,
    ListOp,
    MarkOp,
    RenewOp,
    SaveOutcome,
    StoreOp,
    is_execution_plan,
)

from ._leases import Leases, LeaseSettings

if TYPE_CHECKING:
    from phronomy._telemetry import Telemetry
    from phronomy.engine import Engine
    from phronomy.storage import (
        Consumption,
        InstanceStatus,
        Lease,
        StoredRecord,
        WorkflowStore,
    )

__all__ = [
    "DurabilityService",
    "DurabilityStatistics",
    "RecordKind",
    "kind_of",
    "mark_op",
    "queued",
    "save_outcome",
]

logger = logging.getLogger(__name__)

RecordKind = Literal["workflow", "execution"]
"""What a row holds: a workflow instance, or the record of a supervised execution key."""

_NEVER_SUBMITTED = (BackpressureError, RuntimeShutdownError, RuntimeShutdownError)


@final
class DurabilityStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """What the durability service did so far.

    Attributes:
        write_batches: write transactions run (group commits).
        writes: write operations in them.
        read_batches: read batches run.
        reads: read operations in them.
    """

    write_batches: int
    writes: int
    read_batches: int
    reads: int


@final
class _Request(msgspec.Struct, frozen=True, kw_only=True):
    """One store operation, with an optional step run in the worker on its result, or
    (*together*) reads run in the same store batch, whose result is the tuple of
    theirs."""

    op: StoreOp
    finish: Callable[[Any], Any] | None = None
    together: tuple[StoreOp, ...] = ()


@final
class DurabilityService:
    """The runtime's only path to its store: three pools, each with a batcher.

    Writes run in submission order in the ``phronomy.store`` pool; concurrent writes
    share one transaction. Reads (loads, listings) run in their own
    ``phronomy.store.reads`` lane, so a read never waits for a commit's fsync; it sees
    committed data only, which is all a read may rely on (a segment's own writes are
    committed before it is released). Lease renewals run in the ``phronomy.leases``
    lane (the store runs a batch of renewals only on a connection of its own), so a
    heartbeat never waits behind claims and saves: a slow or contended write cannot
    make this runtime lose its leases.

    A batcher keeps at most one batch in its pool and queues the rest itself, so the
    store is never refused for backpressure: the runtime bounds the work it admits
    instead (sessions, executions), and the pools' queue sizes follow its
    configuration.
    """

    telemetry: Telemetry | None = None
    """The runtime's OpenTelemetry (``None``: off): a span per write batch."""

    def __init__(
        self,
        engine: Engine,
        store: WorkflowStore,
        *,
        queue_size: int,
        leases: LeaseSettings | None = None,
    ) -> None:
        """Create the service's pools on *engine* (the store is opened by :meth:`open`);
        its :attr:`leases` follow *leases* (the defaults if ``None``)."""
        self.store = store
        self.leases = Leases(self.run, leases or LeaseSettings())
        self._pool = engine.pool(
            "phronomy.store", size=store.max_concurrency, queue_size=queue_size
        )
        defer, handoff = engine.at_batch_end, engine.call_soon
        self._writes: Batcher[_Request, Any] = Batcher(
            self._pool, self._run_writes, defer=defer, handoff=handoff
        )
        self._reads: Batcher[_Request, Any] = Batcher(
            engine.pool("phronomy.store.reads", size=1, queue_size=queue_size),
            self._run_batch,
            defer=defer,
            handoff=handoff,
        )
        self._renewals: Batcher[_Request, Any] = Batcher(
            engine.pool("phronomy.leases", size=1, queue_size=queue_size),
            self._run_batch,
            defer=defer,
        )
        self._lanes: dict[type[Any], Batcher[_Request, Any]] = {}

    async def open(self) -> None:
        """Open the store and check it (in the write lane), before anything else runs.

        Raises:
            StoreUnavailableError: the store cannot be used.

        Cancellation:
            The caller waits for the opening thread (it is never abandoned).
        """
        await self._pool.run(self.store.open)

    @property
    def idle(self) -> bool:
        """No store operation is queued or running."""
        return self._writes.idle and self._reads.idle and self._renewals.idle

    def statistics(self) -> DurabilityStatistics:
        """Batches and operations so far (group commit: operations per write batch)."""
        return DurabilityStatistics(
            write_batches=self._writes.batches,
            writes=self._writes.items,
            read_batches=self._reads.batches,
            reads=self._reads.items,
        )

    async def wait_idle(self) -> None:
        """Wait until every submitted operation has run (the caller bounds the wait).

        Cancellation:
            Safe: the operations are not affected.
        """
        while not self.idle:
            await self._writes.wait_idle()
            await self._reads.wait_idle()
            await self._renewals.wait_idle()

    async def run(self, op: StoreOp, finish: Callable[[Any], Any] | None = None) -> Any:
        """Run *op* through the batched path and return its result (or raise its error).

        Cancellation:
            Cancelling the caller stops the wait only: a submitted write still runs
            (and is classified as usual).
        """
        return await queued(self, op, finish).result()

    async def list_all(
        self, kind: RecordKind, status: InstanceStatus | None = None
    ) -> list[StoredRecord]:
        """Every row of *kind* (snapshots omitted) with *status*, on the read lane.

        Cancellation:
            Safe: nothing is changed.
        """
        rows: list[StoredRecord] = []
        after: str | None = None
        while True:
            page = await self.run(ListOp(status=status, after=after, limit=500))
            rows.extend(r for r in page.records if kind_of(r) == kind)
            if page.next_after is None:
                return rows
            after = page.next_after

    def submit(
        self,
        op: StoreOp,
        callback: Callable[[outcome.Outcome[Any]], object],
        finish: Callable[[Any], Any] | None = None,
    ) -> None:
        """Queue *op*; *finish* (if any) maps its result in the worker thread, then
        ``callback(outcome)`` runs on the trio thread."""
        batcher = self._lanes.get(type(op))
        if batcher is None:  # the first of its type (by type: isinstance is slower)
            batcher = (
                self._reads
                if isinstance(op, READ_OPS)
                else self._renewals
                if isinstance(op, RenewOp)
                else self._writes
            )
            self._lanes[type(op)] = batcher
        batcher.submit(_Request(op=op, finish=finish), callback)

    async def read_together(
        self, ops: Sequence[StoreOp], finish: Callable[[Any], Any] | None = None
    ) -> Any:
        """Run the reads *ops* in one store batch, so they read one snapshot of the
        store (a store runs a batch of reads in one read transaction): the tuple of
        their results, mapped by *finish* in the worker thread.

        Raises:
            InvalidInputError: an operation of *ops* writes, or *ops* is empty.
            Exception: the error of the first operation that failed (or of the batch).

        Cancellation:
            Safe: nothing is changed (cancelling stops the wait only).
        """
        together = tuple(ops)
        if not together or not all(isinstance(op, READ_OPS) for op in together):
            raise InvalidInputError("read_together runs one or more reads only")
        done: ResultHandle[Any] = ResultHandle("store:read_together")

        def settle(result: outcome.Outcome[Any]) -> None:
            if isinstance(result, outcome.Value):  # (see save_outcome)
                done.complete(result.value)
            else:
                assert isinstance(result, outcome.Error)
                done.fail(result.error)

        request = _Request(op=together[0], finish=finish, together=together)
        self._reads.submit(request, settle)
        return await done.result()

    def submit_quietly(self, op: StoreOp, what: str) -> None:
        """Queue a best-effort metadata write; a failure is only logged."""

        def report(result: outcome.Outcome[Any]) -> None:
            if isinstance(result, outcome.Error):
                logger.warning("could not %s: %r", what, result.error)
            elif isinstance(result, outcome.Value) and result.value is False:
                logger.info(
                    "did not %s: the row moved on (another runtime holds or settled "
                    "it)",
                    what,
                )
            elif (
                isinstance(result, outcome.Value)
                and isinstance(result.value, SaveOutcome)
                and result.value.outcome != "success"
            ):
                logger.warning(
                    "could not %s (%s): %r",
                    what,
                    result.value.outcome,
                    result.value.error,
                )

        self.submit(op, report)

    def _run_writes(self, requests: list[_Request]) -> list[outcome.Outcome[Any]]:
        if self.telemetry is None:
            return self._run_batch(requests)
        with self.telemetry.commit([r.op for r in requests]):  # in the worker thread
            return self._run_batch(requests)

    def _run_batch(self, requests: list[_Request]) -> list[outcome.Outcome[Any]]:
        ops: list[StoreOp] = []
        for r in requests:  # (a lone operation without the tuple of ``ops``)
            if r.together:
                ops.extend(r.together)
            else:
                ops.append(r.op)
        results = iter(self.store.execute(ops))
        done: list[outcome.Outcome[Any]] = []
        for request in requests:
            result = next(results)
            if request.together:  # one outcome for them all: the first error, if any
                mine = [result, *(next(results) for _ in request.together[1:])]
                failed = [r for r in mine if isinstance(r, outcome.Error)]
                result = (
                    failed[0]
                    if failed
                    else outcome.Value(tuple(r.unwrap() for r in mine))
                )
            if request.finish is not None and isinstance(result, outcome.Value):
                result = outcome.capture(request.finish, result.value)
            done.append(result)
        return done


def queued(
    service: DurabilityService, op: StoreOp, finish: Callable[[Any], Any] | None = None
) -> ResultHandle[Any]:
    """Queue *op* on *service*'s lanes (as :meth:`DurabilityService.run`, without
    waiting): the handle settles with its result, mapped by *finish* in the worker
    thread. Queue several reads, then await their handles: they share a batch."""
    done: ResultHandle[Any] = ResultHandle(f"store:{type(op).__name__}")

    def settle(result: outcome.Outcome[Any]) -> None:
        if isinstance(result, outcome.Value):  # (see save_outcome)
            done.complete(result.value)
        else:
            assert isinstance(result, outcome.Error)
            done.fail(result.error)

    service.submit(op, settle, finish)
    return done


def kind_of(row: StoredRecord) -> RecordKind:
    """The kind of record a row holds."""
    return "execution" if is_execution_plan(row.workflow) else "workflow"


def save_outcome(saved: outcome.Outcome[Any]) -> SaveOutcome:
    """What a submitted :class:`SaveOp` did, from the outcome its batch delivered.

    The store classifies each save itself; when the batch as a whole never ran (the
    pool refused it) nothing was written, and when the offloaded call itself failed
    nobody knows what was written.
    """
    # a Value first: isinstance() of its own class is a fast path, while testing a
    # Value against outcome.Error goes through ABCMeta.__instancecheck__ (a call)
    if not isinstance(saved, outcome.Value):
        assert isinstance(saved, outcome.Error)
        if isinstance(saved.error, _NEVER_SUBMITTED):
            return SaveOutcome(outcome="known_failure", error=saved.error)
        return SaveOutcome(outcome="outcome_unknown", error=saved.error)
    result: SaveOutcome = saved.value
    return result


def mark_op(
    workflow_instance_id: str,
    status: InstanceStatus,
    *,
    expected_revision: int | None,
    detail: str | None,
    workflow: str = "",
    lease: Lease | None = None,
    consumed: tuple[Consumption, ...] = (),
) -> MarkOp:
    """A status-only write (``detail`` truncated to 1000 characters); with *lease*,
    only while the row holds that lease (its claim made the row), else it creates a
    placeholder row for an instance that never saved (so operators see it)."""
    return MarkOp(
        workflow_instance_id=workflow_instance_id,
        status=status,
        expected_revision=expected_revision,
        detail=None if detail is None else detail[:1000],
        create=lease is None and not expected_revision,
        workflow=workflow,
        lease=lease,
        consumed=consumed,
    )
