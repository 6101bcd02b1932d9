"""Which inbox entry a segment resumes with (pure: it decides, the coordinator acts).

A segment that resumes a halted instance from its inbox takes the oldest pending entry
whose event can fire from the halted phase. Entries before it that cannot are judged
on the way — dropped (the phase does not declare the event, or a fired timer is stale),
or refused (the sender resumed from a halted result the instance has moved on from) —
and consumed with the segment's end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, final

import msgspec

from phronomy.errors import (
    AmbiguousEventError,
    InstanceStateError,
    InvalidInputError,
    TransitionError,
)
from phronomy.storage import Consumption, InboxEntry, fired_timer

from ._definition import FINISH, SCHEDULED, START_DUE
from ._events import resolve_event
from ._hydration import resume_state
from ._inbox import Feed, decode_input, decode_payload, moved_on
from ._retries import RETRY_EVENT
from ._timeouts import retry_of, stale_timer, timeout_of

if TYPE_CHECKING:
    from ._definition import WorkflowDefinition
    from ._state import State

__all__ = ["Selection", "select_entry"]


@final
class Selection(msgspec.Struct, frozen=True, kw_only=True):
    """What a segment resuming from the inbox starts with.

    Attributes:
        resume: ``(phase, event, payload)`` to resume with, or ``None`` when no entry
            can fire (the segment does not run: its claim is given back, consuming
            what *feed* judged).
        state: the state to resume from (the stored one, with the entry's input).
        feed: the segment's feed: the entry it resumes with as its current one, the
            later ones, and those judged on the way.
    """

    resume: tuple[str, str, Any] | None
    state: Any
    feed: Feed


def select_entry(
    definition: WorkflowDefinition[Any],
    *,
    stored: State,
    phase: str | None,
    revision: int,
    entries: tuple[InboxEntry, ...],
) -> Selection:
    """Pick the entry the segment resumes with (see the module docstring).

    Args:
        definition: the instance's workflow.
        stored: the stored state.
        phase: the stored phase (the wait state it halted at).
        revision: the stored revision.
        entries: the pending entries, oldest first.
    """
    judged: list[tuple[InboxEntry, Consumption]] = []
    at = phase or FINISH
    for index, entry in enumerate(entries):
        verdict = _verdict(definition, entry, at, revision)
        if isinstance(verdict, str):
            try:
                state = resume_state(decode_input(definition, entry.input), stored)
            except InvalidInputError as exc:
                judged.append((entry, _judged(entry, "refused", str(exc))))
                continue
            feed = Feed(entries[index + 1 :], current=entry, done=tuple(judged))
            return Selection(
                resume=(at, verdict, decode_payload(entry.payload)),
                state=state,
                feed=feed,
            )
        judged.append((entry, verdict))
    return Selection(resume=None, state=stored, feed=Feed(done=tuple(judged)))


def _verdict(
    definition: WorkflowDefinition[Any], entry: InboxEntry, phase: str, revision: int
) -> str | Consumption:
    """The event the entry fires from *phase*, or what becomes of it instead."""
    if phase == SCHEDULED:  # a delayed start: only its start timer starts it
        if entry.event == START_DUE and fired_timer(entry.event_id) is not None:
            return START_DUE
        return _judged(
            entry,
            "refused",
            "the instance had not started yet (start_later): send events once it "
            "has started",
        )
    stale = stale_timer(entry, phase=phase, revision=revision, moved=False)
    if stale is not None:
        return _judged(entry, "dropped", stale)
    if retry_of(entry) is not None:  # its effect's next attempt, at its state
        return RETRY_EVENT
    if timeout_of(entry) is not None:
        if entry.event in definition.events_from.get(phase, ()):
            return entry.event
        return _judged(
            entry, "dropped", f"state {phase!r} declares no such timeout any more"
        )
    if entry.expected_revision is not None and entry.expected_revision != revision:
        now = f"to revision {revision} (resume by id to continue from there)"
        return _judged(entry, "refused", moved_on(entry.expected_revision, now))
    try:
        return resolve_event(definition, phase, entry.event, entry.workflow_instance_id)
    except (TransitionError, AmbiguousEventError, InvalidInputError) as exc:
        return _judged(entry, "dropped", str(exc))
    except InstanceStateError as exc:
        return _judged(entry, "refused", str(exc))


def _judged(entry: InboxEntry, status: Any, detail: str) -> Consumption:
    return Consumption(seq=entry.seq, status=status, detail=detail[:1000])
