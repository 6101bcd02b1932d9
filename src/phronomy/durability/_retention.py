"""Retention: the recovery sweep purges closed instances kept longer than their
workflow's retention (see :mod:`phronomy.storage._retention`)."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

import trio

from phronomy.errors import ConflictError
from phronomy.storage._retention import (
    CLOSED_STATUSES,
    PURGE_BATCH,
    ClosedStatus,
    closed_listing,
    purge_ops,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

    from phronomy.storage import DeleteOp, StoreOp

__all__ = ["Retention", "retentions"]

logger = logging.getLogger(__name__)


def retentions(
    served: Mapping[str, float | None], default: float | None
) -> dict[str, float]:
    """The retention (seconds) of each served workflow that has one: its own, else
    *default* (``None`` or ``math.inf``: kept forever)."""
    found: dict[str, float] = {}
    for name, own in served.items():
        seconds = default if own is None else own
        if seconds is not None and seconds != math.inf:
            found[name] = seconds
    return found


class Retention:
    """The closed instances of the served workflows, purged in bounded batches: each
    sweep lists one batch (:data:`~phronomy.storage._retention.PURGE_BATCH` rows) per
    workflow and closed status, from where the last sweep stopped, and deletes those
    closed longer ago than the workflow's retention (on the store's wall clock)."""

    def __init__(
        self,
        run: Callable[[StoreOp], Awaitable[Any]],
        wall_now_ms: Callable[[], int],
        policies: Mapping[str, float],
    ) -> None:
        """Purge the workflows of *policies* (name → seconds) with the runtime's store
        operations (*run*: the durability service's batched path; deletes submitted
        together share one transaction)."""
        self._run = run
        self._now = wall_now_ms
        self._policies = dict(policies)
        self._cursors: dict[tuple[str, ClosedStatus], str | None] = {}

    async def purge_once(self) -> list[str]:
        """One batch per workflow and closed status; returns the ids deleted.

        Cancellation:
            Stops between batches; a batch in flight still completes.
        """
        deleted: list[str] = []
        for workflow, seconds in self._policies.items():
            before = self._now() - round(seconds * 1000)
            for status in CLOSED_STATUSES:
                key = (workflow, status)
                after = self._cursors.get(key)
                listing = closed_listing(
                    status, workflow=workflow, after=after, limit=PURGE_BATCH
                )
                try:
                    page = await self._run(listing)
                except Exception as exc:  # noqa: BLE001 - the next sweep tries again
                    logger.warning("retention: listing failed: %r", exc)
                    return deleted
                self._cursors[key] = page.next_after  # None: from the start next time
                ops = purge_ops(page.records, before_ms=before)
                async with trio.open_nursery() as nursery:
                    for op in ops:
                        nursery.start_soon(self._delete, op, deleted)
        if deleted:
            logger.info("retention: purged %d closed instances", len(deleted))
        return deleted

    async def _delete(self, op: DeleteOp, deleted: list[str]) -> None:
        try:
            await self._run(op)
        except ConflictError:  # it changed since it was listed (started again): kept
            return
        except Exception as exc:  # noqa: BLE001 - the next sweep tries again
            logger.warning(
                "retention: deleting %r failed: %r", op.workflow_instance_id, exc
            )
            return
        deleted.append(op.workflow_instance_id)
