"""The part of a DB-API connection the SQL stores use (typing only)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["Connection", "Cursor"]


class Cursor(Protocol):
    """The part of a DB-API cursor the operations use."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Connection(Protocol):
    """The part of a DB-API connection the operations use."""

    def execute(self, sql: str, params: Any = ..., /) -> Cursor:
        """Run one statement; return its cursor."""
        ...
