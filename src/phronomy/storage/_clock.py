"""The clocks of the stores: the wall clock for what people read, a lease clock for
lease expiries, and a watch that notices when a lease clock steps.

Lease expiries are compared by every process that shares a store. On one machine
(SQLite, or a MemoryStore in one process) they come from Linux's ``CLOCK_MONOTONIC``:
every process of one boot reads the same clock, a step of the wall clock (an operator,
NTP stepping a large offset) does not move it, and the runtime measures its own lease
margin on that same clock (trio's clock), so the two agree exactly. It excludes time the
machine spent suspended (every process was suspended too: no lease expires by it).
The clock starts again at each boot, so a database records which boot its expiries
belong to (:data:`LEASE_CLOCK_ID`, from the kernel's boot id); a store that finds
another one counts every stored lease as expired. Without a boot id (not Linux, or no
``/proc``) the lease clock is the wall clock, whose steps move lease expiries.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import TYPE_CHECKING, NamedTuple, final

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "LEASE_CLOCK_ID",
    "WALL_CLOCK_ID",
    "StepWatch",
    "StoreClock",
    "lease_clock",
    "lease_ms",
    "monotonic_ms",
    "wall_ms",
]

logger = logging.getLogger(__name__)

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
WALL_CLOCK_ID = 0
"""The lease clock id of a machine without a boot id: expiries on the wall clock."""


def wall_ms() -> int:
    """Wall-clock milliseconds: the timestamps people read (created, updated, saved)."""
    return time.time_ns() // 1_000_000


def monotonic_ms() -> int:
    """The monotonic clock in milliseconds: on Linux ``CLOCK_MONOTONIC``, the same in
    every process of one boot (and trio's clock)."""
    return time.monotonic_ns() // 1_000_000


def lease_clock(
    platform: str = sys.platform, boot_id_path: str = BOOT_ID_PATH
) -> tuple[int, Callable[[], int]]:
    """This machine's lease clock: its id (60 bits of the boot id, or
    :data:`WALL_CLOCK_ID`) and the function that reads it in milliseconds."""
    if not platform.startswith("linux"):
        return WALL_CLOCK_ID, wall_ms
    try:
        with open(boot_id_path, encoding="ascii") as file:
            digits = file.read().strip().replace("-", "")
        boot = int(digits[:15], 16)
    except (OSError, ValueError):
        return WALL_CLOCK_ID, wall_ms
    return boot or 1, monotonic_ms


LEASE_CLOCK_ID, lease_ms = lease_clock()
"""The id of this machine's lease clock (stored with the expiries) and its reading."""


@final
class StepWatch:
    """Warns when a store's lease clock steps against this process's monotonic clock.

    Each lease renewal reports the lease clock's reading (the expiry it wrote minus the
    TTL) with the monotonic times just before and after the statement. Between two
    renewals both clocks advance alike, within the statements' durations, a drift of
    0.1 % and :attr:`threshold_ms`; a larger difference is logged once, with its size.
    It only observes: leases are decided by the store's clock alone.
    """

    drift = 0.001
    threshold_ms = 1000

    def __init__(
        self,
        clock: str,
        monotonic_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        """Watch the lease clock *clock* (its name in the warning)."""
        self.clock = clock
        self.monotonic_ns = monotonic_ns
        self._lock = threading.Lock()
        self._last: tuple[int, int, int] | None = None

    def observe(self, lease_ms: int, sent_ns: int, received_ns: int) -> float | None:
        """Note that the lease clock read *lease_ms* between *sent_ns* and
        *received_ns* (monotonic).

        Returns:
            The step in seconds (positive: forward) when one was detected and logged,
            else ``None``.
        """
        with self._lock:
            last, self._last = self._last, (lease_ms, sent_ns, received_ns)
        if last is None:
            return None
        before_ms, before_sent, before_received = last
        advance = lease_ms - before_ms
        shortest = (sent_ns - before_received) / 1e6  # monotonic ms between readings
        longest = (received_ns - before_sent) / 1e6
        slack = self.threshold_ms + self.drift * longest
        if shortest - slack <= advance <= longest + slack:
            return None
        middle = (received_ns + sent_ns - before_received - before_sent) / 2e6
        step = (advance - middle) / 1000
        if step > 0:
            logger.warning(
                "%s stepped forward by %.1f s against this process's monotonic clock "
                "between two lease renewals (or this machine was suspended): leases "
                "expire that much early, so other runtimes may take over instances "
                "whose runtime is alive; fencing keeps every save safe",
                self.clock,
                step,
            )
        else:
            logger.warning(
                "%s stepped back by %.1f s against this process's monotonic clock "
                "between two lease renewals: the instances of a runtime that stopped "
                "are recovered up to that much later; fencing keeps every save safe",
                self.clock,
                -step,
            )
        return step


class StoreClock(NamedTuple):
    """The clocks a SQL backend's statements get (``:now`` and ``:lease_now``) and the
    watch on its lease clock, which each renewal reads."""

    wall_ms: Callable[[], int]
    lease_ms: Callable[[], int]
    watch: StepWatch
