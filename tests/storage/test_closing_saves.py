"""A closing save of an instance that never had an inbox entry and has no timer is
one statement (``BARE``), not three: the refusal of its pending entries and the drop
of its timers would change nothing. An instance that has either still gets them
refused and dropped, on SQLite and on PostgreSQL's one-statement-at-a-time path."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec
import pytest

from phronomy import errors
from phronomy.storage import (
    ClaimOp,
    Consumption,
    InboxOp,
    Lease,
    Posting,
    PostOp,
    SaveOp,
    TimersOp,
    TimerSpec,
    _postgres_pipeline,
    _postgres_wire,
)

from .test_contract import request

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from phronomy.storage import BaseStore


class _Counting:
    """A connection that records each statement it is asked to run (but
    notifications)."""

    def __init__(self, conn: Any, sent: list[str]) -> None:
        self._conn, self._sent = conn, sent

    def execute(self, sql: str, params: Any = None, /) -> Any:
        self.note(sql)
        return self._conn.execute(sql, params)

    def note(self, sql: str) -> None:
        if "pg_notify" not in sql:  # PostgreSQL tells waiters elsewhere: not a change
            self._sent.append(" ".join(sql.split()))


@pytest.fixture(params=["sqlite", "postgres", "postgres-pipelined"])
def counted(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    open_sqlite: Callable[..., Any],
) -> tuple[BaseStore[Any], list[str]]:
    """A store with an inbox that keeps two consumed entries, and the statements its
    writes send (PostgreSQL: one after another, as an operation that is not
    pipelined runs, or pipelined)."""
    sent: list[str] = []
    if request.param == "sqlite":
        store = open_sqlite(tmp_path / "closing.db", save_log_depth=2)
    else:
        store = request.getfixturevalue("open_postgres")(save_log_depth=2)
    if request.param == "postgres":
        monkeypatch.setattr(_postgres_pipeline, "_steps", lambda *args: None)
    elif request.param == "postgres-pipelined":
        queue = _postgres_wire.Pipeline.execute

        def queued(pipeline: Any, statement: str, params: Any) -> Any:
            _Counting(None, sent).note(statement)
            return queue(pipeline, statement, params)

        monkeypatch.setattr(_postgres_wire.Pipeline, "execute", queued)
    store.open()
    apply = store.apply
    monkeypatch.setattr(
        store, "apply", lambda conn, op: apply(_Counting(conn, sent), op)
    )
    return store, sent


def _claim(store: BaseStore[Any], iid: str, expected: int | None = None) -> Lease:
    op = ClaimOp(
        workflow_instance_id=iid,
        workflow="wf",
        lease_owner="A",
        ttl_ms=60_000,
        create=expected is None,
        statuses=("halted",),
    )
    claimed = store.run(op)
    assert claimed.epoch is not None
    return Lease(owner="A", epoch=claimed.epoch)


def _close(
    store: BaseStore[Any],
    sent: list[str],
    iid: str,
    expected: int | None,
    lease: Lease,
) -> list[str]:
    saving = msgspec.structs.replace(
        request(iid, expected, status="finished"), lease=lease
    )
    sent.clear()
    assert store.run(SaveOp(request=saving)).revision == (expected or 0) + 1
    return list(sent)


def _post(store: BaseStore[Any], iid: str, event_id: str) -> None:
    posting = Posting(
        workflow_instance_id=iid, event_id=event_id, event="go", payload=b"1"
    )
    assert store.run(PostOp(posting=posting)).outcome == "stored"


def _entries(store: BaseStore[Any], iid: str) -> list[tuple[str, str]]:
    entries = store.run(InboxOp(workflow_instance_id=iid, pending_only=False))
    return sorted((e.event_id, e.status) for e in entries)


def test_closing_an_instance_without_entries_or_timers_is_one_statement(
    counted: tuple[BaseStore[Any], list[str]],
) -> None:
    store, sent = counted
    statements = _close(store, sent, "new", None, _claim(store, "new"))
    assert len(statements) == 1, statements  # before: the save, refusal, timers (3)


def test_a_closing_save_still_refuses_pending_entries_and_drops_timers(
    counted: tuple[BaseStore[Any], list[str]],
) -> None:
    store, sent = counted
    lease = _claim(store, "busy")
    _post(store, "busy", "e1")  # stored while it runs: pending
    statements = _close(store, sent, "busy", None, lease)
    assert any("UPDATE phronomy_inbox" in s for s in statements), statements
    assert _entries(store, "busy") == [("e1", "refused")]

    lease = _claim(store, "timed")
    armed = msgspec.structs.replace(
        request("timed", None),
        lease=lease,
        arm=(TimerSpec(name="t", delay_ms=3_600_000, event="go", payload=b"1"),),
    )
    assert store.run(SaveOp(request=armed)).revision == 1  # halted, a timer armed
    lease = _claim(store, "timed", expected=1)
    statements = _close(store, sent, "timed", 1, lease)
    assert any("DELETE FROM phronomy_timers" in s for s in statements), statements
    assert not store.run(TimersOp(workflow_instance_id="timed"))

    lease = _claim(store, "lost")  # refused: nothing else of it runs
    stale = msgspec.structs.replace(
        request("lost", None, status="finished"),
        lease=Lease(owner="A", epoch=lease.epoch + 1),
    )
    sent.clear()
    refused = store.run(SaveOp(request=stale))
    assert isinstance(refused.error, errors.LeaseLostError), refused
    changing = [  # (pipelined, its inbox and timer changes go with it, guarded)
        s
        for s in sent
        if not s.startswith(("UPDATE phronomy_workflow", "SELECT"))
        and "current_setting('phronomy.saved'" not in s
    ]
    assert not changing, changing


def test_a_closing_save_consuming_an_entry_not_pending_is_refused(
    counted: tuple[BaseStore[Any], list[str]],
) -> None:
    """The check of the entries a save consumes still runs first (the model test found
    a closing save that consumed an entry never stored, and saved)."""
    store, _ = counted
    lease = _claim(store, "gone")
    consuming = msgspec.structs.replace(
        request("gone", None, status="finished"),
        lease=lease,
        consumed=(  # with a gap: checked by a statement of its own
            Consumption(seq=1, status="transitioned"),
            Consumption(seq=3, status="transitioned"),
        ),
    )
    refused = store.run(SaveOp(request=consuming))
    assert isinstance(refused.error, errors.ConflictError), refused
    row = store.load("gone")
    assert row is not None
    assert (row.revision, row.status) == (0, "running")


def _consuming_close(
    store: BaseStore[Any], sent: list[str], iid: str, revision: int | None, seq: int
) -> list[str]:
    """Claim *iid* (at *revision*), store an event for it, and close it with a save
    that consumes that event (numbered *seq*): the statements of that save."""
    lease = _claim(store, iid, expected=revision)
    _post(store, iid, f"e{seq}")
    saving = msgspec.structs.replace(
        request(iid, revision, status="finished"),
        lease=lease,
        consumed=(Consumption(seq=seq, status="transitioned"),),
    )
    sent.clear()
    assert store.run(SaveOp(request=saving)).revision == (revision or 0) + 1
    return list(sent)


def test_a_closing_save_that_consumes_prunes_and_drops_only_what_there_is(
    counted: tuple[BaseStore[Any], list[str]],
) -> None:
    """Its row, then its entry's outcome: no pruning of an instance with no more
    entries than the inbox keeps, no drop of timers it has not (before: 4 statements,
    the refusal and the consumption in one)."""
    store, sent = counted
    statements = _consuming_close(store, sent, "tidy", None, 1)
    assert len(statements) == 2, statements
    assert _entries(store, "tidy") == [("e1", "transitioned")]

    for n in (1, 2):  # halted twice, each consuming an entry: 2 are kept
        lease = _claim(store, "many", expected=None if n == 1 else n - 1)
        _post(store, "many", f"e{n}")
        halting = msgspec.structs.replace(
            request("many", None if n == 1 else n - 1),
            lease=lease,
            consumed=(Consumption(seq=n, status="transitioned"),),
        )
        assert store.run(SaveOp(request=halting)).revision == n
    statements = _consuming_close(store, sent, "many", 2, 3)  # a third: prune
    assert any(s.startswith("DELETE FROM phronomy_inbox") for s in statements), (
        statements
    )
    assert _entries(store, "many") == [("e2", "transitioned"), ("e3", "transitioned")]


def test_a_closing_save_that_consumes_one_entry_refuses_the_other_pending_ones(
    counted: tuple[BaseStore[Any], list[str]],
) -> None:
    """The one-statement close (its entry's outcome with the row) must not leave an
    entry posted meanwhile pending for an instance that finished: it is refused."""
    store, _ = counted
    lease = _claim(store, "two")
    _post(store, "two", "e1")
    _post(store, "two", "e2")  # stored while the segment applied e1
    saving = msgspec.structs.replace(
        request("two", None, status="finished"),
        lease=lease,
        consumed=(Consumption(seq=1, status="transitioned"),),
    )
    assert store.run(SaveOp(request=saving)).revision == 1
    assert _entries(store, "two") == [("e1", "transitioned"), ("e2", "refused")]
