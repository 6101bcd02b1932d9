"""The honest limits of a durable run: exactly its store work, in raw trio loops.

A durable run of a new id does no read and two group-committed writes: the claim (a
row created under a lease: owner, epoch, expiry) and the fenced terminal save (the
update checked against the lease and the revision, with its log row, which keeps the
saved state as the store's history does). On SQLite a batch of claims that store no
event commits without its own sync (``synchronous=NORMAL``, as the store's lease lane
does: one fsync per run, see ``docs/explanation/design.rst``), every other batch with
``synchronous=FULL``; ``claims_sync="FULL"`` syncs the claims too (the limit of the
release before, printed beside it for one release). A halt +
resume pair does that twice, the second claim taking the halted row over; its event is
durable too (the inbox): the resuming claim stores it (an entry numbered in the row's
inbox), and the save that applies it marks it consumed. These loops
do exactly that, 64 clients, their writes group-committed by one writer: on SQLite one
``BEGIN IMMEDIATE`` ... ``COMMIT`` per batch (WAL), on
PostgreSQL one pipelined transaction per batch. Nothing else: no snapshots encoded,
no dispatcher, no machine.
"""

from __future__ import annotations

import sqlite3
import statistics
import time
from typing import Any

import trio

__all__ = ["group", "postgres_claim_save_limit", "sqlite_claim_save_limit"]

CLIENTS = 64
TTL_MS = 30_000
SNAPSHOT = b'{"fields":{"n":3}}'

_TABLES = (
    "CREATE TABLE t (id TEXT PRIMARY KEY, status TEXT NOT NULL, revision BIGINT NOT "
    "NULL, snapshot BYTEA, write_id TEXT, owner TEXT, epoch BIGINT NOT NULL, expires "
    "BIGINT)",
    "CREATE TABLE log (id TEXT, revision BIGINT, write_id TEXT, status TEXT, "
    "snapshot BYTEA, "
    "PRIMARY KEY (id, revision))",
    "CREATE TABLE inbox (id TEXT, seq BIGINT, event_id TEXT, status TEXT NOT NULL, "
    "revision BIGINT, PRIMARY KEY (id, seq))",
)
_CLAIM = (
    "INSERT INTO t (id, status, revision, owner, epoch, expires) "
    "VALUES ({p}, 'running', 0, {p}, 1, {p}) ON CONFLICT (id) DO UPDATE SET "
    "status = 'running', owner = excluded.owner, epoch = t.epoch + 1, "
    "expires = excluded.expires WHERE t.owner IS NULL AND t.status = 'halted' "
    "RETURNING epoch, revision"
)
_SAVE = (
    "UPDATE t SET revision = revision + 1, snapshot = {p}, write_id = {p}, "
    "status = {p}, owner = NULL, expires = NULL "
    "WHERE id = {p} AND owner = {p} AND epoch = {p} AND revision = {p}"
)
_LOG = "INSERT INTO log VALUES ({p}, {p}, {p}, {p}, {p})"
_POST = "INSERT INTO inbox VALUES ({p}, 1, {p}, 'pending', NULL)"
_CONSUME = (
    "UPDATE inbox SET status = 'transitioned', revision = {p} "
    "WHERE id = {p} AND seq = 1 AND status = 'pending'"
)


def _statements(placeholder: str) -> dict[str, str]:
    """The statements by kind with the driver's *placeholder*."""
    return {
        kind: statement.format(p=placeholder)
        for kind, statement in (
            ("claim", _CLAIM),
            ("save", _SAVE),
            ("log", _LOG),
            ("post", _POST),
            ("consume", _CONSUME),
        )
    }


def group(run: Any) -> Any:
    """``submit(item)``: items that arrive while a batch runs form the next batch, run
    by *run* (a list in, a list of results out) in one worker thread."""
    limiter = trio.CapacityLimiter(1)
    pending: list[tuple[Any, list[Any]]] = []
    flushing = [False]

    async def flush() -> None:
        flushing[0] = True
        while pending:
            batch = pending[:]
            pending.clear()
            results = await trio.to_thread.run_sync(
                run, [item for item, _ in batch], limiter=limiter
            )
            for (_, slot), result in zip(batch, results, strict=True):
                slot.append(result)
                slot[0].set()
        flushing[0] = False

    async def submit(item: Any) -> Any:
        slot: list[Any] = [trio.Event()]
        pending.append((item, slot))
        if not flushing[0]:
            await flush()
        await slot[0].wait()
        return slot[1]

    return submit


async def _clients(
    write: Any, total: int, rounds: int, batches: list[int], events: bool
) -> tuple[float, float, float]:
    """*total* instances, *rounds* claim + save pairs each (the last one finishes, the
    others halt; with *events*, each claim after the first stores an event that its
    save consumes), from 64 clients; runs/s, CPU seconds per run, the median batch."""

    async def client(ids: range) -> None:
        for i in ids:
            iid = f"raw-{i}"
            for r in range(rounds):
                event = f"e{i}-{r}" if events and r else None
                epoch, revision = await write(("claim", iid, "me", TTL_MS, event))
                status = "finished" if r == rounds - 1 else "halted"
                saved = await write(
                    (
                        "save",
                        iid,
                        SNAPSHOT,
                        f"w{i}-{r}",
                        status,
                        "me",
                        epoch,
                        revision,
                        event,
                    )
                )
                assert saved == 1, (iid, r)

    per = total // CLIENTS
    cpu, started = time.process_time(), time.perf_counter()
    async with trio.open_nursery() as nursery:
        for k in range(CLIENTS):
            nursery.start_soon(client, range(k * per, (k + 1) * per))
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    return per * CLIENTS / elapsed, cpu / (per * CLIENTS), statistics.median(batches)


def _apply(execute: Any, sql: dict[str, str], ops: list[tuple[Any, ...]]) -> list[Any]:
    """Each op's statements (*sql* by kind) through *execute* (a cursor back)."""
    cursors: list[Any] = []
    for op in ops:
        if op[0] == "claim":
            _, iid, owner, ttl, event = op
            if event is not None:
                execute(sql["post"], (iid, event))
            cursors.append(execute(sql["claim"], (iid, owner, ttl)))
        else:
            _, iid, blob, write_id, status, owner, epoch, revision, event = op
            cursors.append(
                execute(
                    sql["save"], (blob, write_id, status, iid, owner, epoch, revision)
                )
            )
            execute(sql["log"], (iid, revision + 1, write_id, status, blob))
            if event is not None:
                execute(sql["consume"], (revision + 1, iid))
    return cursors


def _results(ops: list[tuple[Any, ...]], cursors: list[Any]) -> list[Any]:
    return [
        tuple(cursor.fetchone()) if op[0] == "claim" else cursor.rowcount
        for op, cursor in zip(ops, cursors, strict=True)
    ]


async def sqlite_claim_save_limit(
    path: str,
    total: int,
    rounds: int = 1,
    *,
    events: bool = False,
    claims_sync: str = "NORMAL",
) -> tuple[float, float, float]:
    """The SQLite limit (WAL): runs/s, CPU s per run, the median write batch
    (*events*: the resuming claims store an event, their saves consume it; a batch of
    claims that store no event commits with ``synchronous=`` *claims_sync*, every
    other one with ``FULL``)."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    for table in _TABLES:
        conn.execute(table)
    sql = _statements("?")
    batches: list[int] = []

    def run_batch(ops: list[tuple[Any, ...]]) -> list[Any]:
        leases = claims_sync != "FULL" and all(
            op[0] == "claim" and op[4] is None for op in ops
        )
        if leases:  # as the store's lease lane: PRAGMA, BEGIN ... COMMIT, PRAGMA
            conn.execute(f"PRAGMA synchronous={claims_sync}")
        conn.execute("BEGIN IMMEDIATE")
        cursors = _apply(conn.execute, sql, ops)
        results = _results(ops, cursors)
        conn.execute("COMMIT")
        if leases:
            conn.execute("PRAGMA synchronous=FULL")
        batches.append(len(ops))
        return results

    try:
        return await _clients(group(run_batch), total, rounds, batches, events)
    finally:
        conn.close()


async def postgres_claim_save_limit(
    dsn: str, schema: str, total: int, rounds: int = 1, *, events: bool = False
) -> tuple[float, float, float]:
    """The PostgreSQL limit: the same statements, one pipelined transaction per batch
    (the claims' rows are read once the pipeline is synced)."""
    import psycopg

    conn = psycopg.connect(dsn, autocommit=True, options=f"-c search_path={schema}")
    conn.execute(f"CREATE SCHEMA {schema}")
    for table in _TABLES:
        conn.execute(table)
    sql = _statements("%s")
    batches: list[int] = []

    def run_batch(ops: list[tuple[Any, ...]]) -> list[Any]:
        with conn.transaction(), conn.pipeline() as pipeline:
            cursors = _apply(conn.execute, sql, ops)
            pipeline.sync()
            results = _results(ops, cursors)
        batches.append(len(ops))
        return results

    try:
        return await _clients(group(run_batch), total, rounds, batches, events)
    finally:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")
        conn.close()
