"""The recovery sweep's query reads the partial lease index in expiry order (never
every running instance through the status index, sorted), without a manual ANALYZE,
and takes over at most its limit per write."""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Any

import psycopg

from phronomy.storage import RecoverOp
from phronomy.storage._postgres_schema import SQL_EXPIRED as PG_EXPIRED
from phronomy.storage._sqlite_schema import SQL_EXPIRED as SQLITE_EXPIRED

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

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


def test_the_sqlite_sweep_reads_the_lease_index(
    open_sqlite: Callable[..., phronomy.SQLiteStore], tmp_path: Path
) -> None:
    # Before: SEARCH ... USING INDEX phronomy_workflow_instances_status (status=?)
    # and USE TEMP B-TREE FOR ORDER BY (every running row read and sorted)
    path = tmp_path / "plan.db"
    store = open_sqlite(path)
    store.open()
    with sqlite3.connect(path) as conn:
        numbers = (
            f"(WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g "
            f"WHERE n < {ROWS}) SELECT n FROM g)"
        )
        conn.execute(_FILL.format(numbers=numbers))
        params = {"lease_now": 10**15, "limit": 100}
        plan = [
            r[3] for r in conn.execute(f"EXPLAIN QUERY PLAN {SQLITE_EXPIRED}", params)
        ]
    conn.close()
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
    store = open_postgres()
    store.open()
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"SET search_path = {store.schema}")
        numbers = f"generate_series(1, {ROWS}) AS g(n)"
        conn.execute(_FILL.format(numbers=numbers))  # no parameters: % is literal
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
