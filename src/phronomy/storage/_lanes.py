"""The lanes of write batches: what a batch writes decides how it commits."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Literal

from ._ops import READ_OPS, ClaimOp, RenewOp

if TYPE_CHECKING:
    import sqlite3
    from collections.abc import Iterator, Sequence

    from ._ops import StoreOp

__all__ = ["Lane", "immediate", "lane_of", "snapshot"]

Lane = Literal["write", "lease", "renew"]
"""Where a write batch runs: ``renew`` for a batch of lease renewals only (a
connection of its own where the backend has one, so that a renewal never waits
behind the other writes), ``lease`` for one that writes nothing but leases (claims
that post no event, besides reads: see :func:`lane_of`), ``write`` for every other.
A backend may commit ``lease`` and ``renew`` batches without waiting for the disk
(SQLite does: see ``docs/explanation/design.rst``, "One fsync per run")."""


def lane_of(ops: Sequence[StoreOp]) -> Lane:
    """The lane of a write batch: what its operations write."""
    if all(isinstance(op, RenewOp) for op in ops):
        return "renew"
    if all(
        (isinstance(op, ClaimOp) and op.post is None) or isinstance(op, READ_OPS)
        for op in ops
    ):
        return "lease"
    return "write"


@contextlib.contextmanager
def immediate(conn: sqlite3.Connection, lane: Lane = "write") -> Iterator[None]:
    """One SQLite ``BEGIN IMMEDIATE`` transaction of *lane*: committed at the end
    (``synchronous=FULL``, the connection's own; ``NORMAL`` for the lanes that write
    only leases), rolled back if the block raises."""
    durable = lane == "write"
    if not durable:
        conn.execute("PRAGMA synchronous = NORMAL")
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.rollback()
            raise
    finally:
        if not durable:
            conn.execute("PRAGMA synchronous = FULL")


@contextlib.contextmanager
def snapshot(conn: sqlite3.Connection) -> Iterator[None]:
    """One SQLite read transaction (a deferred ``BEGIN``): in WAL mode, every statement
    of the block reads the database as of its first one, whatever commits meanwhile.
    Ended at the end of the block (it wrote nothing)."""
    conn.execute("BEGIN")
    try:
        yield
    finally:
        if conn.in_transaction:
            conn.execute("COMMIT")
