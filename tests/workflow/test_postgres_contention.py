"""PostgreSQL under contention: runtimes in several processes claiming the same rows.

A claim never waits for a row another transaction holds (it is refused at once as
busy), so claims in one batch cannot deadlock with another runtime's, whatever order
they come in.
"""

from __future__ import annotations

import collections
import functools
import itertools
import json
import os
import random
import select
import socket
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import psycopg
import pytest
import trio

import phronomy
from phronomy.workflow._inbox_client import BUSY_RETRIES

from .helpers import admission_state, approval_flow, live_flow, start_live

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

_FLOW = r"""
import phronomy

class Order(phronomy.State):
    step: int = 0

wf = phronomy.Workflow(Order, name="halting")
wf.wait_state("awaiting").initial("awaiting")
wf.transition("awaiting", phronomy.FINISH, on="approve")
flow = wf.build()
"""

_CLAIMER = (
    _FLOW
    + r"""
import json, sys, time, trio

async def main():
    store = phronomy.PostgresStore(sys.argv[1], schema=sys.argv[2])
    async with phronomy.open_runtime(store=store, shutdown_timeout=5) as rt:
        print("ready", flush=True)
        while line := await trio.to_thread.run_sync(sys.stdin.readline):
            command = json.loads(line)
            await trio.sleep(max(0.0, command["at"] - time.time()))
            results = {}

            async def one(iid):
                try:
                    await rt.workflows.send_event(flow, "approve", workflow_instance_id=iid)
                    results[iid] = "won"
                except phronomy.BusyError:
                    results[iid] = "busy"
                except phronomy.InstanceStateError:
                    results[iid] = "finished"  # it arrived after the winner had finished
                except Exception as exc:
                    results[iid] = f"{type(exc).__name__}: {exc}"

            async with trio.open_nursery() as nursery:
                for iid in command["ids"]:
                    nursery.start_soon(one, iid)
            print(json.dumps(results), flush=True)

trio.run(main)
"""
)


def _flow() -> phronomy.WorkflowDefinition[Any]:
    namespace: dict[str, Any] = {}
    exec(_FLOW, namespace)
    flow: phronomy.WorkflowDefinition[Any] = namespace["flow"]
    return flow


async def _create_halted(store: phronomy.PostgresStore, ids: list[str]) -> None:
    flow = _flow()
    async with phronomy.open_runtime(store=store, shutdown_timeout=5) as rt:
        async with trio.open_nursery() as nursery:
            for iid in ids:
                nursery.start_soon(
                    functools.partial(
                        rt.workflows.invoke, flow, workflow_instance_id=iid
                    )
                )


@pytest.mark.slow
def test_processes_claiming_overlapping_instances_never_deadlock(
    open_postgres: Callable[..., phronomy.PostgresStore],
    postgres_dsn: str,
) -> None:
    """4 processes each send ``approve`` to an overlapping, differently ordered set of
    the same 10 halted instances at once (one claim batch each), for several rounds:
    every outcome is a success, a BusyError or (arrived after the end) an
    InstanceStateError; each instance ran exactly one transition.

    Before (each claim a load, then an UPDATE that waited for the row's lock): 7 of 8
    rounds had DeadlockDetected; 128 of 256 claims failed with StoreUnavailableError
    ("check that the server is up"), each losing batch whole.
    """
    store = open_postgres()
    store.open()
    processes, rounds, per_round = (
        4,
        int(os.environ.get("PHRONOMY_RACE_ROUNDS", "4")),
        10,
    )
    args = [sys.executable, "-c", _CLAIMER, postgres_dsn, store.schema]
    children = [
        subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(processes)
    ]
    outcomes: collections.Counter[str] = collections.Counter()
    odd: list[str] = []
    rng = random.Random(7)
    try:
        for child in children:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "ready"
        for round_id in range(rounds):
            ids = [f"r{round_id}-{n}" for n in range(per_round)]
            trio.run(_create_halted, store, ids)
            at = time.time() + 0.3  # every process sends its batch at this moment
            wanted = []
            for child in children:
                chosen = rng.sample(ids, k=8)  # overlapping, each in its own order
                wanted.append(chosen)
                assert child.stdin is not None
                child.stdin.write(json.dumps({"at": at, "ids": chosen}) + "\n")
                child.stdin.flush()
            won: collections.Counter[str] = collections.Counter()
            for child in children:
                assert child.stdout is not None
                results = json.loads(child.stdout.readline())
                for iid, result in results.items():
                    kind = result.split(":")[0]
                    outcomes[kind] += 1
                    if kind == "won":
                        won[iid] += 1
                    elif kind not in ("busy", "finished"):
                        odd.append(f"{iid}: {result}")
            asked = {iid for chosen in wanted for iid in chosen}
            assert odd == []
            assert {iid: won[iid] for iid in asked} == dict.fromkeys(asked, 1)
            for iid in asked:  # one transition: halted at 1, finished at 2
                entries = store.history(iid)
                assert [(e.revision, e.status) for e in entries] == [
                    (2, "finished"),
                    (1, "halted"),
                ], iid
    finally:
        for child in children:
            assert child.stdin is not None
            child.stdin.close()
        for child in children:
            child.wait(timeout=60)
            assert child.stdout is not None
            child.stdout.close()
    assert [c.returncode for c in children] == [0] * processes
    print(  # noqa: T201 - the figures of the run
        f"postgres claim race: {rounds} rounds x {processes} processes x 8 of "
        f"{per_round} instances: {outcomes['won']} won, {outcomes['busy']} busy, "
        f"{outcomes['finished']} arrived after the end, 0 deadlocks, 0 store errors"
    )


class _Proxy:
    """A TCP proxy on 127.0.0.1 in front of the server; :meth:`freeze` stops every
    connection through it (nothing is forwarded either way, the sockets stay open: a
    client process that froze), :meth:`thaw` lets them go on."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def freeze(self) -> None:
        self._flowing.clear()

    def thaw(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self.thaw()
        for sock in self._sockets:
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            server = socket.create_connection(self._target)
            self._sockets += [client, server]
            for source, sink in ((client, server), (server, client)):
                threading.Thread(
                    target=self._pipe, args=(source, sink), daemon=True
                ).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while True:
                ready, _, _ = select.select([source], [], [], 0.05)
                if not ready:
                    continue
                self._flowing.wait()  # frozen: the bytes wait in the socket
                data = source.recv(65536)
                if not data:
                    return
                self._flowing.wait()
                sink.sendall(data)
        except (OSError, ValueError):  # closed (select sees fd -1 once it is)
            return


@pytest.fixture
def proxy(postgres_dsn: str) -> Iterator[_Proxy]:
    params = psycopg.conninfo.conninfo_to_dict(postgres_dsn)
    made = _Proxy(
        str(params.get("host", "127.0.0.1")), int(str(params.get("port", 5432)))
    )
    yield made
    made.close()


async def test_a_stalled_client_costs_a_healthy_runtime_no_lease(
    open_postgres: Callable[..., phronomy.PostgresStore],
    postgres_dsn: str,
    proxy: _Proxy,
) -> None:
    """A client (through a proxy) freezes inside its heartbeat transaction, holding the
    row locks of its instances for longer than the lease TTL. A healthy runtime on a
    direct connection claims one of those rows again and again: each claim is a
    BusyError at once, its own renewals never wait, and it keeps every lease.

    Before (one write connection shared by claims and renewals, no lock_timeout): the
    first claim waited on the lock for the whole 3 s stall, the renewals queued behind
    it, and the runtime kept 0 of its 4 leases (its own sweep put them back).
    """
    ttl, heartbeat, margin, stall = 2.0, 0.4, 0.5, 3.0
    setup = open_postgres()
    stalled_ids = [f"s{n}" for n in range(3)]
    for iid in stalled_ids:  # instances live in the stalled client's runtime
        assert setup.begin(iid, "live", lease_owner="stalled", ttl_ms=60_000) == 1
    renewals: list[tuple[str, float]] = []

    def hook(point: str) -> None:
        if point.startswith("renew."):
            renewals.append((point, time.monotonic()))

    store = open_postgres(fault_hook=hook)
    flow = live_flow()
    table = f"{setup.schema}.phronomy_workflow_instances"
    through = psycopg.conninfo.make_conninfo(postgres_dsn, port=proxy.port)
    client = psycopg.connect(through, autocommit=True)
    try:
        async with phronomy.open_runtime(
            store=store,
            shutdown_timeout=5,
            lease_ttl=ttl,
            heartbeat_interval=heartbeat,
            lease_margin=margin,
            sweep_interval=0.2,
        ) as rt:
            mine = [f"h{n}" for n in range(4)]
            handles = [await start_live(rt, flow, iid) for iid in mine]
            epochs = {iid: setup.load(iid).lease_epoch for iid in mine}  # type: ignore[union-attr]
            # the stalled client's heartbeat: its rows locked, its leases due soon
            client.execute("BEGIN")
            client.execute(
                f"UPDATE {table} SET lease_expires_at_ms = "
                "(extract(epoch from clock_timestamp()) * 1000)::bigint + 1000 "
                "WHERE instance_id = ANY(%s)",
                (stalled_ids,),
            )
            proxy.freeze()  # ...and it freezes, inside the transaction
            renewals.clear()
            started = trio.current_time()
            latencies = []
            while trio.current_time() - started < stall:
                sent = trio.current_time()
                with trio.move_on_at(started + stall) as waiting:
                    with pytest.raises(phronomy.BusyError, match="owner stalled"):
                        await rt.workflows.send_event(
                            flow, "mark", workflow_instance_id=stalled_ids[0]
                        )
                if not waiting.cancelled_caught:  # (the stall may end one midway)
                    latencies.append(trio.current_time() - sent)
                await trio.sleep(0.25)
            kept = [iid for iid in mine if admission_state(rt, iid) == "executing"]
            proxy.thaw()
            client.execute("ROLLBACK")  # the stall ends
            for iid in kept:
                assert rt.workflows.signal(flow, iid, "finish")
            results: list[tuple[str, int | None]] = []
            for handle in handles:
                try:
                    done = await handle.result()
                    results.append((done.status, done.revision))
                except phronomy.errors.LeaseLostError:
                    results.append(("lease lost", None))
    finally:
        proxy.thaw()
        client.close()
    assert kept == mine  # every lease kept through the stall
    assert results == [("finished", 1)] * 4
    for iid in mine:  # never taken over: the same epoch saved it
        row = setup.load(iid)
        assert row is not None
        assert row.lease_epoch == epochs[iid]
    starts = [t for point, t in renewals if point == "renew.before"]
    ends = [t for point, t in renewals if point == "renew.after"]
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    durations = [b - a for a, b in zip(starts, ends, strict=False)]
    # each send is sent again for about a second (a write the holder commits soon),
    # then refused as busy: never waiting for the stalled lock
    assert len(latencies) >= 2
    assert max(latencies) < sum(BUSY_RETRIES) + 0.5
    assert max(gaps) < ttl - margin  # never close to losing a lease
    print(  # noqa: T201 - the figures of the run
        f"stalled client for {stall} s (lease ttl {ttl} s): {len(latencies)} claims "
        f"of its rows, each BusyError within {max(latencies) * 1000:.0f} ms; leases "
        f"kept {len(kept)} of {len(mine)}; {len(starts)} renewals, the longest "
        f"{max(durations) * 1000:.0f} ms, at most {max(gaps):.2f} s apart "
        f"(heartbeat {heartbeat} s)"
    )


async def test_send_event_to_a_row_another_transaction_writes_is_sent_again(
    open_postgres: Callable[..., phronomy.PostgresStore], postgres_dsn: str
) -> None:
    # Before: the claim that carries the event skips a locked row (it never waits for
    # one), and send_event raised BusyError while the holder's write committed; the
    # caller had to send it again. It is sent again (same event id) for up to ~1 s.
    store = open_postgres()
    flow = approval_flow()
    async with phronomy.open_runtime(store=store) as rt:
        await rt.workflows.invoke(flow, workflow_instance_id="b-1")
        with psycopg.connect(postgres_dsn, autocommit=True) as locker:
            locker.execute(f"SET search_path = {store.schema}")
            locker.execute("BEGIN")
            locker.execute(
                "SELECT 1 FROM phronomy_workflow_instances"
                " WHERE instance_id = 'b-1' FOR UPDATE"
            )
            results: list[phronomy.WorkflowResult[Any]] = []

            async def send() -> None:
                results.append(
                    await rt.workflows.send_event(
                        flow, "approve", workflow_instance_id="b-1"
                    )
                )

            async with trio.open_nursery() as nursery:
                nursery.start_soon(send)
                await trio.sleep(0.2)  # its first tries find the row locked
                assert not results
                locker.execute("ROLLBACK")
        assert [(r.status, r.revision) for r in results] == [("finished", 2)]
        events = [
            e
            for e in await rt.workflows.history("b-1")
            if isinstance(e, phronomy.storage.InboxEntry)
        ]
        assert [(e.event, e.status) for e in events] == [("approve", "transitioned")]
