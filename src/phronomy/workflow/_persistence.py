"""Durable segments: the store gateway (group commit) and the terminal barrier policy."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, final

from phronomy.durability import save_outcome
from phronomy.engine import Event, TerminalDecision, random_hex
from phronomy.errors import (
    PhronomyError,
)
from phronomy.storage import (
    SaveOp,
    SaveOutcome,
    SaveRequest,
    encode_snapshot,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    import outcome

    from phronomy.durability import DurabilityService
    from phronomy.engine import EventSink, TerminalType
    from phronomy.storage import Consumption, InstanceStatus, Lease

    from ._timeouts import TimerChanges

__all__ = ["TERMINAL_RESULT", "TerminalPersistence"]

logger = logging.getLogger(__name__)

TERMINAL_RESULT = "__phronomy.terminal_persistence_result__"
"""The event that carries a terminal save's classified outcome back to its session."""


@final
class TerminalPersistence:
    """The terminal barrier of a durable segment.

    When the session halts or finishes, its admission becomes ``persisting_terminal``
    (*on_persisting*),
    one immutable snapshot is encoded and saved (in the next group commit), and the
    classified outcome comes back through the session's own sink. The caller hears
    "halted" or "finished" only after ``success``.
    """

    def __init__(
        self,
        *,
        gateway: DurabilityService,
        on_persisting: Callable[[str], object],
        instance_id: str,
        workflow: str,
        version: str,
        expected_revision: int | None,
        max_snapshot_bytes: int,
        lease: Lease | None = None,
        trace: str | None = None,
    ) -> None:
        """Create the policy of one segment (runtime internal); its save presents
        *lease* (the store refuses it once another runtime took the instance over)
        and stores *trace* (the segment's traceparent) with the snapshot."""
        self._gateway = gateway
        self._on_persisting = on_persisting
        self._instance_id = instance_id
        self._workflow = workflow
        self._version = version
        self._expected = expected_revision
        self._max_bytes = max_snapshot_bytes
        self._lease = lease
        self._trace = trace

    def start(
        self, *, terminal_type: TerminalType, value: Any, sink: EventSink
    ) -> None:
        """Mark the admission, encode the snapshot and submit one save.

        *value* is the segment's ``(state, phase, detail, consumed, timers)`` at its
        terminal request (*detail*: a note saved with the row, for example a
        cancellation's reason; *consumed*: the inbox entries it consumes; *timers*:
        what it arms and disarms).

        Raises:
            SerializationError: the state holds values outside the JSON domain (the
                session fails with it; nothing is written).
        """
        state, phase, detail, consumed, timers = value
        self._on_persisting(self._instance_id)
        request = self._request(state, phase, terminal_type, detail, consumed, timers)
        iid = self._instance_id

        def deliver(saved: outcome.Outcome[Any]) -> None:
            result = save_outcome(saved)
            if not sink.handle_now(TERMINAL_RESULT, result):
                logger.warning(
                    "the runtime rejected Workflow terminal persistence result for %r (%s); "
                    "the save is not retried",
                    iid,
                    result.outcome,
                )

        self._gateway.submit(SaveOp(request=request), deliver)

    def checkpoint(
        self,
        state: Any,
        phase: str,
        timers: TimerChanges,
        deliver: Callable[[SaveOutcome], object],
    ) -> None:
        """Submit a mid-segment save of *state* at the checkpoint *phase*: status
        ``running``, so the row keeps the segment's lease; *deliver* gets its
        classified outcome (after ``success``, see :meth:`saved`).

        Raises:
            SerializationError: the state holds values outside the JSON domain.
        """
        request = self._request(state, phase, "running", None, (), timers)
        self._gateway.submit(
            SaveOp(request=request), lambda saved: deliver(save_outcome(saved))
        )

    def saved(self, revision: int) -> None:
        """A checkpoint saved *revision*: the segment's next save expects it."""
        self._expected = revision

    def _request(
        self,
        state: Any,
        phase: str | None,
        status: InstanceStatus,
        detail: str | None,
        consumed: tuple[Consumption, ...],
        timers: TimerChanges,
    ) -> SaveRequest:
        iid = self._instance_id
        revision = (self._expected or 0) + 1
        snapshot = encode_snapshot(
            state,
            workflow_instance_id=iid,
            revision=revision,
            phase=phase,
            workflow=self._workflow,
            max_bytes=self._max_bytes,
            trace=self._trace,
        )
        return SaveRequest(
            workflow_instance_id=iid,
            expected_revision=self._expected,
            snapshot=snapshot,
            write_id=random_hex(),
            status=status,
            phase=phase,
            workflow=self._workflow,
            definition_version=self._version,
            detail=detail,
            lease=self._lease,
            consumed=consumed,
            arm=timers[0],
            disarm=timers[1],
        )

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
                return TerminalDecision(action="complete", revision=result.revision)
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
