"""Unknown outcomes this process has seen, per database: refused until resolved.

When the outcome of a write is unknown, the runtime marks the row
``recovery_required`` so every runtime refuses the instance until an operator resolves
it. That mark is itself a write and can fail too. So the process also remembers the
instance here, keyed by the database (:attr:`~phronomy.storage.WorkflowStore.identity`,
the same for two store objects on one SQLite file): every runtime of this process that
uses the database refuses the instance until it is resolved.

This covers one process. Another process sharing the database sees only the durable
mark. If the mark could not be written either, the row keeps the lease of the segment
whose save is unknown; once that lease expired, the recovery sweep of any runtime
settles the row (a new lease epoch). A store that then reads the row with a newer
epoch than the one the unknown save presented lifts the quarantine here
(``settle``): the store holds the truth again.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from ._records import StoredRecord

__all__ = [
    "any_quarantined",
    "note_unknown",
    "quarantine",
    "quarantined",
    "quarantined_instances",
    "release_quarantine",
    "settle",
]


class _Entry(NamedTuple):
    reason: str
    epoch: int | None  # the lease epoch of the unknown write (None: not known)


_lock = threading.Lock()
_unresolved: dict[str, dict[str, _Entry]] = {}  # store identity -> instance id -> entry
_unknown_epochs: dict[tuple[str, str], int] = {}
"""The lease epoch of each leased save a store reported ``outcome_unknown`` for (kept
until the instance is quarantined; the oldest go beyond ``_NOTES``)."""
_NOTES = 1024


def note_unknown(identity: str, instance_id: str, epoch: int) -> None:
    """Remember that a save of *instance_id* under lease *epoch* has an unknown outcome
    (a store calls it; a later :func:`quarantine` of the instance keeps the epoch)."""
    with _lock:
        _unknown_epochs.pop((identity, instance_id), None)
        _unknown_epochs[identity, instance_id] = epoch
        while len(_unknown_epochs) > _NOTES:
            del _unknown_epochs[next(iter(_unknown_epochs))]


def quarantine(
    identity: str, instance_id: str, reason: str, *, epoch: int | None = None
) -> None:
    """Refuse *instance_id* in every runtime of this process that uses *identity*.

    *epoch* is the lease epoch of the write whose outcome is unknown (by default, the
    one its store noted); a later read of the row at a newer epoch lifts the refusal
    (see ``settle``).
    """
    with _lock:
        noted = _unknown_epochs.pop((identity, instance_id), None)
        entry = _Entry(reason, noted if epoch is None else epoch)
        _unresolved.setdefault(identity, {})[instance_id] = entry


def any_quarantined() -> bool:
    """Whether any instance is refused in this process, read without the lock (the
    common answer is no: the lookups test it before they take the lock)."""
    return bool(_unresolved)


def quarantined(identity: str, instance_id: str) -> str | None:
    """Why *instance_id* is refused in this process, or ``None``."""
    if not any_quarantined():  # the common case (every segment asks), without the lock
        return None
    with _lock:
        entry = _unresolved.get(identity, {}).get(instance_id)
        return None if entry is None else entry.reason


def quarantined_instances(identity: str) -> dict[str, str]:
    """Every instance of *identity* refused in this process, with why."""
    with _lock:
        return {i: e.reason for i, e in _unresolved.get(identity, {}).items()}


def release_quarantine(identity: str, instance_id: str) -> bool:
    """Forget *instance_id* (it was resolved); returns whether it was quarantined."""
    with _lock:
        _unknown_epochs.pop((identity, instance_id), None)
        ids = _unresolved.get(identity)
        if ids is None or ids.pop(instance_id, None) is None:
            return False
        if not ids:
            del _unresolved[identity]
        return True


def settle(identity: str, record: StoredRecord) -> bool:
    """Lift the quarantine of *record*'s instance if the row shows that another
    runtime settled it: a lease epoch newer than the unknown write's (the sweep, or a
    claim after the lease expired, took it over; the late write can no longer land).

    Returns whether a quarantine was lifted. Called by stores for every row they read.
    """
    if not any_quarantined():  # the common case, without the lock
        return False
    iid = record.workflow_instance_id
    with _lock:
        ids = _unresolved.get(identity, {})
        entry = ids.get(iid)
        if entry is None or entry.epoch is None or record.lease_epoch <= entry.epoch:
            return False
        del ids[iid]
        if not ids:
            del _unresolved[identity]
        return True
