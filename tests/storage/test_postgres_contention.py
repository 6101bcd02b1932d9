"""PostgresStore under contention: no write of the runtime waits for a row another
transaction holds, except a save or mark of its own rows (bounded, in one lock order),
and contention is never reported as a server that is down."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import TYPE_CHECKING, Any

import psycopg
import pytest

from phronomy import PostgresStore, errors
from phronomy.storage import (
    BeginOp,
    ClaimOp,
    Lease,
    RecoverOp,
    RenewOp,
    RequestCancelOp,
    SaveOp,
    StoreOp,
    _base as storage_base,
)

from .test_contract import leased, request

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    OpenPostgres = Callable[..., PostgresStore]


@pytest.fixture
def locker(postgres_dsn: str) -> Iterator[Callable[..., psycopg.Connection[Any]]]:
    """Connections that hold row locks in an open transaction (rolled back at the end)."""
    opened: list[psycopg.Connection[Any]] = []

    def lock(schema: str, *ids: str) -> psycopg.Connection[Any]:
        conn = psycopg.connect(postgres_dsn, autocommit=True)
        opened.append(conn)
        conn.execute("BEGIN")
        conn.execute(
            f"SELECT 1 FROM {schema}.phronomy_workflow_instances "
            "WHERE instance_id = ANY(%s) FOR UPDATE",
            (list(ids),),
        )
        return conn

    yield lock
    for conn in opened:
        conn.close()


def claim(iid: str, owner: str, *statuses: str, create: bool = False) -> ClaimOp:
    return ClaimOp(
        workflow_instance_id=iid,
        workflow="wf",
        lease_owner=owner,
        ttl_ms=60_000,
        statuses=statuses,  # type: ignore[arg-type]
        create=create,
    )


def test_a_claim_of_a_row_another_transaction_holds_is_refused_at_once(
    open_postgres: OpenPostgres, locker: Callable[..., psycopg.Connection[Any]]
) -> None:
    # Before: the claim's UPDATE waited for the lock (for as long as it was held), and
    # two batches claiming the same rows in different orders deadlocked.
    store = open_postgres()
    for iid in ("held", "free"):
        store.save(request(iid, None))
    locker(store.schema, "held")
    started = time.monotonic()
    results = store.execute(
        [claim("held", "A", "halted"), claim("free", "A", "halted")]
    )
    took = time.monotonic() - started
    (held_row, held_epoch), (free_row, free_epoch) = [
        (c.row, c.epoch) for c in (r.unwrap() for r in results)
    ]
    assert held_epoch is None  # not claimed: the runtime refuses it as busy
    assert (held_row.status, held_row.revision) == ("halted", 1)  # as it is
    assert (free_row.status, free_epoch) == ("halted", 1)  # the rest of the batch ran
    assert took < 1.0
    assert store.load("held").status == "halted"  # type: ignore[union-attr]
    print(f"claim of a locked row refused after {took * 1000:.0f} ms")  # noqa: T201


def test_creating_an_id_another_claim_is_creating_is_refused_at_once(
    open_postgres: OpenPostgres,
) -> None:
    # Before: INSERT ... ON CONFLICT waited for the other transaction's uncommitted
    # insert of the same id (creators of several ids in different orders deadlocked).
    gate, inside = threading.Event(), threading.Event()

    def hold_open(point: str) -> None:
        if point == "commit.before" and not inside.is_set():
            inside.set()
            gate.wait(10)

    first = open_postgres(fault_hook=hold_open)
    second = open_postgres()
    second.open()
    outcome: list[Any] = []
    creator = threading.Thread(
        target=lambda: outcome.append(first.run(claim("new", "A", create=True)))
    )
    creator.start()
    try:
        assert inside.wait(10)
        started = time.monotonic()
        refused = second.run(claim("new", "B", create=True))
        assert (refused.row, refused.epoch) == (None, None)
        took = time.monotonic() - started
    finally:
        gate.set()
        creator.join(10)
    assert [(c.row, c.epoch) for c in outcome] == [(None, 1)]
    assert took < 1.0
    row = second.load("new")
    assert row is not None
    assert (row.lease_owner, row.lease_epoch) == ("A", 1)
    # once it exists, a second claim sees its owner (a BusyError naming it)
    claimed = second.run(claim("new", "B", create=True))
    assert (claimed.row.lease_owner, claimed.epoch) == ("A", None)


def test_renewals_cancel_requests_and_sweeps_skip_a_row_being_written(
    open_postgres: OpenPostgres, locker: Callable[..., psycopg.Connection[Any]]
) -> None:
    store = open_postgres()
    for iid in ("busy", "calm"):
        assert store.begin(iid, "wf", lease_owner="A", ttl_ms=60_000) == 1
    assert store.begin("gone", "wf", lease_owner="Z", ttl_ms=0) == 1  # expired
    assert store.begin("gone2", "wf", lease_owner="Z", ttl_ms=0) == 1
    locker(store.schema, "busy", "gone")
    started = time.monotonic()
    ids = ("busy", "calm")
    renewed = store.run(RenewOp(owner="A", instance_ids=ids, ttl_ms=60_000))
    asked = store.run(RequestCancelOp(workflow_instance_id="busy", reason="stop"))
    recovered = store.run(RecoverOp(limit=10))
    took = time.monotonic() - started
    # still A's, not renewed this time (its expiry stands); the other one renewed
    assert renewed == {"busy": (1, None, False), "calm": (1, None, True)}
    assert asked == (1, False)  # its epoch, not written: the caller asks again
    assert store.load("busy").cancel_requested is None  # type: ignore[union-attr]
    assert recovered == [("gone2", "failed")]  # the locked one is left for later
    assert took < 1.0


def test_batches_lock_rows_in_one_order_so_they_never_deadlock(
    open_postgres: OpenPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runtimes each save a row of their own and ask for the other's to be
    cancelled, in opposite orders. A batch runs its writes in instance-id order, so
    the two transactions cannot each wait for the other (the negative control runs
    them in the order given: PostgreSQL detects the deadlock and aborts one)."""

    def race(tag: str) -> list[str]:
        # each asks before the other saves (a transaction that waits for a row of
        # the other one never gets there: the other goes on after a second)
        barrier = threading.Barrier(2, timeout=1)

        def meet(point: str) -> None:
            if point == "request_cancel.applied":
                with contextlib.suppress(threading.BrokenBarrierError):
                    barrier.wait()

        setup = open_postgres()
        for iid, owner in ((f"{tag}a", "X"), (f"{tag}b", "Y")):
            assert setup.begin(iid, "wf", lease_owner=owner, ttl_ms=60_000) == 1
        x, y = (open_postgres(fault_hook=meet) for _ in range(2))
        batches: dict[PostgresStore, list[StoreOp]] = {
            x: [
                RequestCancelOp(workflow_instance_id=f"{tag}b"),
                SaveOp(request=leased(f"{tag}a", None, Lease(owner="X", epoch=1))),
            ],
            y: [
                RequestCancelOp(workflow_instance_id=f"{tag}a"),
                SaveOp(request=leased(f"{tag}b", None, Lease(owner="Y", epoch=1))),
            ],
        }
        found: list[str] = []

        def run(store: PostgresStore) -> None:
            saved = store.execute(batches[store])[1].unwrap()
            found.append(saved.outcome if saved.error is None else str(saved.error))

        threads = [threading.Thread(target=run, args=(s,)) for s in batches]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        return sorted(found)

    assert race("o") == ["success", "success"]
    monkeypatch.setattr(  # the negative control: the batch's order as given
        storage_base, "row_order", lambda ops: range(len(ops))
    )
    unordered = race("u")
    assert "success" in unordered
    assert any("a deadlock with another transaction" in r for r in unordered)
    assert not any("check that the server is up" in r for r in unordered)
    print(  # noqa: T201 - the figures of the run
        "batches in instance-id order: 2 of 2 saved; in the order given (negative "
        f"control): {unordered.count('success')} of 2 saved, the other deadlocked"
    )


def test_every_connection_runs_with_the_session_timeouts(
    open_postgres: OpenPostgres,
) -> None:
    store = open_postgres(
        lock_timeout=0.5, statement_timeout=1.5, idle_in_transaction_timeout=2
    )
    store.open()
    assert store.timeouts == (0.5, 1.5, 2.0)
    names = ("lock_timeout", "statement_timeout", "idle_in_transaction_session_timeout")
    expected = ["500ms", "1500ms", "2s"]

    def shown(conn: psycopg.Connection[Any]) -> list[str]:
        return [conn.execute(f"SHOW {name}").fetchall()[0][0] for name in names]

    with store._writing() as conn:
        assert shown(conn) == expected
    with store._writing("renew") as conn:
        assert shown(conn) == expected
    with store._reading() as conn:
        assert shown(conn) == expected
    for name, value in (("lock_timeout", 0), ("statement_timeout", -1)):
        with pytest.raises(errors.InvalidInputError, match=name):
            open_postgres(**{name: value})


def test_contention_is_named_as_such_never_as_a_server_that_is_down(
    open_postgres: OpenPostgres, locker: Callable[..., psycopg.Connection[Any]]
) -> None:
    store = open_postgres(lock_timeout=0.2, statement_timeout=0.5)
    assert store.begin("mine", "wf", lease_owner="A", ttl_ms=60_000) == 1
    locker(store.schema, "mine")  # another transaction writes the runtime's row
    started = time.monotonic()
    saved = store.save_classified(leased("mine", None, Lease(owner="A", epoch=1)))
    assert time.monotonic() - started < 2  # bounded by lock_timeout
    assert saved.outcome == "known_failure"  # it aborted: nothing was written
    message = str(saved.error)
    assert "waited longer than lock_timeout (0.2 s)" in message
    assert "check that the server is up" not in message
    with pytest.raises(errors.StoreUnavailableError) as slow:
        with store._writing() as conn:
            conn.execute("SELECT pg_sleep(2)")
    assert "ran longer than statement_timeout (0.5 s)" in str(slow.value)
    assert "check that the server is up" not in str(slow.value)
    assert store.save(request("after", None)) == 1  # the store goes on
    assert store.run(BeginOp(workflow_instance_id="b", workflow="wf")) == 1
