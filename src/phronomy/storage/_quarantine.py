"""Unknown outcomes this process has seen, per database: refused until resolved.

When the outcome of a write is unknown, the runtime marks the row
``recovery_required`` so every runtime refuses the instance until an operator resolves
it. That mark is itself a write and can fail too. So the process also remembers the
instance here, keyed by the database (:attr:`~phronomy.storage.WorkflowStore.identity`,
the same for two store objects on one SQLite file): every runtime of this process that
uses the database refuses the instance until it is resolved.

This covers one process. Another process sharing the database sees only the durable
mark; if the mark could not be written either, that gap stays open until leases fence
instances across processes.
"""

from __future__ import annotations

import threading

__all__ = ["quarantine", "quarantined", "quarantined_instances", "release_quarantine"]

_lock = threading.Lock()
_unresolved: dict[str, dict[str, str]] = {}  # store identity -> instance id -> reason


def quarantine(identity: str, instance_id: str, reason: str) -> None:
    """Refuse *instance_id* in every runtime of this process that uses *identity*."""
    with _lock:
        _unresolved.setdefault(identity, {})[instance_id] = reason


def quarantined(identity: str, instance_id: str) -> str | None:
    """Why *instance_id* is refused in this process, or ``None``."""
    with _lock:
        return _unresolved.get(identity, {}).get(instance_id)


def quarantined_instances(identity: str) -> dict[str, str]:
    """Every instance of *identity* refused in this process, with why."""
    with _lock:
        return dict(_unresolved.get(identity, {}))


def release_quarantine(identity: str, instance_id: str) -> bool:
    """Forget *instance_id* (it was resolved); returns whether it was quarantined."""
    with _lock:
        ids = _unresolved.get(identity)
        if ids is None or ids.pop(instance_id, None) is None:
            return False
        if not ids:
            del _unresolved[identity]
        return True
