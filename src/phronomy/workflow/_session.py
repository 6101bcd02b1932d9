"""The live workflow session: the dispatcher-side I/O adapter of the machine (spec §2.8)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, cast

from phronomy.engine import Event, GatedSession
from phronomy.errors import (
    EventRejectedError,
    RuntimeShutdownError,
    TransitionError,
)

from . import _machine as machine
from ._definition import AUTO_EVENT, FINISH, START_EVENT
from ._effects import EFFECT_FAILED, Effects
from ._messages import SegmentResult, Step
from ._state import State

if TYPE_CHECKING:
    from collections.abc import Callable

    from phronomy.engine import Host, TerminalPolicy, TerminalType

    from ._definition import WorkflowDefinition

__all__ = ["WorkflowSession"]

S = TypeVar("S", bound=State)


class WorkflowSession(GatedSession, Generic[S]):
    """One segment of one workflow instance, run on the dispatcher.

    Fresh mode runs the entry point's entry actions, then the decision table; resume
    mode positions the machine at the halted phase and fires the resume event (the
    entry point's actions do not run again).
    """

    def __init__(
        self,
        engine: Host,
        definition: WorkflowDefinition[S],
        state: S,
        *,
        workflow_instance_id: str,
        recursion_limit: int,
        revision: int | None,
        policy: TerminalPolicy | None = None,
        observer: Callable[[Step[S]], object] | None = None,
        resume: tuple[str, str, Any] | None = None,
        on_park: Callable[[], None] | None = None,
    ) -> None:
        """Create a session (runtime internal).

        Args:
            engine: the engine it runs on.
            definition: the compiled workflow.
            state: the starting state.
            workflow_instance_id: the instance id.
            recursion_limit: transitions allowed in this segment.
            revision: the durable revision the segment started from.
            policy: the terminal persistence policy of durable segments.
            observer: called with each stable :class:`Step`.
            resume: ``(phase, event, payload)`` to resume from a halted phase.
            on_park: called once, the first time the segment stops at a state that
                waits for a signal or an effect (durable segments mark themselves
                ``running`` in the store then).
        """
        super().__init__(engine, terminal_policy=policy)
        self.definition = definition
        self.state = state
        self.workflow_instance_id = workflow_instance_id
        self.recursion_limit = recursion_limit
        self.revision = revision
        self.observer = observer
        self.resume = resume
        self.current = resume[0] if resume is not None else definition.entry_point
        self.phase: str | None = resume[0] if resume is not None else None
        self.steps = 0
        self.effects = Effects(self)
        self._on_park = on_park
        self.parked = False

    def __repr__(self) -> str:
        return (
            f"<WorkflowSession {self.definition.name} instance={self.workflow_instance_id!r} "
            f"at={self.current!r} {self.lifecycle}>"
        )

    # --- GatedSession hooks -------------------------------------------------------------

    def start(self) -> None:
        """Run the entry actions (fresh) or fire the resume event, then advance.

        A resume event that every guard rejects ends the segment at once with
        :class:`~phronomy.EventRejectedError`: nothing ran, nothing is saved, and the
        instance stays halted where it was.
        """
        try:
            if self.resume is not None:
                phase, event, payload = self.resume
                if not self._fire(
                    Event(type=event, target_id=self.id, payload=payload)
                ):
                    self.finish_with_error(self._rejected(phase, event))
            else:
                start = Event(type=START_EVENT, target_id=self.id)
                entered = machine.enter(
                    self.definition, self.current, self.state, start, self.effects
                )
                self.state = cast("S", entered)
                self._advance()
        except Exception as exc:  # noqa: BLE001 - the segment's failure, for its caller
            self.finish_with_error(exc)

    def handle_live(self, event: Event) -> None:
        """Handle an event: the state's hook, then the transition (spec §2.8.3)."""
        if event.type == EFFECT_FAILED:
            raise event.payload
        if event.type != AUTO_EVENT:
            hook = machine.apply_hook(self.definition, self.current, self.state, event)
            self.state = cast("S", hook.state)
            if hook.consumed:
                return
        self._fire(event)

    def finish_with_error(self, error: BaseException) -> None:
        """End the segment with *error*, noting which instance and state it ended in."""
        if not self.done and not isinstance(error, EventRejectedError):
            error.add_note(
                f"phronomy: workflow {self.definition.name!r} instance "
                f"{self.workflow_instance_id!r} failed at state {self.current!r}"
            )
        super().finish_with_error(error)

    def prepare_terminal(self, terminal_type: TerminalType) -> None:
        """Set the phase before any snapshot: FINISH, or the wait state's name."""
        self.phase = FINISH if terminal_type == "finished" else self.current

    def terminal_value(self) -> tuple[S, str | None]:
        """What the terminal policy saves: the state and its phase."""
        return self.state, self.phase

    def terminal_result(self, revision: int | None) -> SegmentResult:
        """The state, phase and revision (the saved one, if any) for the caller."""
        assert self.phase is not None
        return SegmentResult(
            state=self.state,
            phase=self.phase,
            revision=revision if revision is not None else self.revision,
        )

    def notify_terminal_stable(self) -> None:
        """Publish the halted (or declared-leaf) state once the terminal save succeeded."""
        self._notify()

    def on_done(self) -> None:
        """Cancel the segment's effects."""
        self.effects.close()

    # --- the machine loop -------------------------------------------------------------

    def _rejected(self, phase: str, event: str) -> EventRejectedError:
        where = (
            f"revision {self.revision}" if self.revision is not None else "not durable"
        )
        return EventRejectedError(
            f"event {event!r} was rejected by every guard at {phase!r} "
            f"(workflow {self.definition.name!r}, instance "
            f"{self.workflow_instance_id!r}, {where}); nothing changed and the instance "
            "can take another event",
            workflow_instance_id=self.workflow_instance_id,
            event=event,
            phase=phase,
            revision=self.revision,
        )

    def _fire(self, event: Event) -> bool:
        """Fire *event*; ``False`` when every guard rejected it (nothing ran)."""
        if self.steps >= self.recursion_limit:
            raise TransitionError(f"Recursion limit ({self.recursion_limit}) exceeded")
        fired = machine.fire(
            self.definition, self.current, self.state, event, self.effects
        )
        if fired is None:
            return False  # every guard rejected: no step consumed
        self.state = cast("S", fired.state)
        self.current = fired.transition.target
        self.steps += 1
        self._advance()
        return True

    def _advance(self) -> None:
        decision: Literal["finish", "halt", "auto", "wait", "leaf"] = machine.decide(
            self.definition, self.current
        )
        match decision:
            case "finish":
                self.request_terminal("finished", notify_stable=False)
            case "halt":
                self.request_terminal("halted", notify_stable=True)
            case "auto":
                self._notify()
                if not self.sink.post(AUTO_EVENT):
                    raise RuntimeShutdownError(
                        f"the runtime rejected {AUTO_EVENT} for workflow instance "
                        f"{self.workflow_instance_id!r}"
                    )
            case "wait":
                self._notify()
                if not self.parked:
                    self.parked = True
                    if self._on_park is not None:
                        self._on_park()
            case "leaf":
                self.request_terminal("finished", notify_stable=True)

    def _notify(self) -> None:
        if self.observer is None:
            return
        step = Step(
            name=self.current,
            state=self.state,
            workflow_instance_id=self.workflow_instance_id,
        )
        try:
            self.observer(step)
        except Exception as exc:
            exc.add_note(
                f"phronomy: raised by the on_step observer at state {self.current!r}"
            )
            raise
