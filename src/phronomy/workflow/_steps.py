"""How a workflow session carries out its machine's steps (its ``Steps`` part): the
effects, the automatic transitions, the stable states it publishes, the timeouts of
the state it waits in, and the inbox entries it applies while it waits."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol, final

import msgspec

from phronomy.engine import Event
from phronomy.errors import PhronomyError

from ._checkpoint import try_checkpoint
from ._definition import AUTO_EVENT, after_event
from ._events import resolve_event
from ._hydration import resume_state
from ._inbox import decode_input, decode_payload, moved_on
from ._machine import MachineStep, decide
from ._messages import EventCounters, InstanceUpdate, Step
from ._retries import StoredEffect
from ._timeouts import retry_of, stale_timer, timeout_of

if TYPE_CHECKING:
    from collections.abc import Callable

    from phronomy._telemetry import SegmentTrace
    from phronomy.engine import TerminalType
    from phronomy.storage import InboxEntry

    from ._checkpoint import Checkpoint
    from ._definition import WorkflowDefinition
    from ._effects import EffectRunner
    from ._inbox import Feed
    from ._machine import WorkflowMachine
    from ._messages import EventStatus
    from ._watch import Watchers

__all__ = ["Steps"]

logger = logging.getLogger(__name__)


class Stepped(Protocol):
    """What ``Steps`` needs of its session (``WorkflowSession``)."""

    @property
    def id(self) -> str: ...
    @property
    def machine(self) -> WorkflowMachine[Any]: ...
    @property
    def definition(self) -> WorkflowDefinition[Any]: ...
    @property
    def effects(self) -> EffectRunner: ...
    @property
    def effects_started(self) -> EffectRunner | None: ...
    @property
    def feed(self) -> Feed | None: ...
    @property
    def revision(self) -> int | None: ...
    @property
    def workflow_instance_id(self) -> str: ...
    @property
    def lifecycle(self) -> str: ...
    @property
    def done(self) -> bool: ...
    @property
    def cancelling(self) -> bool: ...
    @property
    def counters(self) -> EventCounters: ...
    @property
    def watchers(self) -> Watchers | None: ...
    @property
    def observer(self) -> Callable[[Step[Any]], object] | None: ...
    @property
    def trace(self) -> SegmentTrace | None: ...
    @property
    def checkpoint(self) -> Checkpoint | None: ...

    def lapsed(self) -> bool: ...

    def request_terminal(
        self, terminal_type: TerminalType, *, notify_stable: bool
    ) -> None: ...


@final
class Steps:
    """Carries out the machine's steps for one session (on the dispatcher)."""

    __slots__ = ("_auto", "_feeding")

    def __init__(self, session: Stepped) -> None:
        """Carry out for *session*, which holds this object and passes itself to each
        call: no reference back, so that a segment's objects are freed when it ends,
        not by the cyclic garbage collector (a cycle per segment cost a collection's
        work per run)."""
        self._feeding = False
        self._auto: Event | None = None  # made at the first automatic transition

    def carry_out(self, step: MachineStep, session: Stepped) -> None:
        """Launch the step's effects and follow it (automatic transitions inline)."""
        while True:
            if step.intents:
                session.effects.launch(step.intents)
            match step.next:
                case "auto":
                    self.publish(session)
                    if (trace := session.trace) is not None:
                        trace.before(AUTO_EVENT, session.machine.current)
                    auto = self._auto
                    if auto is None:
                        auto = self._auto = Event(type=AUTO_EVENT, target_id=session.id)
                    step = session.machine.advance(auto)
                    if trace is not None:
                        trace.after(step.next, step.current)
                    continue
                case "wait":
                    self.publish(session)
                    self._run_timeouts(session)
                    self.apply_feed(session)
                case "finish":
                    session.request_terminal("finished", notify_stable=False)
                case "halt":
                    if not (session.definition.checkpoints and try_checkpoint(session)):
                        session.request_terminal("halted", notify_stable=True)
                case "leaf":
                    session.request_terminal("finished", notify_stable=True)
                case "consumed" | "rejected" | "dropped":
                    pass  # a live event the hook consumed, guards rejected, or undeclared
            return

    def apply(self, event: Event, session: Stepped) -> EventStatus:
        """Hand *event* to the machine, carry the step out, and say what it did."""
        if (trace := session.trace) is not None:
            trace.before(event.type, session.machine.current)
        step = session.machine.handle(event)
        if trace is not None:
            trace.after(step.next, step.current)
        counters = session.counters
        match step.next:
            case "rejected":
                status: EventStatus = "rejected"
                counters.rejected += 1
            case "dropped" | "consumed":
                status = "dropped"
                counters.dropped += 1
                if step.next == "dropped":
                    logger.warning(
                        "workflow %r instance %r dropped event %r: state %r does not "
                        "declare it (on_unhandled_event='drop')",
                        session.definition.name,
                        session.workflow_instance_id,
                        event.type,
                        step.current,
                    )
            case _:
                status = "transitioned"
                counters.transitioned += 1
        self.carry_out(step, session)
        return status

    def _run_timeouts(self, session: Stepped) -> None:
        """Run the timeouts of the state the segment waits in (a new visit's)."""
        machine = session.machine
        delays = session.definition.timeouts.get(machine.current, ())
        effects = session.effects_started
        if delays or (effects is not None and effects.timing):  # (else none run)
            session.effects.run_timeouts(machine.entered, delays, after_event)

    def relaunch(self, payload: Any, session: Stepped) -> None:
        """Run the next attempt of an effect a retry timer stored, and wait at its
        state as the segment that started it did (its stored timeouts run)."""
        session.effects.run_timeouts(session.machine.entered, ())  # its stored ones run
        session.effects.relaunch(msgspec.convert(payload, StoredEffect))
        current = session.machine.current
        self.carry_out(
            MachineStep(next=decide(session.definition, current), current=current),
            session,
        )

    def apply_feed(self, session: Stepped) -> None:
        """Apply the feed's entries in order while the segment waits for events."""
        feed = session.feed
        if feed is None or self._feeding:
            return  # an outer call goes on with the next entry
        self._feeding = True
        try:
            while (
                session.lifecycle == "running"
                and not session.done
                and not session.cancelling
                and session.checkpoint is None
                and not session.lapsed()
                and (entry := feed.take()) is not None
            ):
                if session.trace is None:
                    self._apply_entry(feed, entry, session)
                else:
                    with session.trace.consuming(entry):
                        self._apply_entry(feed, entry, session)
        finally:
            self._feeding = False

    def _apply_entry(self, feed: Feed, entry: InboxEntry, session: Stepped) -> None:
        machine = session.machine
        stale = stale_timer(
            entry,
            phase=machine.current,
            revision=session.revision,
            moved=machine.entered > 0,
            touched=session.effects.touched,
        )
        if stale is not None:
            feed.record("dropped", stale)
            return
        if timeout_of(entry) is not None:  # its visit: the timeout fires
            status = self.apply(Event(type=entry.event, target_id=session.id), session)
            feed.record("dropped" if status == "not_live" else status)
            return
        if retry_of(entry) is not None:  # its visit: the effect's next attempt
            feed.record("transitioned")
            self.relaunch(decode_payload(entry.payload), session)
            return
        if entry.expected_revision is not None:
            # sent with a halted result: only a segment resuming from that revision
            # applies it (as its first event), never one that moved on from it
            now = "(a live segment took it over) before it was applied"
            feed.record("refused", moved_on(entry.expected_revision, now))
            return
        try:
            event_type = resolve_event(
                session.definition,
                machine.current,
                entry.event,
                session.workflow_instance_id,
            )
            overlay = decode_input(session.definition, entry.input)
        except (PhronomyError, ValueError) as exc:
            feed.record("dropped", str(exc)[:1000])
            return
        if overlay.fields:
            machine.state = resume_state(overlay, machine.state)
        event = Event(
            type=event_type, target_id=session.id, payload=decode_payload(entry.payload)
        )
        status = self.apply(event, session)
        feed.record("dropped" if status == "not_live" else status)

    def publish(self, session: Stepped) -> None:
        """A stable state on the way (automatic, or waiting for an event)."""
        watchers = session.watchers
        iid = session.workflow_instance_id
        if watchers is not None and watchers.watched(iid):
            watchers.publish(
                InstanceUpdate(
                    workflow_instance_id=iid,
                    status="running",
                    phase=session.machine.current,
                    state=session.machine.state,
                    revision=session.revision,
                )
            )
        if session.observer is not None:
            self.notify_observer(session)

    def notify_observer(self, session: Stepped) -> None:
        """Call the session's ``on_step`` observer with the stable state."""
        if session.observer is None:
            return
        current = session.machine.current
        step = Step(
            phase=current,
            state=session.machine.state,
            workflow_instance_id=session.workflow_instance_id,
        )
        try:
            session.observer(step)
        except Exception as exc:
            exc.add_note(
                f"phronomy: raised by the on_step observer at state {current!r}"
            )
            raise
