"""The part of the workflow client about time: delayed starts (``start_later``) and
an instance's pending timers (``timers``)."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from phronomy.engine import random_hex
from phronomy.errors import InstanceExistsError, InvalidInputError
from phronomy.storage import (
    MAX_DELAY_MS,
    FindWriteOp,
    LoadOp,
    SaveOp,
    SaveRequest,
    StoredTimer,
    TimersOp,
    TimerSpec,
    encode_snapshot,
    validate_instance_id,
)
from phronomy.storage._clock import wall_ms

from ._definition import SCHEDULED, START_DUE
from ._hydration import start_state
from ._inputs import input_overlay
from ._state import State

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from phronomy.durability import DurabilityService
    from phronomy.storage import SaveOutcome, StoredRecord

    from ._coordinator import WorkflowCoordinator
    from ._definition import WorkflowDefinition
    from ._messages import InputOverlay

__all__ = ["TimerClient", "start_request", "store_now"]

S = TypeVar("S", bound=State)

START_TIMER = "start"
"""The name of a delayed start's timer."""


class TimerClient:
    """Delayed starts and pending timers (a part of
    :class:`~phronomy.workflow.WorkflowClient`)."""

    _coordinator: WorkflowCoordinator

    async def start_later(
        self,
        workflow: WorkflowDefinition[S],
        input: Mapping[str, Any] | S | None = None,  # noqa: A002 - the workflow's input
        *,
        workflow_instance_id: str,
        at: datetime | None = None,
        after: timedelta | float | None = None,
    ) -> StoredRecord:
        """Store an instance that starts at its entry point later, in whichever
        runtime serving *workflow* fires its start timer first (exactly once; this
        runtime serves it from now on).

        Until then it is halted at the phase ``__scheduled__`` with its input saved
        (revision 1) and a ``start`` timer; it can be cancelled like any halted
        instance. Events sent before it starts are refused (their receipts say so).
        It is a separate call from :meth:`start` because it returns once the instance
        is stored, not with a result.

        Args:
            workflow: the workflow (a runtime must serve it: ``open_runtime(workflows=[...])``).
            input: field values (validated) or a complete state.
            workflow_instance_id: the instance id.
            at: when to start (a timezone-aware datetime; compared with the store's
                clock through this host's).
            after: or how long from now (a timedelta, or seconds).

        Returns:
            The stored row (without its snapshot).

        Raises:
            InvalidInputError: no store, neither or both of *at* and *after*, a naive
                datetime, a delay that is negative or over 100 years, an invalid id or
                input (nothing is written).
            InstanceExistsError: the store holds the id already (nothing is written).
            SerializationError: the input cannot be stored.

        Cancellation:
            The wait stops; a submitted save still commits or not (look the id up).
        """
        coordinator = self._coordinator
        gateway = coordinator.gateway
        if gateway is None:
            raise InvalidInputError(
                "start_later needs a store (open_runtime(store=...))"
            )
        iid = validate_instance_id(workflow_instance_id)
        # this runtime serves it from now on, as one that starts an instance does
        coordinator.served.setdefault(workflow.name, workflow)
        delay_ms = _delay_ms(at, after, lambda: store_now(gateway))
        request = start_request(
            workflow,
            iid,
            input_overlay(workflow, input),
            delay_ms=delay_ms,
            max_bytes=coordinator.max_snapshot_bytes,
        )
        write_id = request.write_id
        saved: SaveOutcome = await gateway.run(SaveOp(request=request))
        if saved.outcome == "outcome_unknown":
            found = await gateway.run(
                FindWriteOp(workflow_instance_id=iid, write_id=write_id)
            )
            if found is None:
                assert saved.error is not None
                raise saved.error
        row: StoredRecord | None = await gateway.run(LoadOp(workflow_instance_id=iid))
        if saved.outcome == "known_failure":
            if row is None:
                assert saved.error is not None
                raise saved.error
            raise InstanceExistsError(
                f"workflow instance {iid!r} exists ({row.status} at revision "
                f"{row.revision}); start_later stored nothing",
                instance_id=iid,
                status=row.status,
                phase=row.phase,
                revision=row.revision,
            )
        assert row is not None
        stored: StoredRecord = msgspec.structs.replace(row, snapshot=None)
        return stored

    async def timers(self, workflow_instance_id: str) -> tuple[StoredTimer, ...]:
        """The instance's pending timers, soonest first (timeouts of the state it
        halted at, its actions' timers, a delayed start), read from the store.

        Raises:
            InvalidInputError: an invalid id, or the runtime has no store.

        Cancellation:
            Safe: nothing is changed.
        """
        iid = validate_instance_id(workflow_instance_id)
        gateway = self._coordinator.gateway
        if gateway is None:
            raise InvalidInputError("timers needs a store (open_runtime(store=...))")
        timers: tuple[StoredTimer, ...] = await gateway.run(
            TimersOp(workflow_instance_id=iid)
        )
        return timers


def store_now(gateway: DurabilityService) -> int:
    """The store's wall clock (a test clock's, if it has one; else this host's)."""
    clock: Callable[[], int] = getattr(gateway.store, "wall_now_ms", wall_ms)
    return clock()


def start_request(
    workflow: WorkflowDefinition[Any],
    workflow_instance_id: str,
    overlay: InputOverlay,
    *,
    delay_ms: int,
    max_bytes: int,
) -> SaveRequest:
    """The save that stores *workflow_instance_id* to start after *delay_ms*: halted
    at ``__scheduled__`` (revision 1) with its input, and its ``start`` timer.

    Raises:
        SerializationError: the input cannot be stored.
    """
    state = start_state(workflow, overlay, None)
    return SaveRequest(
        workflow_instance_id=workflow_instance_id,
        expected_revision=None,
        snapshot=encode_snapshot(
            state,
            workflow_instance_id=workflow_instance_id,
            revision=1,
            phase=SCHEDULED,
            workflow=workflow.name,
            max_bytes=max_bytes,
        ),
        write_id=random_hex(),
        status="halted",
        phase=SCHEDULED,
        workflow=workflow.name,
        definition_version=workflow.version,
        arm=(
            TimerSpec(
                name=START_TIMER,
                delay_ms=delay_ms,
                event=START_DUE,
                kind="start",
                state=SCHEDULED,
            ),
        ),
    )


def _delay_ms(
    at: datetime | None, after: timedelta | float | None, now_ms: Callable[[], int]
) -> int:
    """The delay until *at*, or *after*, in whole milliseconds.

    Raises:
        InvalidInputError: neither or both, a naive datetime, a bad delay.
    """
    if (at is None) == (after is None):
        raise InvalidInputError(
            "start_later needs at= (a datetime) or after=, not both"
        )
    given: object = at  # checked at run time: callers are not typed
    if at is not None:
        if not isinstance(given, datetime) or at.utcoffset() is None:
            raise InvalidInputError(
                f"at= must be a timezone-aware datetime, got {at!r} (a naive datetime "
                "names no instant: add tzinfo, for example datetime.UTC)"
            )
        seconds = at.timestamp() - now_ms() / 1000
        seconds = max(seconds, 0.0)  # a time just passed: start now
    elif isinstance(after, timedelta):
        seconds = after.total_seconds()
    elif isinstance(after, (int, float)) and not isinstance(after, bool):
        seconds = float(after)
    else:
        raise InvalidInputError(f"after= must be a timedelta or seconds, got {after!r}")
    if not (math.isfinite(seconds) and 0 <= seconds * 1000 <= MAX_DELAY_MS):
        raise InvalidInputError(
            f"the start must be from now to 100 years ahead, got {at if after is None else after!r}"
        )
    return math.ceil(seconds * 1000)
