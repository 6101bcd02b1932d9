"""The inbox poll and the timer polls read indexes, not whole tables, as the tables
grow (many instances, most inbox entries consumed, few timers due), on SQLite and on
PostgreSQL, without a manual ANALYZE; a statement that would scan a whole table is
caught (the negative controls)."""

from __future__ import annotations

import json
import re
import sqlite3
from typing import TYPE_CHECKING, Any

import psycopg
import pytest

from phronomy.storage._postgres_schema import STATEMENTS as PG
from phronomy.storage._sqlite_schema import STATEMENTS as SQLITE

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    import phronomy

ROWS = 20_000
"""Instances: one in ten running under this runtime's lease, the rest halted. Each has
five inbox entries, all consumed but the last one of one instance in a hundred, and a
timer, due for one instance in two hundred."""

_INSTANCES = """
    INSERT INTO phronomy_workflow_instances (instance_id, workflow, revision, status,
        created_at_ms, updated_at_ms, lease_owner, lease_expires_at_ms, inbox_seq,
        last_write_id)
    SELECT 'i' || n, 'wf', 1, CASE WHEN n % 10 = 0 THEN 'running' ELSE 'halted' END,
        0, 0, CASE WHEN n % 10 = 0 THEN 'me' END, CASE WHEN n % 10 = 0 THEN 10 END, 5,
        'w' || n
    FROM {numbers}
"""
_INBOX = """
    INSERT INTO phronomy_inbox (instance_id, seq, event_id, event, payload,
        stored_at_ms, status)
    SELECT 'i' || n, s, 'e' || s, 'go', {blob}, 0,
        CASE WHEN s = 5 AND n % 100 = 0 THEN 'pending' ELSE 'transitioned' END
    FROM {numbers} CROSS JOIN {seqs}
"""
_TIMERS = """
    INSERT INTO phronomy_timers (instance_id, name, due_at_ms, event, payload, kind,
        armed_revision, armed_at_ms, workflow)
    SELECT 'i' || n, 't', CASE WHEN n % 200 = 0 THEN 5 ELSE 10000000 + n END, 'go',
        {blob}, 'timer', 1, 0, 'wf'
    FROM {numbers}
"""
PARAMS = {
    "owner": "me",
    "workflows": json.dumps(["wf", "other"]),
    "limit": 100,
    "now": 1_000,
}
POLLS = ("poll", "next_due", "due")
"""The inbox poll, and the timer polls: when the next timer is due, the due ones."""


def _statements(statements: Any) -> dict[str, str]:
    return {
        "poll": statements.inbox.poll,
        "next_due": statements.timers.next_due,
        "due": statements.timers.due,
    }


def _unindexed(statement: str) -> str:
    """*statement* with the inbox's pending condition hidden from the planner: the
    partial index no longer applies (a negative control)."""
    bad = statement.replace("i.status = 'pending'", "i.status || '' = 'pending'")
    assert bad != statement
    return bad


# --- SQLite ------------------------------------------------------------------------------------

PARTIAL = ("phronomy_inbox_pending",)
"""Partial indexes: scanning one reads its few rows (the pending entries) only."""


def sqlite_table_scans(plan: list[str]) -> list[str]:
    """The steps of an ``EXPLAIN QUERY PLAN`` that read a whole table or index."""
    return [
        step
        for step in plan
        if step.startswith("SCAN ")
        and "json_each" not in step
        and not any(f"USING INDEX {index}" in step for index in PARTIAL)
    ]


def _sqlite_plans(conn: sqlite3.Connection, statements: dict[str, str]) -> Any:
    return {
        name: [r[3] for r in conn.execute(f"EXPLAIN QUERY PLAN {sql}", PARAMS)]
        for name, sql in statements.items()
    }


def test_the_sqlite_polls_read_indexes(
    open_sqlite: Callable[..., phronomy.SQLiteStore], tmp_path: Path
) -> None:
    path = tmp_path / "polls.db"
    store = open_sqlite(path)
    store.open()
    numbers = (
        f"(WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g "
        f"WHERE n < {ROWS}) SELECT n FROM g)"
    )
    seqs = "(SELECT 1 AS s UNION SELECT 2 UNION SELECT 3 UNION SELECT 4 UNION SELECT 5)"
    with sqlite3.connect(path) as conn:
        conn.execute(_INSTANCES.format(numbers=numbers))
        conn.execute(_INBOX.format(numbers=numbers, seqs=seqs, blob="x''"))
        conn.execute(_TIMERS.format(numbers=numbers, blob="x''"))
        plans = _sqlite_plans(conn, _statements(SQLITE))
        bad = _sqlite_plans(conn, {"poll": _unindexed(SQLITE.inbox.poll)})
        due = conn.execute(SQLITE.timers.due, PARAMS).fetchall()
        polled = conn.execute(SQLITE.inbox.poll, PARAMS).fetchall()
    conn.close()
    print(f"sqlite poll plans over {ROWS} instances: {plans}")  # noqa: T201
    scans = {name: sqlite_table_scans(plans[name]) for name in POLLS}
    assert scans == {name: [] for name in POLLS}
    # the pending entries in the poll's order, from the partial index (no sort)
    assert plans["poll"][0] == "SCAN i USING INDEX phronomy_inbox_pending"
    assert not any("TEMP B-TREE" in step for step in plans["poll"])
    # the due timers of each workflow served, bounded by the index (then sorted)
    assert (
        "SEARCH t USING INDEX phronomy_timers_due (workflow=? AND due_at_ms<?)"
        in plans["due"]
    )
    assert (
        "SEARCH t USING COVERING INDEX phronomy_timers_due (workflow=?)"
        in (plans["next_due"])
    )
    assert sqlite_table_scans(bad["poll"]) == ["SCAN i"]  # the control is caught
    # what they read: the due timers, and the pending entries this runtime may take
    assert sorted(row[0] for row in due) == sorted(
        f"i{n}" for n in range(200, ROWS + 1, 200)
    )
    assert (
        sorted(row[0] for row in polled)
        == sorted(f"i{n}" for n in range(100, ROWS + 1, 100))[:100]
    )


# --- PostgreSQL --------------------------------------------------------------------------------


def postgres_table_scans(plan: list[str]) -> list[str]:
    """The tables (with their aliases) an ``EXPLAIN`` reads whole."""
    return [
        found[1]
        for line in plan
        if (found := re.search(r"Seq Scan on (\w+ \w+)", line))
    ]


@pytest.fixture
def postgres_polls(
    open_postgres: Callable[..., phronomy.PostgresStore], postgres_dsn: str
) -> Any:
    """``explain(statement)``: its plan over a filled schema (never ANALYZEd)."""
    store = open_postgres()
    store.open()
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"SET search_path = {store.schema}")
        numbers = f"generate_series(1, {ROWS}) AS g(n)"
        seqs = "generate_series(1, 5) AS q(s)"
        conn.execute(_INSTANCES.format(numbers=numbers))  # no parameters: % is literal
        conn.execute(_INBOX.format(numbers=numbers, seqs=seqs, blob="''::bytea"))
        conn.execute(_TIMERS.format(numbers=numbers, blob="''::bytea"))

        def explain(statement: str) -> list[str]:
            rows: Any = conn.execute(f"EXPLAIN {statement}", PARAMS)
            return [r[0] for r in rows]

        yield explain


def test_the_postgres_timer_polls_read_indexes(postgres_polls: Any) -> None:
    plans = {name: postgres_polls(_statements(PG)[name]) for name in POLLS[1:]}
    print("postgres timer plans:\n" + json.dumps(plans, indent=1))  # noqa: T201
    assert {name: postgres_table_scans(plan) for name, plan in plans.items()} == {
        "next_due": [],
        "due": [],
    }
    assert "Index Only Scan using phronomy_timers_due" in "\n".join(plans["next_due"])
    assert "Index Cond: ((workflow = w.value) AND (due_at_ms <=" in "\n".join(
        plans["due"]
    )


def test_a_postgres_poll_that_scans_a_table_is_caught(postgres_polls: Any) -> None:
    plan = postgres_polls(_unindexed(PG.inbox.poll))
    assert "phronomy_inbox i" in postgres_table_scans(plan)


def test_the_postgres_inbox_poll_reads_the_pending_index(postgres_polls: Any) -> None:
    plan = postgres_polls(PG.inbox.poll)
    print("postgres inbox poll plan:\n" + "\n".join(plan))  # noqa: T201
    assert postgres_table_scans(plan) == []
    assert "Index Scan using phronomy_inbox_pending" in "\n".join(plan)
