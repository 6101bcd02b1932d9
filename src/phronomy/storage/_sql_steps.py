"""An operation written as *steps*, run on a plain connection or pipelined.

A step is the statements an operation sends next and whether it needs their results
before it goes on. Written so, an operation runs unchanged on a connection that sends
each statement as it comes (SQLite, :func:`run_steps`) and in PostgreSQL's pipeline
mode, where each step that waits is one round trip however many statements it has
(:mod:`~phronomy.storage._postgres_pipeline`).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator

    from ._dbapi import Connection, Cursor

__all__ = ["Result", "Statement", "Steps", "run_steps"]

Statement = tuple[str, Any]
Steps = Generator[tuple[list[Statement], bool], "list[Cursor]", Any]
"""An operation's steps: each yields its statements and whether it waits for their
cursors (sent back once they ran; none to one that does not wait). Its return value
is the operation's."""


def run_steps(conn: Connection, steps: Steps) -> Any:
    """Run *steps* on *conn*, one statement after another; return their value.

    Each statement's rows are read at once, so that its statement is done before the
    next runs (SQLite: a statement still open cannot be reused from the connection's
    cache, and the next execution of its text is prepared again).
    """
    cursors: list[Cursor] | None = None
    while True:
        try:
            statements, wait = next(steps) if cursors is None else steps.send(cursors)
        except StopIteration as done:
            return done.value
        sent: list[Cursor] = [Result.read(conn.execute(s, p)) for s, p in statements]
        cursors = sent if wait else []


class Result:
    """One statement's result, read: its rows and row count (a cursor's reading
    methods); PostgreSQL's pipeline fills one per statement once it is synced."""

    __slots__ = ("rowcount", "rows")

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []
        self.rowcount = -1

    @classmethod
    def read(cls, cursor: Cursor) -> Result:
        """*cursor*'s result (a statement without a description has no rows to read:
        DB-API; psycopg refuses to read them)."""
        result = cls()
        if getattr(cursor, "description", None) is not None:
            result.rows = cursor.fetchall()
        result.rowcount = cursor.rowcount
        return result

    def fetchone(self) -> Any:
        """The first row, or ``None``."""
        return self.rows[0] if self.rows else None

    def fetchall(self) -> list[Any]:
        """Every row."""
        return self.rows

    def __iter__(self) -> Iterator[Any]:
        return iter(self.rows)
