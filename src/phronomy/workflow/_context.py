"""What the workflow coordinator's parts see of it, and of each other.

The coordinator (``_coordinator.py``) owns the shared state of one runtime's workflows
and four cooperating parts, plain objects that each hold a reference to it:
``Segments`` (a segment from its command to its caller), ``InboxRouter`` (posts, the
poll, who applies a stored entry), ``Settlement`` (whoever waits for an entry hears
what became of it) and ``CancelRequests`` (a cancel, here or through the row). The
parts call each other through these protocols, so that no part module imports
another that imports it back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable

    from phronomy._telemetry import Telemetry
    from phronomy.durability import DurabilityService
    from phronomy.engine import Host, ResultHandle
    from phronomy.instance import Sessions
    from phronomy.storage import Consumption, InboxEntry, Lease

    from ._claims import Command, Loaded
    from ._continuations import WorkflowInstance, WorkflowInstances, WorkflowOutput
    from ._definition import WorkflowDefinition
    from ._hydration import DurableBase
    from ._inbox import Feed
    from ._messages import (
        CancelCommand,
        EventCounters,
        ResumeCommand,
        StartCommand,
        WorkflowResult,
    )
    from ._retries import RetryPolicy
    from ._session import WorkflowSession
    from ._state import State
    from ._waiters import Waiters
    from ._watch import Watchers

__all__ = ["Coordination"]


class Carries(Protocol):
    """The carrier of the instance protocol's outputs (``Carrier``)."""

    def carry(
        self,
        instance: WorkflowInstance,
        outputs: list[WorkflowOutput],
        *,
        start: Callable[[WorkflowSession[Any]], object] | None = None,
    ) -> None: ...


class Runs(Protocol):
    """What the other parts ask of ``Segments``."""

    def begin(self, cmd: Command) -> None: ...

    def register(
        self,
        cmd: Command,
        instance: WorkflowInstance,
        state: State,
        *,
        base: DurableBase | None,
        resume: tuple[str, str, Any] | None,
        claim: tuple[Lease, float] | None = None,
        feed: Feed | None = None,
    ) -> None: ...


class Routes(Protocol):
    """What the other parts ask of ``InboxRouter``."""

    polls: int

    def offer(
        self,
        session: WorkflowSession[Any],
        entries: list[InboxEntry],
        *,
        complete: bool = False,
    ) -> None: ...

    def drain(
        self, definition: WorkflowDefinition[Any], iid: str, *, polled: bool = False
    ) -> None: ...

    def post_to_live(self, cmd: StartCommand | ResumeCommand) -> None: ...

    def resume_from_inbox(
        self,
        cmd: ResumeCommand,
        instance: WorkflowInstance,
        loaded: Loaded,
        claim: tuple[Lease, float] | None,
    ) -> None: ...

    def posted(self, cmd: StartCommand, loaded: Loaded) -> Any: ...

    def announce_start(self, cmd: StartCommand, loaded: Loaded) -> None: ...


class Settles(Protocol):
    """What the other parts ask of ``Settlement``."""

    def settled(
        self, feed: Feed, phase: str | None, revision: int, *, drain: ResumeCommand
    ) -> None: ...

    def judged(self, entry: InboxEntry, consumption: Consumption) -> None: ...

    @property
    def on_judged(self) -> Callable[[InboxEntry, Consumption], None]: ...

    def judged_before(self, entry: InboxEntry) -> None: ...

    def check_applied(self, checked: list[tuple[tuple[str, str], Any]]) -> None: ...

    def segment_applied(
        self,
        definition: WorkflowDefinition[Any],
        session: WorkflowSession[Any],
        result: WorkflowResult[Any],
    ) -> None: ...

    def segment_failing(
        self, session: WorkflowSession[Any], error: BaseException
    ) -> tuple[Consumption, ...]: ...

    def segment_ended(
        self,
        definition: WorkflowDefinition[Any],
        session: WorkflowSession[Any],
        error: BaseException,
    ) -> None: ...


class Cancels(Protocol):
    """What the carrier asks of ``CancelRequests`` (a cancel that waited runs)."""

    def cancel(self, cmd: CancelCommand) -> None: ...


class Coordination(Protocol):
    """The workflow coordinator as its parts see it (on the dispatcher)."""

    @property
    def engine(self) -> Host: ...
    @property
    def gateway(self) -> DurabilityService | None: ...
    @property
    def instances(self) -> WorkflowInstances: ...
    @property
    def sessions(self) -> Sessions[WorkflowSession[Any]]: ...
    @property
    def carrier(self) -> Carries: ...
    @property
    def waiters(self) -> Waiters: ...
    @property
    def watchers(self) -> Watchers: ...
    @property
    def counters(self) -> EventCounters: ...
    @property
    def served(self) -> dict[str, WorkflowDefinition[Any]]: ...
    @property
    def stuck(self) -> dict[str, tuple[int, float]]: ...
    @property
    def retry(self) -> RetryPolicy | None: ...
    @property
    def recursion_limit(self) -> int: ...
    @property
    def max_snapshot_bytes(self) -> int: ...
    @property
    def telemetry(self) -> Telemetry | None: ...
    @property
    def segments(self) -> Runs: ...
    @property
    def inbox(self) -> Routes: ...
    @property
    def settlement(self) -> Settles: ...
    @property
    def cancels(self) -> Cancels: ...

    def post_message(
        self,
        message: Any,
        *,
        admission: bool = False,
        completion: ResultHandle[Any] | None = None,
    ) -> bool: ...

    def admit(self) -> None: ...
