"""Now on the clock a store keeps its lease expiries on (blocking: a worker thread)."""

from __future__ import annotations

from typing import Any

from ._clock import monotonic_ms
from ._postgres import PostgresStore
from ._postgres_schema import _NOW_MS
from ._sqlite import SQLiteStore

__all__ = ["lease_now_ms"]

SQL_LEASE_NOW = f"SELECT {_NOW_MS}"


def lease_now_ms(store: Any) -> int | None:
    """Now on *store*'s lease clock, in milliseconds, to compare with a row's
    ``lease_expires_at_ms`` (blocking: call it in a worker thread).

    The clock is the one the store's claims and takeovers compare expiries with: the
    database server's for a :class:`~phronomy.PostgresStore`, this machine's
    monotonic clock for a :class:`~phronomy.SQLiteStore` (see its ``lease_now_ms``)
    and a :class:`~phronomy.MemoryStore`. A store wrapping another (an ``inner``
    attribute, as :class:`~phronomy.testing.FaultyStore`) answers with the inner one's.

    Returns:
        ``None`` when every stored lease has expired (a SQLite file whose leases were
        written on another boot of the machine).

    Raises:
        StoreUnavailableError: the database cannot be read.
    """
    inner = getattr(store, "inner", None)
    if inner is not None:
        return lease_now_ms(inner)
    if isinstance(store, SQLiteStore):
        return store.lease_now_ms()
    if isinstance(store, PostgresStore):
        with store._reading() as conn:  # noqa: SLF001 - the store's read connection
            row = conn.execute(SQL_LEASE_NOW).fetchone()
        assert row is not None  # a SELECT of one value
        return int(row[0])
    return monotonic_ms()  # a MemoryStore's (and a Python backend's by default)
