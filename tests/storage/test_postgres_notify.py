"""PostgreSQL's inbox notifications on a real server: who is told, and when."""

from __future__ import annotations

import select
from typing import TYPE_CHECKING

import msgspec
import pytest

from phronomy import PostgresStore, errors, storage
from phronomy.storage._postgres_notify import _CHANNEL, PostgresListener, channel

from .test_contract import _posting, request
from .test_postgres import _backend_of, _terminate

if TYPE_CHECKING:
    from collections.abc import Callable

    OpenPostgres = Callable[..., PostgresStore]


def _heard(listener: PostgresListener, timeout: float) -> frozenset[str]:
    """What the listener heard within *timeout* seconds (as the runtime waits)."""
    select.select([listener.fileno()], [], [], timeout)
    return listener.drain()


def _until_broken(listener: PostgresListener) -> None:
    for _ in range(3):  # the first read may take only the server's goodbye
        assert _heard(listener, 5) == frozenset()


def test_a_listener_hears_posts_and_consumptions_of_its_schema_only(
    open_postgres: OpenPostgres,
) -> None:
    store = open_postgres()
    other = open_postgres(schema=f"{store.schema}_b")
    listener = store.listen()
    listener.open()
    try:
        assert _heard(listener, 0.05) == frozenset()
        store.save(request("i", None))  # a save that consumes nothing: no notice
        assert _heard(listener, 0.1) == frozenset()
        other.save(request("i", None))
        other.run(storage.PostOp(posting=_posting("i", "e1")))  # another schema's
        assert _heard(listener, 0.1) == frozenset()
        posted = store.run(storage.PostOp(posting=_posting("i", "e1")))
        assert _heard(listener, 5) == {"posted"}
        consume = msgspec.structs.replace(
            request("i", 1),
            consumed=(
                storage.Consumption(seq=posted.entry.seq, status="transitioned"),
            ),
        )
        store.save(consume)
        assert _heard(listener, 5) == {"consumed"}
        conn = store._connection()  # the server's name for the channel
        (named,) = conn.execute(f"SELECT {_CHANNEL}").fetchall()[0]
        assert named == channel(store.schema)
    finally:
        listener.close()
        other.close()
        with other._connection() as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {other.schema} CASCADE")


def test_a_listener_whose_backend_died_says_so_then_listens_again(
    open_postgres: OpenPostgres, postgres_dsn: str
) -> None:
    store = open_postgres()
    listener = store.listen()
    listener.open()
    try:
        _terminate(postgres_dsn, _backend_of(listener._conn))
        with pytest.raises(errors.StoreUnavailableError, match="PostgreSQL at"):
            _until_broken(listener)
        assert listener._conn is None  # closed: the next open connects again
        listener.open()
        store.save(request("i", None))
        store.run(storage.PostOp(posting=_posting("i", "e1")))
        assert _heard(listener, 5) == {"posted"}
    finally:
        listener.close()
