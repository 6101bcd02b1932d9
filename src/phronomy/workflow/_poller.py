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
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any, Protocol

import trio
import trio_util

from phronomy.storage import EntryOp, PollOp

from ._messages import Polled

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
    ticks = trio_util.periodic(interval)
    async with contextlib.aclosing(ticks):
        async for _ in ticks:
            await _poll(coordinator)


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
            await _poll(coordinator)
            due = trio.current_time() + interval


def _awaited_elsewhere(coordinator: WorkflowCoordinator) -> list[tuple[str, str]]:
    """The entries callers here wait for, of instances no segment here runs."""
    return [
        k for k in coordinator.waiters.awaited() if k[0] not in coordinator.sessions
    ]


async def _poll(coordinator: WorkflowCoordinator) -> None:
    try:
        await poll_once(coordinator)
    except Exception as exc:  # noqa: BLE001 - the next poll tries again
        logger.warning("the inbox poll failed: %r", exc)


async def poll_once(coordinator: WorkflowCoordinator) -> None:
    """One poll (see the module docstring); what it found is handled on the dispatcher.

    Cancellation:
        Stops the wait only (the reads change nothing).
    """
    gateway = coordinator.gateway
    assert gateway is not None
    op = PollOp(
        owner=gateway.leases.owner,
        workflows=tuple(sorted(coordinator.served)),
        limit=POLL_LIMIT,
    )
    keys = _awaited_elsewhere(coordinator)
    checked: list[tuple[tuple[str, str], Any]] = []

    async def check(iid: str, event_id: str) -> None:
        entry = await gateway.run(EntryOp(workflow_instance_id=iid, event_id=event_id))
        checked.append(((iid, event_id), entry))

    pending: tuple[Any, ...] = ()
    async with trio.open_nursery() as nursery:
        for iid, event_id in keys:  # submitted together: one batch of reads
            nursery.start_soon(check, iid, event_id)
        pending = await gateway.run(op)
    if pending or checked:
        coordinator.post_message(Polled(pending=pending, checked=tuple(checked)))
