"""SQLite errors, translated once at the store boundary into errors that say what to do."""

from __future__ import annotations

from typing import TYPE_CHECKING

from phronomy.errors import StoreUnavailableError

if TYPE_CHECKING:
    import sqlite3

__all__ = ["translate"]

_HINTS = {
    "SQLITE_NOTADB": (
        "is not an SQLite database (or is encrypted or damaged); point the store at the "
        "right file, or restore it from a backup"
    ),
    "SQLITE_CORRUPT": (
        "is damaged; restore it from a backup (`PRAGMA integrity_check` shows where)"
    ),
    "SQLITE_CANTOPEN": (
        "cannot be opened; check that its directory exists and that this process may "
        "read and write the file and the directory (SQLite creates -wal and -shm files "
        "beside it)"
    ),
    "SQLITE_READONLY": (
        "is read-only for this store; make the file and its directory writable (or "
        "open the store with read_only=True only to inspect it)"
    ),
    "SQLITE_BUSY": (
        "stayed locked by another connection longer than busy_timeout; look for a "
        "process holding a long write transaction, or raise busy_timeout"
    ),
    "SQLITE_LOCKED": "is locked by another connection of this process",
    "SQLITE_FULL": "could not be written: the disk (or its quota) is full",
    "SQLITE_IOERR": "could not be read or written: the disk reported an I/O error",
    "SQLITE_PERM": "may not be accessed by this process (permission denied)",
}


def translate(error: sqlite3.Error, path: str) -> StoreUnavailableError:
    """The :class:`~phronomy.StoreUnavailableError` for *error* on the database *path*.

    The message names the file and what to do; the SQLite error is kept as the cause
    by the caller (``raise translate(exc, path) from exc``).
    """
    name = getattr(error, "sqlite_errorname", "") or ""
    family = next((key for key in _HINTS if name.startswith(key)), None)
    hint = _HINTS[family] if family is not None else "failed"
    return StoreUnavailableError(
        f"SQLite database {path!r} {hint} ({name or type(error).__name__}: {error})",
        path=path,
    )
