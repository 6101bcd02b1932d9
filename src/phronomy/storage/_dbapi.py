"""The part of a DB-API connection the SQL stores use (typing only)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

__all__ = ["Connection", "Cursor", "ManyCursor"]


class Cursor(Protocol):
    """The part of a DB-API cursor the operations use."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class ManyCursor(Protocol):
    """A cursor of :meth:`Connection.cursor`: one statement over many parameter sets."""

    def executemany(self, sql: str, params: Sequence[Any], /) -> Any:
        """Run *sql* once per parameter set (psycopg: all in one round trip)."""
        ...

    def close(self) -> None:
        """Close the cursor."""
        ...


class Connection(Protocol):
    """The part of a DB-API connection the operations use."""

    def execute(self, sql: str, params: Any = ..., /) -> Cursor:
        """Run one statement; return its cursor."""
        ...

    def cursor(self) -> ManyCursor:
        """A new cursor (for :meth:`ManyCursor.executemany`)."""
        ...
