"""Callers waiting for what becomes of an event they stored (``send_event``,
``deliver``): settled when the segment that applied it ends, or once the store says
so (another runtime applied it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, final

import msgspec

from phronomy.errors import (
    ConflictError,
    EventRejectedError,
    InstanceStateError,
    PhronomyError,
    TransitionError,
)
from phronomy.storage import InboxEntry, InboxStatus

from ._inbox import MOVED_ON
from ._messages import EventOutcome, WorkflowResult

if TYPE_CHECKING:
    from phronomy.engine import ResultHandle

__all__ = ["Applied", "Waiters"]

Kind = Literal["result", "outcome"]
"""``result``: the caller wants the result of the segment that applied its event (a
``WorkflowResult``, saved). ``outcome``: it wants what became of the event
(an ``EventOutcome``), as soon as it is known."""


@final
class Applied(msgspec.Struct, frozen=True, kw_only=True):
    """What became of one inbox entry.

    Attributes:
        entry: the entry.
        status: what became of it.
        detail: why it was refused, dropped or failed.
        result: the saved result of the segment that applied it (``transitioned``).
        error: the error it failed with (``failed``), or why it stays unapplied.
        phase: the state the instance was at afterwards.
        revision: its durable revision afterwards (when known).
    """

    entry: InboxEntry
    status: InboxStatus
    detail: str | None = None
    result: WorkflowResult[Any] | None = None
    error: BaseException | None = None
    phase: str | None = None
    revision: int | None = None


class Waiters:
    """Who waits for which entry, by ``(instance, event id)`` (on the dispatcher)."""

    def __init__(self) -> None:
        """Nobody waits yet."""
        self._by_key: dict[tuple[str, str], list[tuple[ResultHandle[Any], Kind]]] = {}
        self._failing: dict[tuple[str, str], BaseException] = {}

    def failing(self, iid: str, event_id: str, error: BaseException) -> None:
        """A segment of this runtime fails the entry with *error*: until its status
        write returned (:meth:`told`), a caller told by the store that the entry
        failed gets *error* itself, as the segment's own callers do, whichever hears
        first."""
        self._failing[(iid, event_id)] = error

    def told(self, iid: str, event_id: str) -> None:
        """The status write of the entry's failure returned and its callers were told:
        a later caller hears of it from the store, as from any runtime."""
        self._failing.pop((iid, event_id), None)

    def add(
        self, iid: str, event_id: str, caller: ResultHandle[Any], kind: Kind
    ) -> None:
        """*caller* waits for the entry *event_id* of *iid*."""
        self._by_key.setdefault((iid, event_id), []).append((caller, kind))
        caller.on_complete(lambda done: self._forget(iid, event_id, done))

    def awaited(self) -> list[tuple[str, str]]:
        """The entries someone waits for."""
        return list(self._by_key)

    def waited(self, iid: str, event_id: str) -> bool:
        """Whether someone waits for that entry."""
        return (iid, event_id) in self._by_key

    def settle(self, applied: Applied, *, final: bool = True) -> None:
        """Tell the waiters of the entry what became of it; those that want the
        segment's result only when *final* (its end was saved, or it never will be)."""
        key = (applied.entry.workflow_instance_id, applied.entry.event_id)
        if applied.status == "failed" and applied.error is None:
            error = self._failing.get(key)
            if error is not None:
                applied = msgspec.structs.replace(applied, error=error)
        for caller, kind in list(self._by_key.get(key, ())):
            if kind == "outcome":
                _answer_outcome(caller, applied)
            elif final:
                _answer_result(caller, applied)

    def fail(self, iid: str, event_id: str, error: BaseException) -> None:
        """Fail every waiter of the entry with *error*."""
        for caller, _ in list(self._by_key.get((iid, event_id), ())):
            caller.fail(error)

    def fail_instance(self, iid: str, error: BaseException) -> None:
        """Fail every waiter of an entry of *iid* with *error*."""
        for (instance, _), callers in list(self._by_key.items()):
            if instance == iid:
                for caller, _ in list(callers):
                    caller.fail(error)

    def close(self, error: BaseException) -> None:
        """The runtime shuts down: every waiter fails with *error*."""
        for callers in list(self._by_key.values()):
            for caller, _ in callers:
                caller.fail(error)
        self._by_key.clear()

    def _forget(self, iid: str, event_id: str, done: ResultHandle[Any]) -> None:
        callers = self._by_key.get((iid, event_id))
        if callers is None:
            return
        callers[:] = [(c, k) for c, k in callers if c is not done]
        if not callers:
            del self._by_key[(iid, event_id)]


def _answer_outcome(caller: ResultHandle[Any], applied: Applied) -> None:
    if applied.status == "failed":
        caller.fail(applied.error or PhronomyError(applied.detail or "it failed"))
        return
    status = applied.status
    caller.complete(
        EventOutcome(
            workflow_instance_id=applied.entry.workflow_instance_id,
            event=applied.entry.event,
            status="transitioned" if status == "pending" else status,
            phase=applied.phase,
        )
    )


def _answer_result(caller: ResultHandle[Any], applied: Applied) -> None:
    entry = applied.entry
    iid = entry.workflow_instance_id
    detail = applied.detail or ""
    revision = entry.revision if applied.revision is None else applied.revision
    match applied.status:
        case "transitioned" if applied.result is not None:
            caller.complete(applied.result)
        case "rejected":
            caller.fail(
                EventRejectedError(
                    f"event {entry.event!r} was rejected by every guard at "
                    f"{applied.phase!r} (workflow instance {iid!r}, revision "
                    f"{revision}); nothing changed and the instance can take "
                    "another event",
                    instance_id=iid,
                    event=entry.event,
                    phase=applied.phase or "",
                    revision=revision,
                )
            )
        case "dropped":
            caller.fail(
                TransitionError(
                    f"event {entry.event!r} was not applied to workflow instance "
                    f"{iid!r}: {detail}",
                    instance_id=iid,
                )
            )
        case "refused" if entry.expected_revision is not None and MOVED_ON in detail:
            caller.fail(
                ConflictError(
                    "Workflow state changed since the supplied halted result for "
                    f"workflow_instance_id {iid!r}: {detail}",
                    instance_id=iid,
                )
            )
        case "refused":
            caller.fail(
                InstanceStateError(
                    f"event {entry.event!r} was not applied to workflow instance "
                    f"{iid!r}: {detail}",
                    instance_id=iid,
                )
            )
        case _:
            caller.fail(
                applied.error
                or PhronomyError(
                    f"event {entry.event!r} of workflow instance {iid!r} failed: "
                    f"{detail}"
                )
            )
