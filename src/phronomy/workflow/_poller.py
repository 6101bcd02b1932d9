"""The inbox poll: how a runtime learns of events other processes stored.

Events stored through this runtime wake their instance at once; those stored by
another process (a replica, the command line) are found by the poll: every
``inbox_poll_interval`` seconds one indexed read returns the pending entries of the
instances this runtime holds, and of halted instances of the workflows it serves that
nobody holds (it resumes those). The same pass reads the entries callers here wait for
that another runtime applies.

A store that sends notifications (PostgreSQL's ``LISTEN``/``NOTIFY``: its
``listen()``) wakes the poll as soon as another runtime stores or consumes an entry;
the poll still runs at its interval, for a notification that was missed.

The same pass fires the durable timers of those instances: one indexed read says when
the first one is due; once one is, a write moves the due ones into their inboxes, and
the poll finds them there. The next pass comes at the interval, or sooner when a timer
is due sooner. It also ticks the due schedules of the workflows it serves (one more
indexed read; a tick stores the instances it starts, whose start timers fire at the
next pass).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any, Protocol

import trio

from phronomy.storage import EntryOp, FireOp, NextDueOp, PendingOp, PollOp, SchedulesOp

from ._messages import Polled
from ._schedule_client import tick_schedules

if TYPE_CHECKING:
    from ._coordinator import WorkflowCoordinator

__all__ = ["POLL_LIMIT", "poll_inbox", "poll_once"]

logger = logging.getLogger(__name__)

POLL_LIMIT = 500
"""Pending entries one poll returns at most (the next poll returns the rest)."""


class _Listener(Protocol):  # see phronomy.storage.PostgresStore.listen
    def open(self) -> None: ...

    def fileno(self) -> int: ...

    def drain(self) -> frozenset[str]: ...

    def close(self) -> None: ...


async def poll_inbox(coordinator: WorkflowCoordinator, interval: float) -> None:
    """Poll the inbox every *interval* seconds (``0``: never), and at once when the
    store says another runtime stored an event (or consumed one a caller here awaits).

    Cancellation:
        The loop ends (shutdown); a read in flight is abandoned (nothing is written).
    """
    if interval == 0:
        return
    gateway = coordinator.gateway
    assert gateway is not None
    listen = getattr(gateway.store, "listen", None)
    if listen is not None:
        listener: _Listener = listen()
        try:
            await _poll_when_told(coordinator, listener, interval)
        finally:
            listener.close()  # nothing waits on it any more: closes at once
        return
    due = trio.current_time()
    while True:
        await trio.sleep_until(due)
        timer = await _poll(coordinator)
        due = min(trio.current_time() + interval, timer)


REOPEN_BACKOFF = (1.0, 30.0)
"""Seconds before a listener that could not connect is opened again: the first wait,
doubled after each failure up to the second (the poll goes on at its interval)."""


async def _poll_when_told(
    coordinator: WorkflowCoordinator, listener: _Listener, interval: float
) -> None:
    listening = False
    due = reopen = trio.current_time()
    backoff = REOPEN_BACKOFF[0]
    while True:
        told = frozenset[str]()
        try:
            if not listening and trio.current_time() >= reopen:
                # what was sent before it listened is missed: poll now
                await trio.to_thread.run_sync(listener.open)
                listening, due, backoff = True, trio.current_time(), REOPEN_BACKOFF[0]
            elif listening:
                with trio.move_on_at(due):
                    await trio.lowlevel.wait_readable(listener.fileno())
                told = listener.drain()
            else:
                await trio.sleep_until(min(due, reopen))
        except Exception as exc:  # noqa: BLE001 - polled at the interval meanwhile
            if backoff == REOPEN_BACKOFF[0]:
                logger.warning("inbox notifications failed (polling): %r", exc)
            listening = False
            reopen = trio.current_time() + backoff
            backoff = min(backoff * 2, REOPEN_BACKOFF[1])
        # a consumed entry matters only to callers here waiting for one that another
        # runtime applies (as the poll checks them)
        wanted = "posted" in told or (told and _awaited_elsewhere(coordinator))
        if wanted or trio.current_time() >= due:
            timer = await _poll(coordinator)
            due = min(trio.current_time() + interval, timer)


def _awaited_elsewhere(coordinator: WorkflowCoordinator) -> list[tuple[str, str]]:
    """The entries callers here wait for, of instances no segment here runs."""
    return [
        k for k in coordinator.waiters.awaited() if k[0] not in coordinator.sessions
    ]


async def _poll(coordinator: WorkflowCoordinator) -> float:
    """One poll; returns when (trio time) the next timer is due (``inf``: none)."""
    try:
        return await poll_once(coordinator)
    except Exception as exc:  # noqa: BLE001 - the next poll tries again
        logger.warning("the inbox poll failed: %r", exc)
        return math.inf


async def poll_once(coordinator: WorkflowCoordinator) -> float:
    """One poll (see the module docstring); what it found is handled on the dispatcher.

    Returns:
        When (trio time) the next timer it may fire is due (``inf``: none is armed).

    Cancellation:
        Stops the wait; a firing write in flight completes (the store decides it).
    """
    gateway = coordinator.gateway
    assert gateway is not None
    op = PollOp(
        owner=gateway.leases.owner,
        workflows=tuple(sorted(coordinator.served)),
        limit=POLL_LIMIT,
    )
    keys = _awaited_elsewhere(coordinator)
    coordinator.inbox.polls += 1
    poll = coordinator.inbox.polls  # before its reads
    checked: list[tuple[tuple[str, str], Any]] = []

    async def check(iid: str, event_id: str) -> None:
        entry = await gateway.run(EntryOp(workflow_instance_id=iid, event_id=event_id))
        checked.append(((iid, event_id), entry))

    pending: tuple[Any, ...] = ()
    due_in: list[int | None] = []
    schedules: list[tuple[int, tuple[Any, ...]]] = []

    async def next_due() -> None:
        due_in.append(await gateway.run(NextDueOp(owner=op.owner, workflows=served)))

    async def due_schedules() -> None:
        schedules.append(await gateway.run(SchedulesOp(workflows=served, due=True)))

    served = op.workflows
    telemetry = coordinator.telemetry

    async def count() -> None:
        assert telemetry is not None
        telemetry.pending(*await gateway.run(PendingOp(workflows=served)))

    async with trio.open_nursery() as nursery:
        for iid, event_id in keys:  # submitted together: one batch of reads
            nursery.start_soon(check, iid, event_id)
        nursery.start_soon(next_due)
        if served:
            nursery.start_soon(due_schedules)
            if telemetry is not None and telemetry.counts_due(trio.current_time()):
                nursery.start_soon(count)
        pending = await gateway.run(op)
    if schedules and schedules[0][1]:  # ticks: instances stored to start at once
        await tick_schedules(coordinator, schedules[0])
    ms = due_in[0]
    if ms is not None and ms <= 0:  # due: into the inboxes, then read them
        fire = FireOp(owner=op.owner, workflows=served, limit=POLL_LIMIT)
        fired = await gateway.run(fire)
        if fired and telemetry is not None:
            telemetry.fired(-ms, fired)
        if fired:
            pending = await gateway.run(op)
        ms = await gateway.run(NextDueOp(owner=op.owner, workflows=served))
        if not fired and ms is not None and ms <= 0:
            ms = None  # due, of instances another runtime holds: it fires them
    if pending or checked:
        coordinator.post_message(
            Polled(pending=pending, checked=tuple(checked), poll=poll)
        )
    return math.inf if ms is None else trio.current_time() + max(ms, 0) / 1000
