"""PostgresStore's pipelined write batches: one round trip per step of the batch, the
same outcomes as one statement after another (refusals, a server that dies)."""

from __future__ import annotations

import os
import socket
import threading
from typing import TYPE_CHECKING, Any

import msgspec
import outcome
import psycopg
import pytest

from phronomy import PostgresStore, errors
from phronomy.storage import (
    ClaimOp,
    Consumption,
    FireOp,
    InboxOp,
    Lease,
    Posting,
    PostOp,
    SaveOp,
    TimerSpec,
    _postgres_pipeline,
    _postgres_wire,
    _sql_steps,
)
from phronomy.storage._postgres_schema import STATEMENTS

from .test_contract import leased, request

if TYPE_CHECKING:
    from collections.abc import Callable

    from phronomy.storage import StoreOp

    OpenPostgres = Callable[..., PostgresStore]


@pytest.fixture
def one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Switch the store to one statement after another (the path before pipelining,
    still taken by every operation that is not pipelined)."""

    def switch() -> None:
        monkeypatch.setattr(_postgres_pipeline, "_steps", lambda *args: None)

    return switch


def _round_trips(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> Callable[[], int]:
    """Count the times the store's write connection waits for the server: each sync
    of a pipeline (psycopg's, whose end syncs too, or the store's own) and each
    statement outside one."""
    count = [0]
    sync, leave, execute = (
        psycopg.Pipeline.sync,
        psycopg.Pipeline.__exit__,
        psycopg.Connection.execute,
    )

    def counted_sync(self: psycopg.Pipeline) -> None:
        count[0] += self._conn is store._conn
        sync(self)

    def counted_exit(self: psycopg.Pipeline, *exc: Any) -> None:
        count[0] += self._conn is store._conn
        leave(self, *exc)

    def counted_execute(self: psycopg.Connection[Any], *args: Any, **kw: Any) -> Any:
        count[0] += self is store._conn and self._pipeline is None
        return execute(self, *args, **kw)

    wire_sync = _postgres_wire.Pipeline.sync

    def counted_wire_sync(self: _postgres_wire.Pipeline) -> None:
        count[0] += self._conn is store._conn
        wire_sync(self)

    monkeypatch.setattr(_postgres_wire.Pipeline, "sync", counted_wire_sync)
    monkeypatch.setattr(psycopg.Pipeline, "sync", counted_sync)
    monkeypatch.setattr(psycopg.Pipeline, "__exit__", counted_exit)
    monkeypatch.setattr(psycopg.Connection, "execute", counted_execute)

    def taken() -> int:
        n, count[0] = count[0], 0
        return n

    return taken


def _claims(prefix: str, n: int) -> list[StoreOp]:
    return [
        ClaimOp(
            workflow_instance_id=f"{prefix}{i}",
            workflow="wf",
            lease_owner="A",
            ttl_ms=60_000,
            create=True,
        )
        for i in range(n)
    ]


def _finishing(prefix: str, n: int) -> list[StoreOp]:
    return [
        SaveOp(
            request=leased(f"{prefix}{i}", None, Lease(owner="A", epoch=1), "finished")
        )
        for i in range(n)
    ]


def test_a_write_batch_takes_as_many_round_trips_whatever_its_size(
    open_postgres: OpenPostgres,
    monkeypatch: pytest.MonkeyPatch,
    one_at_a_time: Callable[[], None],
) -> None:
    """Claims of new instances and their closing saves: the round trips of a batch of
    32 are those of a batch of 1 (the transaction's begin, one per step, the commit).
    Before: one per statement, 2 + 32 for 32 closing saves (each one statement: their
    instances have no inbox entry and no timer, see ``BARE``)."""
    store = open_postgres()
    store.open()
    trips = _round_trips(store, monkeypatch)
    sizes: dict[str, list[int]] = {"claims": [], "saves": []}
    for n in (1, 32):
        assert all(r.unwrap().epoch == 1 for r in store.execute(_claims(f"n{n}-", n)))
        sizes["claims"].append(trips())
        saved = store.execute(_finishing(f"n{n}-", n))
        assert {r.unwrap().outcome for r in saved} == {"success"}
        sizes["saves"].append(trips())
    print(f"round trips per write batch of 1 and 32 ops: {sizes}")  # noqa: T201
    assert sizes["claims"][0] == sizes["claims"][1] <= 5
    assert sizes["saves"][0] == sizes["saves"][1] <= 5
    one_at_a_time()  # the negative control: one statement after another
    store.execute(_claims("s-", 32))
    assert trips() >= 32
    store.execute(_finishing("s-", 32))
    assert trips() >= 32


def _scenario(store: PostgresStore, p: str) -> list[StoreOp]:
    """A batch whose middle operations are refused: a stale lease and a revision
    conflict among saves that land, a claim of another runtime's instance among
    claims that succeed. The refused closing save's instance has a pending entry and
    a timer (they must stay), the accepted one's too (refused, dropped)."""
    for iid in (f"{p}b", f"{p}c", f"{p}f"):
        owner = "B" if iid == f"{p}f" else "A"
        assert store.begin(iid, "wf", lease_owner=owner, ttl_ms=60_000) == 1
    for iid in (f"{p}b", f"{p}c"):
        timer = TimerSpec(name="t", delay_ms=600_000, event="tick", payload=b"{}")
        armed = msgspec.structs.replace(
            leased(iid, None, Lease(owner="A", epoch=1), "running"), arm=(timer,)
        )
        assert store.save(armed) == 1
        posting = Posting(
            workflow_instance_id=iid, event_id="e", event="go", payload=b"1"
        )
        assert store.run(PostOp(posting=posting)).outcome == "stored"
    return [
        ClaimOp(
            workflow_instance_id=f"{p}a", workflow="wf", lease_owner="A", ttl_ms=60_000
        ),
        SaveOp(request=leased(f"{p}b", 1, Lease(owner="A", epoch=0), "finished")),
        SaveOp(request=leased(f"{p}c", 1, Lease(owner="A", epoch=1), "finished")),
        SaveOp(request=request(f"{p}d", 5)),
        ClaimOp(
            workflow_instance_id=f"{p}e",
            workflow="wf",
            lease_owner="A",
            ttl_ms=60_000,
            create=True,
        ),
        ClaimOp(
            workflow_instance_id=f"{p}f",
            workflow="wf",
            lease_owner="A",
            ttl_ms=60_000,
            statuses=("running", "halted"),
        ),
        SaveOp(request=request(f"{p}g", None)),
    ]


def _seen(store: PostgresStore, p: str, values: list[Any]) -> list[str]:
    """The outcomes and what the database holds, the instances' prefix taken out."""
    seen: list[Any] = []
    for value in values:
        if hasattr(value, "outcome"):
            error = value.error
            seen.append((value.outcome, value.revision, type(error), str(error)))
        else:
            row = value.row
            seen.append(
                (value.epoch, None if row is None else (row.status, row.lease_owner))
            )
    with psycopg.connect(store._dsn, autocommit=True) as conn:
        conn.execute(f"SET search_path = {store.schema}")
        for table in ("phronomy_workflow_instances", "phronomy_inbox"):
            key = "instance_id"
            rows = conn.execute(
                f"SELECT * FROM {table} WHERE {key} LIKE %s ORDER BY {key}",
                (f"{p}%",),
            )
            names = [c.name for c in rows.description or ()]
            seen += [
                {
                    n: v
                    for n, v in zip(names, row, strict=True)
                    if "_ms" not in n and "write_id" not in n
                }
                for row in rows
            ]
        timers = conn.execute(
            "SELECT instance_id, name FROM phronomy_timers WHERE instance_id LIKE %s"
            " ORDER BY instance_id",
            (f"{p}%",),
        )
        seen += list(timers)
    return [repr(item).replace(p, "<p>") for item in seen]


def test_a_refused_op_inside_a_pipelined_batch_fails_alone_as_before(
    open_postgres: OpenPostgres, one_at_a_time: Callable[[], None]
) -> None:
    store = open_postgres()
    results = store.execute(_scenario(store, "p-"))
    outcomes = [r.unwrap() for r in results]
    assert [getattr(o, "outcome", None) for o in outcomes[1:4]] == [
        "known_failure",
        "success",
        "known_failure",
    ]
    assert isinstance(outcomes[1].error, errors.LeaseLostError)
    assert isinstance(outcomes[3].error, errors.ConflictError)
    assert outcomes[5].epoch is None  # another runtime's lease: not claimed
    pipelined = _seen(store, "p-", outcomes)
    one_at_a_time()
    alone = [r.unwrap() for r in store.execute(_scenario(store, "s-"))]
    assert _seen(store, "s-", alone) == pipelined
    # the refused save changed nothing: its entry is pending, its timer armed
    assert any("'pending'" in item and "<p>b" in item for item in pipelined)
    assert "('<p>b', 't')" in pipelined
    assert "('<p>c', 't')" not in pipelined


def _writer_backend(store: PostgresStore) -> int:
    conn = store._conn
    assert conn is not None
    return conn.info.backend_pid


@pytest.mark.parametrize("point", ["save.before", "save.applied", "commit.before"])
def test_a_backend_that_dies_mid_pipeline_leaves_the_outcomes_of_single_statements(
    open_postgres: OpenPostgres,
    postgres_dsn: str,
    one_at_a_time: Callable[[], None],
    point: str,
) -> None:
    """The write connection's backend is killed once a batch's first save is queued
    (at the second's ``.before``), once the second ran (``.applied``), or before the
    commit: nothing landed, and every operation says so, as when each statement ran
    on its own."""

    def run(prefix: str) -> list[Any]:
        calls: list[str] = []
        armed: list[bool] = []

        def kill(at: str) -> None:
            calls.extend([at] * bool(armed))
            if at == point and calls.count(point) == (1 if "commit" in at else 2):
                with psycopg.connect(postgres_dsn, autocommit=True) as admin:
                    admin.execute(
                        "SELECT pg_terminate_backend(%s)", (_writer_backend(store),)
                    )

        store = open_postgres(fault_hook=kill)
        store.open()
        for iid in (f"{prefix}0", f"{prefix}1", f"{prefix}2"):
            assert store.begin(iid, "wf", lease_owner="A", ttl_ms=60_000) == 1
        batch = [*_finishing(prefix, 3), *_claims(f"{prefix}new", 2)]
        armed.append(True)
        results = store.execute(batch)
        assert point in calls
        seen: list[tuple[str, type[BaseException] | None]] = []
        for result in results:
            if isinstance(result, outcome.Error):
                seen.append(("error", type(result.error)))
            else:
                verdict = result.unwrap()
                seen.append((verdict.outcome, type(verdict.error)))
        store.fault_hook = None
        rows = [store.load(f"{prefix}{i}") for i in range(3)]
        assert all(row is not None and row.revision == 0 for row in rows)
        assert store.load(f"{prefix}new0") is None
        return seen

    pipelined = run("p")
    assert pipelined[:3] == [("known_failure", errors.StoreUnavailableError)] * 3
    assert pipelined[3:] == [("error", errors.StoreUnavailableError)] * 2
    one_at_a_time()
    assert run("s") == pipelined


def test_a_batch_whose_commit_reply_is_lost_is_settled_by_the_server(
    open_postgres: OpenPostgres,
) -> None:
    """The COMMIT of a pipelined batch is sent and its reply lost: the fence learns
    the transaction committed, and every operation reports what it did."""
    lost: list[str] = []

    def lose_reply(point: str) -> None:
        if point == "commit.before" and not lost:
            lost.append(point)
            conn = store._conn
            assert conn is not None
            with socket.socket(fileno=os.dup(conn.pgconn.socket)) as sock:
                sock.shutdown(socket.SHUT_RD)

    store = open_postgres(fault_hook=lose_reply)
    store.open()
    assert store.begin("c0", "wf", lease_owner="A", ttl_ms=60_000) == 1
    results = store.execute([*_finishing("c", 1), *_claims("cnew", 2)])
    assert lost
    assert results[0].unwrap().outcome == "success"
    assert [r.unwrap().epoch for r in results[1:]] == [1, 1]
    row = store.load("c0")
    assert row is not None
    assert (row.status, row.revision) == ("finished", 1)


def test_two_batches_lock_their_rows_in_one_order_and_never_deadlock(
    open_postgres: OpenPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runtimes' batches save instances ``a`` and ``b``, one consuming entries of
    ``a``, the other of ``b`` (numbers 1 and 3: a check of their own, which a save of
    entries without a gap makes in its statement); both pause once their first round
    trip is done.
    Each batch locks ``a`` before ``b``: one waits for the other, whose saves land (and
    release the lease), and its own are refused (the lease is lost). Before, a save's check of its entries
    was a round trip that the other save of its batch did not wait for, which locked
    its row first: the batches locked the rows in opposite orders, deadlocked, and the
    server rolled one back (``StoreUnavailableError``: a deadlock, when the server
    chose the batch that would have landed; the test below checks the order itself,
    whatever the server chooses)."""
    stores = [open_postgres(), open_postgres()]
    for store in stores:
        store.open()
    for iid in ("a", "b"):
        assert stores[0].begin(iid, "wf", lease_owner="A", ttl_ms=60_000) == 1
        for k in (1, 2, 3):
            posting = Posting(
                workflow_instance_id=iid, event_id=f"e{k}", event="go", payload=b"1"
            )
            assert stores[0].run(PostOp(posting=posting)).outcome == "stored"

    def save(iid: str, *, consume: bool) -> StoreOp:
        saved = leased(iid, None, Lease(owner="A", epoch=1))
        done = (
            (
                Consumption(seq=1, status="transitioned"),
                Consumption(seq=3, status="transitioned"),
            )
            if consume
            else ()
        )
        return SaveOp(request=msgspec.structs.replace(saved, consumed=done))

    batches = [
        [save("a", consume=True), save("b", consume=False)],
        [save("a", consume=False), save("b", consume=True)],
    ]
    both_done_one = threading.Barrier(2, timeout=10)
    synced = threading.local()
    sync = _postgres_wire.Pipeline.sync

    def paused_sync(self: _postgres_wire.Pipeline) -> None:
        sync(self)
        if not getattr(synced, "once", False):
            synced.once = True
            both_done_one.wait()

    monkeypatch.setattr(_postgres_wire.Pipeline, "sync", paused_sync)
    results: list[list[Any]] = [[], []]

    def run(k: int) -> None:
        results[k] = [r.unwrap() for r in stores[k].execute(batches[k])]

    threads = [threading.Thread(target=run, args=(k,)) for k in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    seen = sorted(
        [(v.outcome, type(v.error).__name__) for v in batch] for batch in results
    )
    assert seen == [
        [("known_failure", "LeaseLostError")] * 2,
        [("success", "NoneType")] * 2,
    ], seen


def test_a_batch_sends_the_statements_that_lock_its_rows_in_one_round_trip_in_order(
    open_postgres: OpenPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever an operation reads first (a save's check of the entries it consumes),
    the statements that lock the batch's instance rows go in one round trip, by
    instance id: the order of every write transaction."""
    store = open_postgres()
    store.open()
    for iid in ("a", "b"):
        assert store.begin(iid, "wf", lease_owner="A", ttl_ms=60_000) == 1
    for k in (1, 2, 3):
        posting = Posting(
            workflow_instance_id="a", event_id=f"e{k}", event="go", payload=b"1"
        )
        assert store.run(PostOp(posting=posting)).outcome == "stored"
    consuming = msgspec.structs.replace(  # numbers with a gap: checked first
        leased("a", None, Lease(owner="A", epoch=1)),
        consumed=(
            Consumption(seq=1, status="transitioned"),
            Consumption(seq=3, status="transitioned"),
        ),
    )
    batch = [
        SaveOp(request=consuming),
        SaveOp(request=leased("b", None, Lease(owner="A", epoch=1))),
        *_claims("c", 1),
    ]
    locking = {
        STATEMENTS.update,
        STATEMENTS.update_consuming,
        STATEMENTS.create,
        _postgres_pipeline.SQL_UPDATE_MARKED,
        _postgres_pipeline.SQL_CREATE_MARKED,
        STATEMENTS.claim,
    }
    trips: list[list[str]] = [[]]
    execute, sync = _postgres_wire.Pipeline.execute, _postgres_wire.Pipeline.sync

    def recorded_execute(
        self: _postgres_wire.Pipeline, statement: str, params: Any
    ) -> _sql_steps.Result:
        if statement in locking:
            trips[-1].append(params["id"])
        return execute(self, statement, params)

    def recorded_sync(self: _postgres_wire.Pipeline) -> None:
        trips.append([])
        sync(self)

    monkeypatch.setattr(_postgres_wire.Pipeline, "execute", recorded_execute)
    monkeypatch.setattr(_postgres_wire.Pipeline, "sync", recorded_sync)
    assert [r.unwrap().epoch for r in store.execute(batch)[2:]] == [1]
    assert [ids for ids in trips if ids] == [["a", "b", "c0"]], trips


def test_firing_due_timers_takes_as_many_round_trips_whatever_their_number(
    open_postgres: OpenPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A poll's firing of 100 due timers (500 at most) is a few round trips, as one
    timer's: the transaction's begin, one per step, the commit. Before: four per
    timer (lock, take, number, insert), 0.4 - 0.6 s for 500 that held the write lane;
    an instance with two due timers takes two more (its second timer's numbering and
    insert)."""
    store = open_postgres()
    store.open()
    due = TimerSpec(name="t", delay_ms=0, event="tick", payload=b"{}")
    other = msgspec.structs.replace(due, name="u")

    def arm(prefix: str, n: int) -> None:
        for i in range(n):
            store.save(
                msgspec.structs.replace(request(f"{prefix}{i}", None), arm=(due,))
            )

    trips = _round_trips(store, monkeypatch)
    fired, sizes = [], []
    for n in (1, 100):
        arm(f"f{n}-", n)
        trips()
        fired.append(store.run(FireOp(owner="A", workflows=("wf",))))
        sizes.append(trips())
    store.save(msgspec.structs.replace(request("two", None), arm=(due, other)))
    trips()
    fired.append(store.run(FireOp(owner="A", workflows=("wf",))))
    sizes.append(trips())
    print(f"round trips firing 1, 100 and one instance's 2 timers: {sizes}")  # noqa: T201
    assert fired == [1, 100, 2]
    assert sizes[0] == sizes[1] <= 6
    assert sizes[2] == sizes[0] + 2  # the second timer's numbering and insert
    for iid in ("f1-0", "f100-0", "f100-99"):  # each stored once, numbered first
        (entry,) = store.run(InboxOp(workflow_instance_id=iid, pending_only=False))
        assert (entry.seq, entry.event_id, entry.status) == (1, "timer:t@1", "pending")
    # the control: fired one statement after another, as before
    monkeypatch.setattr(_postgres_pipeline, "FireOp", type("NotFire", (), {}))
    arm("s-", 100)
    trips()
    assert store.run(FireOp(owner="A", workflows=("wf",))) == 100
    assert trips() >= 400
