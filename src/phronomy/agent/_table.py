"""The executions this runtime started and still carries (its drivers)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, final

from phronomy.engine import ExecutionReceiver
from phronomy.errors import PhronomyInternalError

from ._plan import is_local

if TYPE_CHECKING:
    from collections.abc import Iterator

    from phronomy.engine import Host
    from phronomy.workflow import WorkflowClient, WorkflowCoordinator

    from ._driver import Driver

__all__ = ["ExecutionTable"]


@final
class ExecutionTable(ExecutionReceiver):
    """At most one driver per agent key in this runtime, found by key or by id.

    A receiver of the engine only so that shutdown settles the callers of the
    executions still waiting here; the executions' segments are the workflow
    coordinator's (they keep the runtime busy, not this table).
    """

    def __init__(
        self,
        engine: Host,
        *,
        workflows: WorkflowClient,
        coordinator: WorkflowCoordinator,
        capacity: int,
    ) -> None:
        """Create the table; at most *capacity* executions run at once."""
        super().__init__(engine)
        self.workflows = workflows
        self.coordinator = coordinator
        self.capacity = capacity
        self._by_key: dict[str, Driver] = {}
        self._by_id: dict[str, Driver] = {}
        self._plans: dict[str, int] = {}  # plan name -> executions of it here
        self._suspended = 0  # of those in _by_key

    def __contains__(self, agent_id: object) -> bool:
        """Whether the key has an execution here that has not ended."""
        return agent_id in self._by_key

    def __iter__(self) -> Iterator[Driver]:
        """The drivers (a snapshot)."""
        return iter(list(self._by_key.values()))

    def by_id(self, execution_id: str) -> Driver | None:
        """The driver of a live execution, or ``None``."""
        return self._by_id.get(execution_id)

    def by_key(self, agent_id: str) -> Driver | None:
        """The driver of the key's live execution, or ``None``."""
        return self._by_key.get(agent_id)

    @property
    def running(self) -> int:
        """Executions here that are not waiting for an approval."""
        return len(self._by_key) - self._suspended

    def suspended(self, driver: Driver, *, now: bool) -> None:
        """*driver*'s execution began (*now*) or stopped waiting for an approval."""
        if self._by_key.get(driver.agent_id) is driver:
            self._suspended += 1 if now else -1

    def add(self, driver: Driver) -> None:
        """Keep *driver* until its execution ends (the key is free again)."""
        self._by_key[driver.agent_id] = driver
        self._by_id[driver.execution_id] = driver
        name = driver.plan.name
        self._plans[name] = self._plans.get(name, 0) + 1
        self.coordinator.served.setdefault(name, driver.plan)

    def ended(self, driver: Driver) -> None:
        """*driver*'s execution ended here: its key is free; a plan no execution
        here uses any more that no other process can run is no longer served."""
        if self._by_key.get(driver.agent_id) is driver:
            if driver.status == "suspended":
                self._suspended -= 1
            del self._by_key[driver.agent_id]
        self._by_id.pop(driver.execution_id, None)
        name = driver.plan.name
        left = self._plans.get(name, 1) - 1
        if left:
            self._plans[name] = left
            return
        self._plans.pop(name, None)
        if is_local(driver.plan):
            self.coordinator.served.pop(name, None)

    # --- the receiver contract -----------------------------------------------------

    def idle(self) -> bool:
        """Always: the executions' segments keep the runtime busy, not the table."""
        return True

    def deliver(self, message: Any) -> None:
        """The table takes no messages.

        Raises:
            PhronomyInternalError: always.
        """
        raise PhronomyInternalError(f"unexpected execution message {message!r}")

    def shutdown(self, error: BaseException | None) -> None:
        """Settle every caller still waiting here (see :meth:`Driver.shutdown`)."""
        for driver in list(self._by_key.values()):
            driver.shutdown(error)
        self._by_key.clear()
        self._by_id.clear()
        self._suspended = 0

    def describe_live(self) -> list[str]:
        """The executions running here (for the shutdown report)."""
        return [
            f"execution {d.execution_id} of agent {d.agent_id} ({d.status})"
            for d in self._by_key.values()
            if d.status not in ("suspended", "recovery_required")
        ]
