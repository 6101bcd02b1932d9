"""Which event a ``send_event``/``resume`` fires from a halted phase (pure)."""

from __future__ import annotations

from typing import Any

from phronomy.errors import (
    AmbiguousEventError,
    EventRejectedError,
    InstanceStateError,
    InvalidInputError,
    TransitionError,
)

from ._definition import FINISH, WorkflowDefinition

__all__ = ["RESUME", "rejected", "resolve_event"]

RESUME = "resume"
"""Fires the one external event declared from the halted phase (unless the workflow
declares an event named ``resume`` from it); with several, the caller must name one."""


def resolve_event(
    definition: WorkflowDefinition[Any],
    phase: str,
    event: str,
    workflow_instance_id: str,
) -> str:
    """Return the event to fire from *phase*, or raise a clear error.

    Raises:
        InvalidInputError: the workflow declares no such event ("Unknown event ...
            Valid events: [...]").
        InstanceStateError: the instance is finished, or *phase* has no external event
            for ``resume`` ("No external event registered for state ...").
        AmbiguousEventError: ``resume`` at a phase with several external events.
        TransitionError: the event is declared, but not from *phase*.
    """
    if event != RESUME and not definition.has_event(event):
        raise InvalidInputError(
            f"Unknown event {event!r}. Valid events: {list(definition.external_events)}"
        )
    if phase == FINISH:
        raise InstanceStateError(
            f"workflow instance {workflow_instance_id!r} is finished; it accepts no events"
        )
    available = definition.events_from.get(phase, frozenset())
    if event == RESUME and RESUME not in available:
        candidates = definition.external_events_from(phase)
        if not candidates:
            raise InstanceStateError(
                f"No external event registered for state {phase!r}"
            )
        if len(candidates) > 1:
            raise AmbiguousEventError(
                f"resume() cannot choose at {phase!r} of workflow instance "
                f"{workflow_instance_id!r}: the state declares {list(candidates)}; "
                "name the event with send_event(workflow, event, ...)",
                candidates=candidates,
            )
        return candidates[0]
    if event not in available:
        raise TransitionError(
            f"Transition from {phase!r} via event {event!r} failed. "
            f"The event is not declared for the current state (it accepts {sorted(available)})."
        )
    return event


def rejected(
    workflow: str, instance: str, phase: str, event: str, revision: int | None
) -> EventRejectedError:
    """The error of a resume event that every guard rejected at *phase*."""
    where = f"revision {revision}" if revision is not None else "not durable"
    return EventRejectedError(
        f"event {event!r} was rejected by every guard at {phase!r} (workflow "
        f"{workflow!r}, instance {instance!r}, {where}); nothing changed and the "
        "instance can take another event",
        instance_id=instance,
        event=event,
        phase=phase,
        revision=revision,
    )
