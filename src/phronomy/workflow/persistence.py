"""Durable segments: the store gateway (group commit) and the terminal barrier policy."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, final

import msgspec
import outcome

from phronomy.engine import Batcher, Event, ResultHandle, TerminalDecision, random_hex
from phronomy.errors import (
    BackpressureError,
    PhronomyError,
    PoolShutdownError,
    RuntimeShutdownError,
)
from phronomy.storage import (
    READ_OPS,
    ListOp,
    MarkOp,
    SaveOp,
    SaveOutcome,
    SaveRequest,
    StoreOp,
    encode_snapshot,
)

if TYPE_CHECKING:
    from phronomy.engine import Engine, GatedSession, TerminalType
    from phronomy.storage import InstanceStatus, StoredRecord, WorkflowStore

    from .registry import WorkflowRegistry
    from .session import WorkflowSession

__all__ = [
    "TERMINAL_RESULT",
    "StoreGateway",
    "StoreRequest",
    "TerminalPersistence",
    "mark_op",
    "save_outcome",
]

logger = logging.getLogger(__name__)

TERMINAL_RESULT = "__phronomy.terminal_persistence_result__"

_NEVER_SUBMITTED = (BackpressureError, PoolShutdownError, RuntimeShutdownError)
"""The event that carries a terminal save's classified outcome back to its session."""


@final
class StoreRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One store operation, with an optional step run in the worker on its result."""

    op: StoreOp
    finish: Callable[[Any], Any] | None = None


@final
class StoreGateway:
    """The runtime's only path to its store: two pools, each with a group-commit batcher.

    Writes run in submission order in the ``phronomy.store`` pool; concurrent writes
    share one transaction. Reads (loads, listings) run in their own
    ``phronomy.store.reads`` lane, so a read never waits for a commit's fsync; it sees
    committed data only, which is all a read may rely on (a segment's own writes are
    committed before it is released).

    A batcher keeps at most one batch in its pool and queues the rest itself, so the
    store is never refused for backpressure: the runtime bounds the work it admits
    instead (sessions, executions), and the pools' queue sizes follow its
    configuration.
    """

    def __init__(
        self, engine: Engine, store: WorkflowStore, *, queue_size: int
    ) -> None:
        """Create the gateway's pools on *engine*."""
        self.store = store
        self.pool = engine.pool(
            "phronomy.store", size=store.max_concurrency, queue_size=queue_size
        )
        self._writes: Batcher[StoreRequest, Any] = Batcher(self.pool, self._run_batch)
        self._reads: Batcher[StoreRequest, Any] = Batcher(
            engine.pool("phronomy.store.reads", size=1, queue_size=queue_size),
            self._run_batch,
        )

    @property
    def idle(self) -> bool:
        """No store operation is queued or running."""
        return self._writes.idle and self._reads.idle

    async def wait_idle(self) -> None:
        """Wait until every submitted operation has run (the caller bounds the wait).

        Cancellation:
            Safe: the operations are not affected.
        """
        while not self.idle:
            await self._writes.wait_idle()
            await self._reads.wait_idle()

    async def run(self, op: StoreOp, finish: Callable[[Any], Any] | None = None) -> Any:
        """Run *op* through the batched path and return its result (or raise its error).

        Cancellation:
            Cancelling the caller stops the wait only: a submitted write still runs
            (and is classified as usual).
        """
        done: ResultHandle[Any] = ResultHandle(f"store:{type(op).__name__}")

        def settle(result: outcome.Outcome[Any]) -> None:
            if isinstance(result, outcome.Error):
                done.fail(result.error)
            else:
                assert isinstance(result, outcome.Value)
                done.complete(result.value)

        self.submit(op, settle, finish)
        return await done.result()

    async def list_all(
        self, status: InstanceStatus | None = None
    ) -> list[StoredRecord]:
        """Every row (snapshots omitted) with *status*, page by page on the read lane.

        Cancellation:
            Safe: nothing is changed.
        """
        rows: list[StoredRecord] = []
        after: str | None = None
        while True:
            page = await self.run(ListOp(status=status, after=after, limit=500))
            rows.extend(page.records)
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
        batcher = self._reads if isinstance(op, READ_OPS) else self._writes
        batcher.submit(StoreRequest(op=op, finish=finish), callback)

    def submit_quietly(self, op: StoreOp, what: str) -> None:
        """Queue a best-effort metadata write; a failure is only logged."""

        def report(result: outcome.Outcome[Any]) -> None:
            if isinstance(result, outcome.Error):
                logger.warning("could not %s: %r", what, result.error)
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

    def _run_batch(self, requests: list[StoreRequest]) -> list[outcome.Outcome[Any]]:
        results = self.store.execute([r.op for r in requests])
        for index, request in enumerate(requests):
            result = results[index]
            if request.finish is not None and isinstance(result, outcome.Value):
                results[index] = outcome.capture(request.finish, result.value)
        return results


@final
class TerminalPersistence:
    """The terminal barrier of a durable segment (spec §2.10, §4.5).

    When the session halts or finishes, its admission becomes ``persisting_terminal``,
    one immutable snapshot is encoded and saved (in the next group commit), and the
    classified outcome comes back through the session's own sink. The caller hears
    "halted" or "finished" only after ``success``.
    """

    def __init__(
        self,
        *,
        gateway: StoreGateway,
        registry: WorkflowRegistry,
        owner: object,
        expected_revision: int | None,
        max_snapshot_bytes: int,
    ) -> None:
        """Create the policy of one segment (runtime internal)."""
        self._gateway = gateway
        self._registry = registry
        self._owner = owner
        self._expected = expected_revision
        self._max_bytes = max_snapshot_bytes
        self._session: WorkflowSession[Any] | None = None

    def start(self, *, terminal_type: TerminalType, session: GatedSession) -> None:
        """Mark the admission, encode the snapshot and submit one save.

        Raises:
            SerializationError: the state holds values outside the JSON domain (the
                session fails with it; nothing is written).
        """
        workflow_session: WorkflowSession[Any] = session  # type: ignore[assignment]
        self._session = workflow_session
        iid = workflow_session.workflow_instance_id
        self._registry.mark_workflow_admission(iid, self._owner, "persisting_terminal")
        revision = (self._expected or 0) + 1
        snapshot = encode_snapshot(
            workflow_session.state,
            workflow_instance_id=iid,
            revision=revision,
            phase=workflow_session.phase,
            workflow=workflow_session.definition.name,
            max_bytes=self._max_bytes,
        )
        status: InstanceStatus = "finished" if terminal_type == "finished" else "halted"
        request = SaveRequest(
            workflow_instance_id=iid,
            expected_revision=self._expected,
            snapshot=snapshot,
            write_id=random_hex(),
            status=status,
            phase=workflow_session.phase,
            workflow=workflow_session.definition.name,
        )
        sink = workflow_session.sink

        def deliver(saved: outcome.Outcome[Any]) -> None:
            result = save_outcome(saved)
            if not sink.post(TERMINAL_RESULT, result):
                logger.warning(
                    "the runtime rejected Workflow terminal persistence result for %r (%s); "
                    "the save is not retried",
                    iid,
                    result.outcome,
                )

        self._gateway.submit(SaveOp(request=request), deliver)

    def handles(self, event: Event) -> bool:
        """Whether *event* is this policy's terminal result."""
        return event.type == TERMINAL_RESULT

    def decision_for(self, event: Event) -> TerminalDecision:
        """Map the classified save outcome to complete / fail / retire.

        Raises:
            PhronomyError: an outcome this policy does not know.
        """
        result = event.payload
        if not isinstance(result, SaveOutcome):
            raise PhronomyError(
                f"unknown Workflow terminal persistence outcome {result!r}"
            )
        match result.outcome:
            case "success":
                if self._session is not None:
                    self._session.revision = result.revision
                return TerminalDecision(action="complete")
            case "known_failure":
                return TerminalDecision(
                    action="fail",
                    error=result.error
                    or PhronomyError("Workflow terminal persistence failed"),
                )
            case "outcome_unknown":
                return TerminalDecision(action="retire", error=result.error)
        raise PhronomyError(
            f"unknown Workflow terminal persistence outcome {result.outcome!r}"
        )


def save_outcome(saved: outcome.Outcome[Any]) -> SaveOutcome:
    """What a submitted :class:`SaveOp` did, from the outcome its batch delivered.

    The store classifies each save itself; when the batch as a whole never ran (the
    pool refused it) nothing was written, and when the offloaded call itself failed
    nobody knows what was written.
    """
    if isinstance(saved, outcome.Error):
        if isinstance(saved.error, _NEVER_SUBMITTED):
            return SaveOutcome(outcome="known_failure", error=saved.error)
        return SaveOutcome(outcome="outcome_unknown", error=saved.error)
    assert isinstance(saved, outcome.Value)
    result: SaveOutcome = saved.value
    return result


def mark_op(
    workflow_instance_id: str,
    status: InstanceStatus,
    *,
    expected_revision: int | None,
    detail: str,
    workflow: str = "",
) -> MarkOp:
    """A status-only write (``detail`` truncated to 1000 characters) that creates a
    placeholder row for an instance that never saved (so operators see it)."""
    return MarkOp(
        workflow_instance_id=workflow_instance_id,
        status=status,
        expected_revision=expected_revision,
        detail=detail[:1000],
        create=not expected_revision,
        workflow=workflow,
    )
