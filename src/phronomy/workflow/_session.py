"""The live workflow session: carries out what the machine decides, on the dispatcher."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from phronomy.engine import Event, GatedSession
from phronomy.errors import EventRejectedError

from ._checkpoint import intercept
from ._definition import AFTER_PREFIX, FINISH, START_EVENT
from ._effects import CANCEL_READY, EFFECT_FAILED, RETRY_WAIT, EffectRunner
from ._events import rejected
from ._machine import WorkflowMachine
from ._messages import (
    EventCounters,
    EventOutcome,
    Step,
    WorkflowResult,
)
from ._retries import RETRY_EVENT, RetryPolicy
from ._state import State
from ._steps import Steps
from ._timeouts import halt_timers

if TYPE_CHECKING:
    from collections.abc import Callable

    from phronomy._telemetry import SegmentTrace
    from phronomy.durability import HeldLease
    from phronomy.engine import Host, TerminalPolicy, TerminalType
    from phronomy.storage import InboxEntry, Lease

    from ._checkpoint import Checkpoint
    from ._claims import Command
    from ._definition import WorkflowDefinition
    from ._effects import RetryWait
    from ._hydration import DurableBase
    from ._inbox import Feed
    from ._timeouts import TimerChanges
    from ._watch import Watchers

__all__ = ["WorkflowSession"]

logger = logging.getLogger(__name__)

S = TypeVar("S", bound=State)


class WorkflowSession(GatedSession, Generic[S]):
    """One segment of one workflow instance, run on the dispatcher.

    Fresh mode runs the entry point's entry actions, then follows the machine; resume
    mode positions the machine at the halted phase and fires the resume event (the
    entry point's actions do not run again). Automatic transitions run inline, in the
    same dispatch, after the stable state before them was published.
    """

    __slots__ = (
        "_effects",
        "_retry",
        "_retry_wait",
        "_started",
        "_terminal",
        "cancel_reason",
        "cancelling",
        "checkpoint",
        "counters",
        "definition",
        "feed",
        "lease",
        "machine",
        "observer",
        "persistence",
        "phase",
        "resume",
        "revision",
        "segment",
        "steps",
        "trace",
        "watchers",
        "workflow_instance_id",
    )

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
        counters: EventCounters | None = None,
        watchers: Watchers | None = None,
        lease: HeldLease | None = None,
        feed: Feed | None = None,
        retry: RetryPolicy | None = None,
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
            counters: where live events are counted (the runtime's statistics).
            watchers: who watches instances (``runtime.workflows.watch``).
            lease: the lease a durable segment holds: once it lapsed, nothing of the
                segment runs any more.
            feed: a durable segment's inbox entries: its resume event (the feed's
                current entry) and the events it applies while it waits.
            retry: the runtime's retry policy of effects that name none.
        """
        super().__init__(engine, terminal_policy=policy)
        self.machine = WorkflowMachine(
            definition,
            state,
            recursion_limit=recursion_limit,
            phase=resume[0] if resume is not None else None,
        )
        self.definition = definition
        self.workflow_instance_id = workflow_instance_id
        self.revision = revision
        self.observer = observer
        self.resume = resume
        self.phase: str | None = resume[0] if resume is not None else None
        self._retry = retry
        self._effects: EffectRunner | None = None  # made when it runs its first
        self.cancel_reason: str | None = None
        self._terminal: TerminalType = "finished"
        self.cancelling = False
        self.counters = counters if counters is not None else EventCounters()
        self.watchers = watchers
        self.lease = lease
        self.feed = feed
        self._started = False
        self._retry_wait: RetryWait | None = None  # halted until an effect's next try
        self.trace: SegmentTrace | None = None  # the segment's span (telemetry on)
        self.persistence = policy
        self.checkpoint: Checkpoint | None = None  # a checkpoint save in flight
        self.segment: (
            tuple[Command, DurableBase | None, tuple[Lease, float] | None] | None
        ) = None
        """What its coordinator ends the segment with (its command, base, claim)."""
        self.steps = Steps(self)
        """Carries out the machine's steps (effects, automatic transitions, the feed)."""

    def __repr__(self) -> str:
        return (
            f"<WorkflowSession {self.definition.name} instance={self.workflow_instance_id!r} "
            f"at={self.machine.current!r} {self.lifecycle}>"
        )

    @property
    def state(self) -> S:
        """The current state value."""
        return self.machine.state

    @property
    def effects(self) -> EffectRunner:
        """What runs the segment's effects and timeouts (made at its first use)."""
        effects = self._effects
        if effects is None:
            effects = self._effects = EffectRunner(
                self.host,
                self.sink.post,
                instance=self.workflow_instance_id,
                durable=self.feed is not None,
                default_retry=self._retry,
            )
            effects.trace = self.trace
        return effects

    @property
    def effects_started(self) -> EffectRunner | None:
        """The segment's effect runner, if anything used it (else nothing runs)."""
        return self._effects

    # --- GatedSession hooks -------------------------------------------------------------

    def start(self) -> None:
        """Run the entry actions (fresh) or fire the resume event, then carry on.

        A resume event that every guard rejects ends the segment at once with
        :class:`~phronomy.EventRejectedError`: nothing ran, nothing is saved, and the
        instance stays halted where it was. A segment cancelled before it started runs
        nothing: it ends as cancelled where it stands.
        """
        self._started = True
        if self.cancelling or self.lapsed():
            return
        try:
            if self.resume is None:
                start = Event(type=START_EVENT, target_id=self.id)
                self.steps.carry_out(self.machine.start(start), self)
                return
            phase, event, payload = self.resume
            if event == RETRY_EVENT:  # an effect's next attempt, at its state
                if self.feed is not None:
                    self.feed.record("transitioned")
                self.steps.relaunch(payload, self)
                return
            if self.trace is not None:
                self.trace.resuming(event, phase, self.feed)
            step = self.machine.resume(
                Event(type=event, target_id=self.id, payload=payload)
            )
            if self.trace is not None:
                self.trace.after(step.next, step.current)
            if step.next == "rejected":
                if self.feed is not None:
                    self.feed.record("rejected", "every guard rejected it")
                self.finish_with_error(
                    rejected(
                        self.definition.name,
                        self.workflow_instance_id,
                        phase,
                        event,
                        self.revision,
                    )
                )
            else:
                if self.feed is not None:
                    self.feed.record("transitioned")
                self.steps.carry_out(step, self)
        except Exception as exc:  # noqa: BLE001 - the segment's failure, for its caller
            self.finish_with_error(exc)

    def offer(
        self,
        entries: list[InboxEntry] | tuple[InboxEntry, ...],
        *,
        complete: bool = False,
    ) -> None:
        """Take newly stored inbox entries of the instance: a segment that waits for
        events applies them at once, in order (each is consumed with its end); see
        :meth:`~phronomy.workflow._inbox.Feed.offer` for *complete*."""
        if self.feed is None:
            return
        self.feed.offer(entries, complete=complete)
        if self._started:
            try:
                self.steps.apply_feed(self)
            except Exception as exc:  # noqa: BLE001 - the segment's failure
                self.finish_with_error(exc)

    def handle(self, event: Event) -> None:
        """Route *event* (see :class:`~phronomy.lowlevel.GatedSession`), unless the
        segment's lease lapsed: then the segment stops before anything of it runs
        (no action, guard, effect or event), whatever was queued for it."""
        if self.lapsed():
            if event.caller is not None:
                event.caller.complete(None)
            return
        super().handle(event)

    def lapsed(self) -> bool:
        """A running segment whose lease lapsed stops here (its terminal save, if one
        is in flight, is fenced by the store, which decides)."""
        lease = self.lease
        if lease is None or self.done or self.lifecycle != "running":
            return False
        if not lease.lapsed():
            return False
        self.finish_with_error(lease.lost(taken=False))
        return True

    def handle_live(self, event: Event) -> None:
        """Handle an event: an effect's failure fails the segment, others go to the
        machine (the state's hook, then the transition); none while a checkpoint
        save is in flight (they wait for it)."""
        if self.checkpoint is not None and intercept(self, event):
            return
        if event.type == CANCEL_READY:
            self.request_terminal("cancelled", notify_stable=False)
            return
        if self.cancelling:  # no more events: the segment ends as cancelled
            if event.caller is not None:
                event.caller.complete(None)
            return
        if event.type == EFFECT_FAILED:
            raise event.payload
        if event.type == RETRY_WAIT:  # the only running effect waits for its next try
            self._retry_wait = event.payload
            self.request_terminal("halted", notify_stable=True)
            return
        if (
            event.type.startswith(AFTER_PREFIX)
            and event.payload != self.machine.entered
        ):
            return  # the live timeout of a visit the segment has left
        status = self.steps.apply(event, self)
        if event.caller is not None:
            event.caller.complete(
                EventOutcome(
                    workflow_instance_id=self.workflow_instance_id,
                    event=event.type,
                    status=status,
                    phase=self.machine.current,
                )
            )

    def cancel(self, reason: str | None) -> bool:
        """Stop taking events, cancel the effects' trio work, and once every effect
        has physically finished, end as ``cancelled`` (saved, for durable segments).

        Returns:
            Whether the segment was live and is now cancelling.
        """
        if self.done or self.lifecycle != "running" or self.cancelling:
            return False
        self.cancelling = True
        self.cancel_reason = reason
        post = self.sink.post
        if self._effects is None:  # nothing ever ran: quiescent now
            post(CANCEL_READY)
        else:
            self._effects.when_quiescent(lambda: post(CANCEL_READY))
        return True

    def finish_with_error(self, error: BaseException) -> None:
        """End the segment with *error*, noting which instance and state it ended in."""
        if not self.done and not isinstance(error, EventRejectedError):
            error.add_note(
                f"phronomy: workflow {self.definition.name!r} instance "
                f"{self.workflow_instance_id!r} failed at state {self.machine.current!r}"
            )
        super().finish_with_error(error)

    def prepare_terminal(self, terminal_type: TerminalType) -> None:
        """Set the phase before any snapshot: FINISH, or the state it stopped at."""
        self._terminal = terminal_type
        self.phase = FINISH if terminal_type == "finished" else self.machine.current

    def terminal_value(
        self,
    ) -> tuple[S, str | None, str | None, tuple[Any, ...], TimerChanges]:
        """What the terminal policy saves: the state, its phase, a note (the reason of
        a cancellation), the inbox entries the segment consumes, and the timers it
        arms and disarms (a durable segment that halts).

        Raises:
            SerializationError: a pending timer's payload cannot be stored.
        """
        reason = self.cancel_reason
        detail = None
        if self._terminal == "cancelled":
            detail = f"cancelled: {reason}" if reason else "cancelled"
        feed = self.feed
        if feed is None:
            return self.machine.state, self.phase, detail, (), ((), ())
        if feed.current is not None:  # the entry whose transition ended the segment
            feed.record("transitioned")
        timers: TimerChanges = ((), ())
        if self._terminal == "halted" and self.phase is not None:
            wait, effects = self._retry_wait, self._effects
            timers = halt_timers(
                self.definition,
                phase=self.phase,
                resumed_from=None if self.resume is None else self.resume[0],
                moved=self.machine.entered > 0,
                pending=[] if effects is None else effects.pending_timers(),
                touched=() if effects is None else effects.touched,
                instance=self.workflow_instance_id,
                timeouts_left=(
                    None
                    if effects is None
                    else effects.timeouts_left(self.machine.entered)
                ),
                retry=None if wait is None else wait.stored(),
                restart=self.resume is None and bool(self.revision),
            )
        return self.machine.state, self.phase, detail, feed.consumed, timers

    def terminal_result(self, revision: int | None) -> WorkflowResult[S]:
        """The caller's result: the state, phase and revision (the saved one, if any;
        ``None`` for a segment without a store)."""
        assert self.phase is not None
        status = self._terminal
        return WorkflowResult(
            state=self.machine.state,
            phase=self.phase,
            workflow_instance_id=self.workflow_instance_id,
            revision=revision if revision is not None else self.revision,
            halted=status == "halted",
            workflow=self.definition.name,
            status=status,
        )

    def notify_terminal_stable(self) -> None:
        """Publish the halted (or declared-leaf) state once the terminal save succeeded."""
        self.steps.notify_observer(self)

    def on_done(self) -> None:
        """Cancel the segment's effects and live timeouts."""
        effects = self._effects
        if effects is not None:
            effects.close()
            effects.run_timeouts(None)
