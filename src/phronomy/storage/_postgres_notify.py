"""PostgreSQL's inbox notifications: a runtime hears at once that another stored an
event (``LISTEN``/``NOTIFY``), instead of at its next poll.

A write that stores an entry, or consumes or refuses one, sends a notification on the
schema's channel; it is delivered when the transaction commits, and the notifications
of one transaction are one (PostgreSQL folds identical ones). The runtime still polls
at its interval: a notification sent while a listener was reconnecting is missed, and
the poll finds what it announced.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import contextlib
    from collections.abc import Callable

    import psycopg

__all__ = ["SQL_NOTIFY", "PostgresListener", "channel"]

_CHANNEL = "'phronomy_' || left(md5(current_schema()), 16)"
"""The schema's channel (a channel name is at most 63 bytes; a schema's may be too)."""

SQL_NOTIFY = f"SELECT pg_notify({_CHANNEL}, %(kind)s)"
"""The inbox changed: ``kind`` is ``posted`` (an entry was stored) or ``consumed`` (an
entry has its outcome)."""


def channel(schema: str) -> str:
    """The channel of *schema* (a name the store checked: lower case), as
    ``SQL_NOTIFY`` computes it on the server."""
    digest = hashlib.md5(schema.encode(), usedforsecurity=False).hexdigest()
    return f"phronomy_{digest[:16]}"


class PostgresListener:
    """A connection of its own that listens (``LISTEN``) on the schema's inbox channel.

    Made to be waited on by an event loop: :meth:`open` blocks (connecting), then the
    caller waits until :meth:`fileno` is readable and calls :meth:`drain`, which never
    blocks. Used by one thread at a time.
    """

    def __init__(
        self,
        connect: Callable[[], psycopg.Connection[Any]],
        errors: Callable[[], contextlib.AbstractContextManager[None]],
        schema: str,
    ) -> None:
        self._connect = connect
        self._errors = errors
        self._channel = channel(schema)
        self._conn: psycopg.Connection[Any] | None = None

    def open(self) -> None:
        """Connect and listen (blocking); notifications sent before are missed.

        Raises:
            StoreUnavailableError: the server cannot be reached.
        """
        self.close()
        with self._errors():
            conn = self._connect()
            try:
                conn.execute(f'LISTEN "{self._channel}"')
            except BaseException:
                conn.close()
                raise
        self._conn = conn

    def fileno(self) -> int:
        """The connection's socket: readable when a notification may have come."""
        assert self._conn is not None, "open() first"
        return self._conn.fileno()

    def drain(self) -> frozenset[str]:
        """The kinds of the notifications received (never blocks).

        Raises:
            StoreUnavailableError: the connection broke (it is closed; :meth:`open`
                again).
        """
        assert self._conn is not None, "open() first"
        try:
            with self._errors():
                return frozenset(n.payload for n in self._conn.notifies(timeout=0))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop listening (the next :meth:`open` connects again)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
