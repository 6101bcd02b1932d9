"""The recovery sweep's query reads the partial lease index in expiry order (never
every running instance through the status index, sorted), without a manual ANALYZE,
and takes over at most its limit per write; a listing by status or workflow seeks
its index in id order."""

from __future__ import annotations

import contextlib
import sqlite3
from typing import TYPE_CHECKING, Any

import psycopg

from phronomy.storage import ListOp, RecoverOp, TakeoversOp
from phronomy.storage._postgres_schema import (
    SQL_EXPIRED as PG_EXPIRED,
    SQL_LIST as PG_LIST,
)
from phronomy.storage._sqlite_schema import (
    SQL_EXPIRED as SQLITE_EXPIRED,
    SQL_LIST as SQLITE_LIST,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    import pytest

    import phronomy

ROWS = 20_000
"""Rows in the table: one in ten running under a lease, the rest halted."""

_FILL = """
    INSERT INTO phronomy_workflow_instances (instance_id, workflow, revision, status,
        created_at_ms, updated_at_ms, lease_owner, lease_expires_at_ms, last_write_id)
    SELECT 'i' || n, 'wf', 0, CASE WHEN n % 10 = 0 THEN 'running' ELSE 'halted' END,
        0, 0, CASE WHEN n % 10 = 0 THEN 'gone' END, CASE WHEN n % 10 = 0 THEN n END,
        'w' || n
    FROM {numbers}
"""
SQLITE_NUMBERS = (
    f"(WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g "
    f"WHERE n < {ROWS}) SELECT n FROM g)"
)
PG_NUMBERS = f"generate_series(1, {ROWS}) AS g(n)"


@contextlib.contextmanager
def _filled_sqlite(
    open_sqlite: Callable[..., phronomy.SQLiteStore], path: Path
) -> Iterator[tuple[phronomy.SQLiteStore, sqlite3.Connection]]:
    """A SQLite store of ``ROWS`` rows, and a connection of its own to its file."""
    store = open_sqlite(path)
    store.open()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        with conn:
            conn.execute(_FILL.format(numbers=SQLITE_NUMBERS))
        yield store, conn


@contextlib.contextmanager
def _filled_postgres(
    open_postgres: Callable[..., phronomy.PostgresStore], dsn: str
) -> Iterator[tuple[phronomy.PostgresStore, psycopg.Connection[Any]]]:
    """A PostgreSQL store of ``ROWS`` rows, and a connection of its own to its schema."""
    store = open_postgres()
    store.open()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"SET search_path = {store.schema}")
        conn.execute(_FILL.format(numbers=PG_NUMBERS))  # no parameters: % is literal
        yield store, conn


def test_the_sqlite_sweep_reads_the_lease_index(
    open_sqlite: Callable[..., phronomy.SQLiteStore], tmp_path: Path
) -> None:
    # Before: SEARCH ... USING INDEX phronomy_workflow_instances_status (status=?)
    # and USE TEMP B-TREE FOR ORDER BY (every running row read and sorted)
    with _filled_sqlite(open_sqlite, tmp_path / "plan.db") as (store, conn):
        params = {"lease_now": 10**15, "limit": 100}
        plan = [
            r[3] for r in conn.execute(f"EXPLAIN QUERY PLAN {SQLITE_EXPIRED}", params)
        ]
    print(f"sqlite sweep plan over {ROWS} rows: {plan}")  # noqa: T201
    assert plan == [
        "SEARCH phronomy_workflow_instances USING INDEX "
        "phronomy_workflow_instances_leases (lease_expires_at_ms<?)"
    ]
    assert store.run(RecoverOp(limit=100)) == [
        (f"i{n}", "failed") for n in range(10, 1010, 10)
    ]  # the first 100 to expire, in one write


def test_the_postgres_sweep_reads_the_lease_index(
    open_postgres: Callable[..., phronomy.PostgresStore], postgres_dsn: str
) -> None:
    # Before: a bitmap scan of the status index, then a sort of every running row
    with _filled_postgres(open_postgres, postgres_dsn) as (store, conn):
        rows: Any = conn.execute(f"EXPLAIN {PG_EXPIRED}", {"limit": 100})
        plan = [r[0] for r in rows]
    print("postgres sweep plan over", ROWS, "rows:\n" + "\n".join(plan))  # noqa: T201
    text = "\n".join(plan)
    assert "Index Scan using phronomy_workflow_instances_leases" in text
    assert "Index Cond: (lease_expires_at_ms <=" in text
    assert "Sort" not in text
    assert "phronomy_workflow_instances_status" not in text
    recovered = store.run(RecoverOp(limit=100))
    assert sorted(recovered) == sorted((f"i{n}", "failed") for n in range(10, 1010, 10))


def test_the_sqlite_listing_by_status_seeks_the_status_index(
    open_sqlite: Callable[..., phronomy.SQLiteStore], tmp_path: Path
) -> None:
    # Before: "(:status IS NULL OR status = :status)" made SQLite walk the whole table
    # in id order (a scan of every row for a rare status; +0.4 s at 1M rows)
    with _filled_sqlite(open_sqlite, tmp_path / "list.db") as (store, conn):
        params = {"status": "running", "workflow": "wf", "after": "i5", "limit": 11}
        plans = {
            (status, workflow): [
                r[3]
                for r in conn.execute(
                    f"EXPLAIN QUERY PLAN {SQLITE_LIST[2 * status + workflow]}", params
                )
            ]
            for status in (0, 1)
            for workflow in (0, 1)
        }
    print(f"sqlite listing plans over {ROWS} rows: {plans}")  # noqa: T201
    assert plans[1, 0] == [
        "SEARCH phronomy_workflow_instances USING INDEX "
        "phronomy_workflow_instances_status (status=? AND instance_id>?)"
    ]
    assert plans[0, 1] == [
        "SEARCH phronomy_workflow_instances USING INDEX "
        "phronomy_workflow_instances_workflow (workflow=? AND instance_id>?)"
    ]
    assert all("TEMP B-TREE" not in " ".join(plan) for plan in plans.values())
    page = store.run(ListOp(status="running", after="i5", limit=10))
    assert [r.workflow_instance_id for r in page.records] == sorted(
        f"i{n}" for n in range(10, ROWS + 1, 10) if f"i{n}" > "i5"
    )[:10]


def test_the_postgres_listing_by_status_uses_the_status_index_generically(
    open_postgres: Callable[..., phronomy.PostgresStore], postgres_dsn: str
) -> None:
    # A prepared statement's generic plan: "%(status)s IS NULL OR ..." could use no
    # index there; a condition of its own can (without statistics: no ANALYZE)
    with _filled_postgres(open_postgres, postgres_dsn) as (store, conn):
        conn.execute("SET plan_cache_mode = force_generic_plan")
        sql = PG_LIST[2].replace("%(after)s", "$1").replace("%(status)s", "$2")
        sql = sql.replace("%(limit)s", "$3")
        conn.execute(f"PREPARE listing(text, text, bigint) AS {sql}")
        rows: Any = conn.execute("EXPLAIN EXECUTE listing('', 'running', 11)")
        plan = "\n".join(r[0] for r in rows)
    print("postgres listing plan over", ROWS, "rows:\n" + plan)  # noqa: T201
    assert "phronomy_workflow_instances_status" in plan
    assert "Seq Scan" not in plan
    page = store.run(ListOp(status="running", limit=3))
    assert [r.workflow_instance_id for r in page.records] == ["i10", "i100", "i1000"]


class _Counting:
    """A connection that counts what it sends: each ``execute`` and ``executemany``
    call is one statement sent (psycopg pipelines an ``executemany``: one round trip
    for all its parameter sets)."""

    def __init__(self, conn: Any, sent: list[str]) -> None:
        self._conn, self._sent = conn, sent

    def execute(self, sql: str, params: Any = None, /) -> Any:
        self._sent.append(sql)
        return self._conn.execute(sql, params)

    def cursor(self) -> Any:
        cursor, sent = self._conn.cursor(), self._sent

        class Many:
            def executemany(self, sql: str, params: Any, /) -> Any:
                sent.append(sql)
                return cursor.executemany(sql, params)

            def close(self) -> None:
                cursor.close()

        return Many()


def _takeovers_in_few_statements(
    store: phronomy.storage.BaseStore[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass over 100 expired leases sends the same few statements as one over a
    single lease: its takeovers are logged together, not a statement (a round trip on
    PostgreSQL) or two per instance."""
    sent: list[str] = []
    apply = store.apply
    monkeypatch.setattr(
        store, "apply", lambda conn, op: apply(_Counting(conn, sent), op)
    )
    assert len(store.run(RecoverOp(limit=1))) == 1
    one = len(sent)
    sent.clear()
    recovered = store.run(RecoverOp(limit=100))
    assert len(recovered) == 100
    assert len(sent) == one <= 3, sent  # before: 1 + 2 per takeover (201)
    for iid, _ in recovered[::33]:
        (taken,) = store.run(TakeoversOp(workflow_instance_id=iid, limit=5))
        assert (taken.epoch, taken.revision, taken.status) == (1, 0, "failed")


def test_the_sqlite_sweep_logs_a_pass_in_few_statements(
    open_sqlite: Callable[..., phronomy.SQLiteStore],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = tmp_path / "few.db"
    with _filled_sqlite(open_sqlite, path) as (store, _):
        _takeovers_in_few_statements(store, monkeypatch)


def test_the_postgres_sweep_logs_a_pass_in_few_statements(
    open_postgres: Callable[..., phronomy.PostgresStore],
    postgres_dsn: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with _filled_postgres(open_postgres, postgres_dsn) as (store, _):
        _takeovers_in_few_statements(store, monkeypatch)
