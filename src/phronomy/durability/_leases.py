"""A runtime's leases on the instances it runs: claims, heartbeats, loss, recovery.

A segment is admitted across processes by claiming the instance's lease (one
conditional statement that returns a fencing epoch); every save of the segment
presents the lease, and the store refuses it once another runtime took the instance
over. This runtime renews all its leases in one statement per heartbeat, stops a
segment whose lease it could not renew before the margin, and sweeps the store for
instances whose runtime stopped (their lease expired) to put them back at their last
saved revision.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import math
import os
import secrets
import socket
from typing import TYPE_CHECKING, Any, Protocol, final

import msgspec
import trio
import trio_util

from phronomy.errors import InvalidInputError, LeaseLostError
from phronomy.storage import Lease, RecoverOp, RenewOp

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from phronomy._telemetry import Telemetry
    from phronomy.storage import StoreOp

    from ._retention import Retention

__all__ = [
    "SWEEP_BATCH",
    "SWEEP_BATCHES",
    "HeldLease",
    "LeaseListener",
    "LeaseSettings",
    "Leases",
]

logger = logging.getLogger(__name__)

SWEEP_BATCH = 100
"""Instances a recovery sweep takes over in one write."""
SWEEP_BATCHES = 50
"""Writes of one recovery pass at most (another pass follows after ``sweep_interval``)."""


@final
class LeaseSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How long a runtime's leases last and how it keeps them.

    The defaults follow the usual rule (a TTL of three heartbeats): a runtime that
    stops is replaced within ``ttl + sweep_interval`` (35 s), and a runtime whose store
    answers slowly for up to ``ttl - margin - heartbeat_interval`` (15 s) keeps its
    leases.

    Attributes:
        ttl: seconds a claim or a renewal holds the lease (on the store's clock).
        heartbeat_interval: seconds between renewals.
        margin: a segment whose lease was not renewed stops this long before the lease
            could expire (measured on this runtime's monotonic clock from the moment
            the renewal was sent), so it never acts after another runtime could take
            over.
        sweep_interval: seconds between recovery sweeps (``0``: no sweep in this
            runtime).
        max_takeovers: an instance whose runtime stopped this many times in a row
            while running it becomes ``recovery_required`` instead of being put back.
    """

    ttl: float = 30.0
    heartbeat_interval: float = 10.0
    margin: float = 5.0
    sweep_interval: float = 5.0
    max_takeovers: int = 5

    def __post_init__(self) -> None:
        """Check the settings.

        Raises:
            InvalidInputError: a value out of range, or ``ttl - margin`` not above
                ``heartbeat_interval`` (a lease would lapse between two renewals).
        """
        for name in ("ttl", "heartbeat_interval", "margin"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 < value < math.inf):
                raise InvalidInputError(
                    f"lease {name} must be > 0 seconds, got {value!r}"
                )
        if not self.sweep_interval >= 0:
            raise InvalidInputError(
                f"sweep_interval must be >= 0 seconds, got {self.sweep_interval!r}"
            )
        if self.ttl - self.margin <= self.heartbeat_interval:
            raise InvalidInputError(
                f"lease ttl ({self.ttl}) minus margin ({self.margin}) must exceed "
                f"heartbeat_interval ({self.heartbeat_interval}): a lease would lapse "
                "between two renewals"
            )
        if self.max_takeovers < 1:
            raise InvalidInputError(
                f"max_takeovers must be >= 1, got {self.max_takeovers!r}"
            )


class LeaseListener(Protocol):
    """What a held lease tells its segment (one object per held lease: 100k may wait
    at once, and one listener is fewer objects than two bound callbacks)."""

    def lost(self, error: LeaseLostError) -> object:
        """The lease could not be renewed in time, or another runtime took it."""

    def cancel(self, reason: str | None) -> object:
        """Another runtime asked for the instance to be cancelled."""


DEADLINE_GRAIN = 64
"""Lease deadlines are grouped by 1/64 s: the runtime looks at a group when its last
moment has come, so a segment whose lease lapsed hears it at most that much later
(it already stops before it acts: :meth:`HeldLease.lapsed` reads the exact deadline)."""


@final
class Due:
    """The leases whose deadlines fall in one 1/64 s (see :data:`DEADLINE_GRAIN`).

    Attributes:
        key: the group's last moment, in 1/64 s of trio time.
        ids: the instances that joined it (one may have left since: its lease was
            renewed, dropped or lost).
        live: how many leases are still in it.
    """

    __slots__ = ("ids", "key", "live")

    def __init__(self, key: int) -> None:
        self.key = key
        self.ids: list[str] = []
        self.live = 0


@final
class HeldLease(msgspec.Struct, kw_only=True):
    """A lease this runtime holds for a live segment (mutated by its :class:`Leases`).

    Attributes:
        workflow_instance_id: the instance.
        lease: the capability its writes present (owner and epoch).
        deadline: trio time after which the segment must not act any more (the
            lease could expire on the store soon after): each renewal moves it.
        due: the group of deadlines it is in.
    """

    workflow_instance_id: str
    lease: Lease
    deadline: float
    due: Due
    listener: LeaseListener
    cancel_seen: bool = False

    @property
    def epoch(self) -> int:
        """The lease's fencing epoch."""
        return self.lease.epoch

    def lapsed(self) -> bool:
        """Whether its deadline has passed (on this runtime's monotonic clock): the
        segment may run nothing more, whatever is queued for it."""
        return trio.current_time() >= self.deadline

    def lost(self, *, taken: bool) -> LeaseLostError:
        """The error of its segment once the lease is lost (*taken*: by another
        runtime, else not renewed in time)."""
        why = (
            "another runtime took it over"
            if taken
            else "this runtime could not renew its lease in time"
        )
        return LeaseLostError(
            f"workflow instance {self.workflow_instance_id!r}: {why} (lease epoch "
            f"{self.epoch}); its segment stopped and writes nothing more",
            instance_id=self.workflow_instance_id,
        )


RENEW_CHUNK = 500
"""Leases one renewal statement renews at most (the next chunk is another write)."""


@final
class Leases:
    """The leases of one runtime (its owner token is unique to it).

    Used on the runtime's trio thread only; the heartbeat and the sweep run as
    supervised tasks (:meth:`heartbeat`, :meth:`sweep`).
    """

    telemetry: Telemetry | None = None
    """The runtime's OpenTelemetry (``None``: off): takeovers are counted."""

    def __init__(
        self, run: Callable[[StoreOp], Awaitable[Any]], settings: LeaseSettings
    ) -> None:
        """Lease instances with *settings*, running store operations with *run* (the
        durability service's batched path)."""
        self.settings = settings
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(8)}"
        self._run = run
        self._held: dict[str, HeldLease] = {}
        # The held leases grouped by deadline (1/64 s each), and the groups' keys,
        # earliest first (a key whose group emptied is skipped when it comes up): the
        # earliest deadline is found, and the lapsed leases, without a look at every
        # lease, and a renewal pass pushes one key per group, not one per lease (100k
        # held, a look at all of them per chunk made a pass take 14 s; a heap entry
        # per lease and renewal made the pass's end pop 100k entries in one step)
        self._due: dict[int, Due] = {}
        self._keys: list[int] = []
        self.ttl_ms = round(settings.ttl * 1000)
        self.retention: Retention | None = None
        """Set by the runtime when a served workflow keeps closed instances for a
        limited time: each sweep then purges a batch of them too."""

    def hold(
        self,
        workflow_instance_id: str,
        epoch: int,
        listener: LeaseListener,
        *,
        claimed_at: float,
    ) -> HeldLease:
        """Keep renewing the lease the claim sent at *claimed_at* (trio time) returned;
        *listener* hears (once) if it cannot be, and (once, with the reason) when
        another runtime asks for the instance to be cancelled."""
        deadline = claimed_at + self.settings.ttl - self.settings.margin
        previous = self._held.get(workflow_instance_id)
        if previous is not None:
            self._leave(previous)
        held = HeldLease(
            workflow_instance_id=workflow_instance_id,
            lease=Lease(owner=self.owner, epoch=epoch),
            deadline=deadline,
            due=_join(self._group(deadline), workflow_instance_id),
            listener=listener,
        )
        self._held[workflow_instance_id] = held
        return held

    @property
    def held_count(self) -> int:
        """How many leases this runtime holds."""
        return len(self._held)

    def drop(self, workflow_instance_id: str) -> None:
        """Stop renewing that lease (its segment ended: saved, released or lost)."""
        held = self._held.pop(workflow_instance_id, None)
        if held is not None:
            self._leave(held)

    async def heartbeat(self) -> None:
        """Renew the held leases every ``heartbeat_interval`` seconds (in chunks).

        A lease the store no longer gives this runtime is lost at once; one not renewed
        by its deadline (the store failed or answered too slowly) is lost at that
        deadline: its segment stops.

        Cancellation:
            The loop ends (shutdown); a renewal in flight still completes.
        """
        tick = trio.current_time()
        while True:
            await self.renew()
            tick += self.settings.heartbeat_interval
            while (earliest := self._earliest()) < tick:  # a renewal failed
                await trio.sleep_until(earliest)
                self._expire(trio.current_time())
            await trio.sleep_until(tick)

    def _group(self, deadline: float) -> Due:
        """The group of *deadline* (a new one is pushed on the heap)."""
        key = math.ceil(deadline * DEADLINE_GRAIN)
        due = self._due.get(key)
        if due is None:
            due = self._due[key] = Due(key)
            heapq.heappush(self._keys, key)
        return due

    def _leave(self, held: HeldLease) -> None:
        """*held* leaves its group (an emptied group is forgotten)."""
        due = held.due
        due.live -= 1
        if due.live == 0 and self._due.get(due.key) is due:
            del self._due[due.key]

    def _earliest(self) -> float:
        """When the earliest group of deadlines is due (``inf``: no lease is held)."""
        keys, groups = self._keys, self._due
        while keys:
            if keys[0] in groups:
                return keys[0] / DEADLINE_GRAIN
            heapq.heappop(keys)  # its leases were renewed, dropped or lost since
        return math.inf

    def _expire(self, now: float) -> None:
        """Lose every held lease of a group that is due at *now*."""
        keys, held = self._keys, self._held
        while keys and keys[0] / DEADLINE_GRAIN <= now:
            due = self._due.pop(heapq.heappop(keys), None)
            for iid in due.ids if due is not None else ():
                lease = held.get(iid)
                if lease is not None and lease.due is due:
                    self._lose(iid, lease, taken=False)

    async def renew(self) -> None:
        """One renewal of every held lease (see :meth:`heartbeat`), in statements of
        at most :data:`RENEW_CHUNK` leases each: a store write waits behind one chunk
        (a few milliseconds), not behind every lease of a busy runtime.

        Cancellation:
            Stops the wait only: a renewal in flight still completes.
        """
        ids = tuple(self._held)
        for start in range(0, len(ids), RENEW_CHUNK):
            await self._renew_chunk(ids[start : start + RENEW_CHUNK])
        self._expire(trio.current_time())

    async def _renew_chunk(self, ids: tuple[str, ...]) -> None:
        sent = trio.current_time()
        renewed: dict[str, tuple[int, str | None, bool]] | None = None
        with trio.move_on_at(self._earliest()):
            try:
                renewed = await self._run(
                    RenewOp(owner=self.owner, instance_ids=ids, ttl_ms=self.ttl_ms)
                )
            except Exception as exc:  # noqa: BLE001 - lost at the deadline, below
                logger.warning("could not renew %d leases: %r", len(ids), exc)
        if renewed is None:
            return
        deadline = sent + self.settings.ttl - self.settings.margin
        due: Due | None = None
        for iid in ids:
            held = self._held.get(iid)
            if held is None:
                continue  # ended meanwhile
            epoch, cancel, extended = renewed.get(iid, (None, None, False))
            if epoch != held.epoch:
                self._lose(iid, held, taken=True)
                continue
            if extended:  # else a write held the row: its old deadline stands
                held.deadline = deadline
                due = due or self._group(deadline)
                if held.due is not due:
                    self._leave(held)
                    held.due = _join(due, iid)
            if cancel is not None and not held.cancel_seen:
                held.cancel_seen = True
                held.listener.cancel(cancel or None)

    def _lose(self, iid: str, held: HeldLease, *, taken: bool) -> None:
        del self._held[iid]
        self._leave(held)
        held.listener.lost(held.lost(taken=taken))

    async def sweep(self) -> None:
        """Every ``sweep_interval`` seconds, put back the instances whose runtime
        stopped (see :class:`~phronomy.storage.RecoverOp`), and purge a batch of closed
        instances past their retention (:attr:`retention`).

        Cancellation:
            The loop ends (shutdown); a sweep in flight still completes.
        """
        if self.settings.sweep_interval == 0:
            return
        ticks = trio_util.periodic(self.settings.sweep_interval)
        async with contextlib.aclosing(ticks):
            async for _ in ticks:
                await self.sweep_once()
                if self.retention is not None:
                    await self.retention.purge_once()

    async def sweep_once(self) -> None:
        """One recovery pass (its takeovers are logged): batches of
        :data:`SWEEP_BATCH` instances, each its own short write, for as long as they
        come back full, at most :data:`SWEEP_BATCHES` of them.

        Cancellation:
            Stops the wait only: a batch in flight still completes.
        """
        for _ in range(SWEEP_BATCHES):
            op = RecoverOp(limit=SWEEP_BATCH, max_takeovers=self.settings.max_takeovers)
            try:
                recovered: list[tuple[str, str]] = await self._run(op)
            except Exception as exc:  # noqa: BLE001 - the next sweep tries again
                logger.warning("the recovery sweep failed: %r", exc)
                return
            for iid, status in recovered:
                if self.telemetry is not None:
                    self.telemetry.took_over(iid, status)
                logger.warning(
                    "workflow instance %r: its runtime stopped while running it (lease "
                    "expired); put back as %s",
                    iid,
                    status,
                )
            if len(recovered) < op.limit:
                return


def _join(due: Due, workflow_instance_id: str) -> Due:
    """*due*, which the lease of *workflow_instance_id* has joined."""
    due.ids.append(workflow_instance_id)
    due.live += 1
    return due
