"""Workflow admissions: at most one live segment per ``workflow_instance_id`` (spec §2.11)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import msgspec

from phronomy.engine import Event, ExecutionReceiver
from phronomy.errors import (
    BusyError,
    InvalidInputError,
    PhronomyInternalError,
    RecoveryRequiredError,
)

from ._messages import Admission, AdmissionState

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from phronomy.engine import Engine, ResultHandle

__all__ = ["WorkflowRegistry"]

logger = logging.getLogger(__name__)

_MARKABLE: frozenset[AdmissionState] = frozenset(
    {"executing", "persisting_terminal", "recovery_required"}
)
_BUSY: frozenset[AdmissionState] = frozenset(
    {"admitting", "executing", "persisting_terminal"}
)


class WorkflowRegistry(ExecutionReceiver):
    """The admission table of one runtime, mutated only on the dispatcher.

    State machine per instance::

        (absent) --admit(token)--> admitting --bind(token, session)--> executing
        executing --mark(token, persisting_terminal)--> persisting_terminal
        admitting | executing | persisting_terminal --release(token)--> (absent)
        any --session retired (unknown save outcome)--> recovery_required
        recovery_required --operator resolution or runtime shutdown--> (absent)

    Owner tokens are opaque objects compared with ``is``: a stale or competing owner can
    never bind, mark or release the current segment.
    """

    def __init__(
        self,
        engine: Engine,
        deliver: Callable[[Any], None],
        *,
        on_retired: Callable[[str, BaseException | None], None] | None = None,
        flush: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """Create the registry.

        Args:
            engine: the engine it is registered on.
            deliver: handles workflow commands on the dispatcher.
            on_retired: told when an instance becomes recovery-required.
            flush: waits for the store writes of the workflows (at shutdown).
        """
        super().__init__(engine)
        self._deliver = deliver
        self._on_retired = on_retired
        self._flush = flush
        self._records: dict[str, Admission] = {}
        self._by_session: dict[str, str] = {}
        self._busy = 0

    # --- the receiver contract ------------------------------------------------------

    def idle(self) -> bool:
        """No admission is admitting, executing or persisting (recovery does not block)."""
        return self._busy == 0

    def deliver(self, message: Any) -> None:
        """Hand a workflow command to the runner (on the dispatcher)."""
        self._deliver(message)

    def shutdown(self, error: BaseException | None) -> None:
        """Clear every admission; pending recovery callers get a :class:`RecoveryRequiredError`."""
        for record in self._records.values():
            caller: ResultHandle[Any] | None = record.caller
            if caller is None or caller.done:
                continue
            if record.state == "recovery_required":
                message = (
                    f"workflow instance {record.workflow_instance_id!r} requires recovery: "
                    f"the outcome of its terminal save is unknown ({record.error!r}); the "
                    "runtime shut down before an operator resolved it"
                )
                caller.fail(
                    error
                    or RecoveryRequiredError(
                        message, instance_id=record.workflow_instance_id
                    )
                )
            elif error is not None:
                caller.fail(error)
        self._records.clear()
        self._by_session.clear()
        self._busy = 0

    async def flush(self) -> None:
        """Wait for the store writes the workflows owe (cut-off marks, failures)."""
        if self._flush is not None:
            await self._flush()
        else:
            await super().flush()

    def session_retired(
        self,
        session_id: str,
        *,
        waiter: ResultHandle[Any] | None,
        error: BaseException | None,
    ) -> None:
        """The session's save outcome is unknown: the admission becomes recovery-required."""
        iid = self._by_session.pop(session_id, None)
        record = self._records.get(iid) if iid is not None else None
        if record is None:
            return
        self._replace(
            msgspec.structs.replace(
                record, state="recovery_required", session_id=None, error=error
            )
        )
        logger.warning(
            "workflow instance %r requires recovery (the outcome of its terminal save is "
            "unknown: %r); its caller stays pending until an operator resolves it or "
            "the runtime shuts down",
            record.workflow_instance_id,
            error,
        )
        if self._on_retired is not None:
            self._on_retired(record.workflow_instance_id, error)

    def describe_live(self) -> list[str]:
        """Describe busy admissions (for the shutdown report)."""
        return [
            f"workflow {r.workflow} instance {r.workflow_instance_id} ({r.state})"
            for r in self._records.values()
            if r.state in _BUSY
        ]

    # --- mutations (dispatcher only) --------------------------------------------------------

    def admit_workflow(
        self, workflow_instance_id: str, owner: object, workflow: str
    ) -> None:
        """Admit a new segment.

        Raises:
            InvalidInputError: empty id.
            RuntimeShutdownError: new admissions are closed.
            BusyError: the instance has any admission (recovery included).
        """
        self.assert_dispatcher()
        if not workflow_instance_id:
            raise InvalidInputError("workflow_instance_id must not be empty")
        self.admit()
        if workflow_instance_id in self._records:
            current = self._records[workflow_instance_id]
            raise BusyError(
                f"Workflow instance {workflow_instance_id!r} already has a live execution "
                f"segment ({current.state})"
            )
        self._replace(
            Admission(
                workflow_instance_id=workflow_instance_id,
                owner=owner,
                session_id=None,
                state="admitting",
                workflow=workflow,
            )
        )

    def bind_workflow_session(
        self,
        workflow_instance_id: str,
        owner: object,
        session_id: str,
        caller: ResultHandle[Any],
    ) -> None:
        """Bind the admission to its session (state ``executing``).

        Raises:
            PhronomyInternalError: no admission, another owner, or already bound.
        """
        self.assert_dispatcher()
        if not session_id:
            raise InvalidInputError("session_id must not be empty")
        record = self._records.get(workflow_instance_id)
        if record is None:
            raise PhronomyInternalError(
                f"Workflow instance {workflow_instance_id!r} has no Runtime admission"
            )
        if record.owner is not owner or record.session_id is not None:
            raise PhronomyInternalError(
                f"stale Workflow admission bind for {workflow_instance_id!r}"
            )
        self._by_session[session_id] = workflow_instance_id
        self._replace(
            msgspec.structs.replace(
                record, session_id=session_id, state="executing", caller=caller
            )
        )

    def mark_workflow_admission(
        self, workflow_instance_id: str, owner: object, state: AdmissionState
    ) -> None:
        """Move the admission to *state* (``executing``, ``persisting_terminal``, ...).

        Raises:
            ValueError: an unsupported state.
            PhronomyInternalError: no admission, or another owner.
        """
        self.assert_dispatcher()
        if state not in _MARKABLE:
            raise ValueError(f"unsupported Workflow admission state: {state!r}")
        record = self._records.get(workflow_instance_id)
        if record is None:
            raise PhronomyInternalError(
                f"Workflow instance {workflow_instance_id!r} has no Runtime admission"
            )
        if record.owner is not owner:
            raise PhronomyInternalError(
                f"stale Workflow admission update for {workflow_instance_id!r}"
            )
        self._replace(msgspec.structs.replace(record, state=state))

    def release_workflow(self, workflow_instance_id: str, owner: object) -> bool:
        """Remove the admission if *owner* holds it; ``False`` (no error) otherwise."""
        self.assert_dispatcher()
        record = self._records.get(workflow_instance_id)
        if record is None or record.owner is not owner:
            return False
        self._remove(record)
        return True

    def resolve(self, workflow_instance_id: str) -> Admission | None:
        """Remove a recovery-required admission (operator resolution); return it."""
        self.assert_dispatcher()
        record = self._records.get(workflow_instance_id)
        if record is None or record.state != "recovery_required":
            return None
        self._remove(record)
        return record

    # --- reads (any trio task) ------------------------------------------------------

    def record(self, workflow_instance_id: str) -> Admission | None:
        """The admission of *workflow_instance_id*, or ``None``."""
        return self._records.get(workflow_instance_id)

    def owner(self, workflow_instance_id: str) -> object | None:
        """The opaque owner token, or ``None``."""
        record = self._records.get(workflow_instance_id)
        return None if record is None else record.owner

    def state(self, workflow_instance_id: str) -> AdmissionState | None:
        """The admission state, or ``None``."""
        record = self._records.get(workflow_instance_id)
        return None if record is None else record.state

    def recovery_records(self) -> list[Admission]:
        """Admissions that require recovery."""
        return [r for r in self._records.values() if r.state == "recovery_required"]

    def post_to_workflow(
        self, workflow_instance_id: str, event: str, payload: Any
    ) -> bool:
        """Route *event* to the live session of the instance, if it is ``executing``."""

        def lookup() -> Event | None:
            record = self._records.get(workflow_instance_id)
            if (
                record is None
                or record.state != "executing"
                or record.session_id is None
            ):
                return None
            return Event(type=event, target_id=record.session_id, payload=payload)

        found = lookup()  # no checkpoint between the lookup and the post
        return found is not None and self.engine.post_nowait(found)

    # --- internals -----------------------------------------------------------------

    def _replace(self, record: Admission) -> None:
        previous = self._records.get(record.workflow_instance_id)
        if previous is not None and previous.state in _BUSY:
            self._busy -= 1
        self._records[record.workflow_instance_id] = record
        if record.state in _BUSY:
            self._busy += 1

    def _remove(self, record: Admission) -> None:
        del self._records[record.workflow_instance_id]
        if record.state in _BUSY:
            self._busy -= 1
        if record.session_id is not None:
            self._by_session.pop(record.session_id, None)
