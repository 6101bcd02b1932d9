"""Retention: closed instances of a workflow with a retention are purged by the
recovery sweep, in bounded batches, on the store's clock (made controllable here);
a purged id can be started again."""

from __future__ import annotations

import math
import secrets
from typing import TYPE_CHECKING, Any

import pytest
import trio

import phronomy
from phronomy.durability._retention import Retention, retentions
from phronomy.errors import DefinitionError, InvalidInputError
from phronomy.storage._clock import wall_ms
from phronomy.storage._retention import check_retention, purge_ops
from polling import until

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

HOUR = 3600.0


class _S(phronomy.State):
    n: int = 0


def _flow(name: str, retention: float | None) -> phronomy.WorkflowDefinition[_S]:
    return (
        phronomy.Workflow(_S, name=name, retention=retention)
        .wait_state("awaiting")
        .initial("awaiting")
        .transition("awaiting", phronomy.FINISH, on="done")
        .build()
    )


SHORT = _flow("short", HOUR)
DEFAULT = _flow("default", None)
FOREVER = _flow("forever", math.inf)


@pytest.fixture(params=["sqlite", "postgres"])
def clocked(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[Callable[[], Any], dict[str, int]]]:
    """A function that opens a store on a new database whose wall clock is ahead of
    real time by ``offset["ms"]``."""
    offset = {"ms": 0}

    def now() -> int:
        return wall_ms() + offset["ms"]

    if request.param == "sqlite":
        path = tmp_path / "kept.db"
        yield (lambda: phronomy.SQLiteStore(path, clock=now)), offset
        return
    import psycopg

    dsn: str = request.getfixturevalue("postgres_dsn")
    schema = f"test_keep_{secrets.token_hex(6)}"

    def make() -> phronomy.PostgresStore:
        store = phronomy.PostgresStore(dsn, schema=schema)
        store.wall_now_ms = now  # its rows carry the server's clock: the cutoff moves
        return store

    yield make, offset
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def test_retentions_and_bad_values() -> None:
    assert retentions({"a": 5.0, "b": None, "c": math.inf}, 60.0) == {
        "a": 5.0,
        "b": 60.0,
    }
    assert retentions({"a": None}, None) == {}
    for bad in (-1, "7d", True, float("nan")):
        with pytest.raises(DefinitionError, match="retention must be a number"):
            phronomy.Workflow(_S, name="x", retention=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError, match="retention must be a number"):
            check_retention(bad)  # type: ignore[arg-type]


async def test_open_runtime_refuses_a_bad_retention(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="retention must be a number"):
        async with phronomy.open_runtime(
            store=phronomy.SQLiteStore(tmp_path / "r.db"), retention=-5
        ):
            pass  # pragma: no cover


async def test_the_sweep_purges_closed_instances_past_their_retention(
    clocked: tuple[Callable[[], Any], dict[str, int]],
) -> None:
    make, offset = clocked
    store = make()
    try:
        async with phronomy.open_runtime(
            store=store,
            workflows=[SHORT, DEFAULT, FOREVER],
            retention=60.0,
            sweep_interval=0.02,
        ) as rt:
            for flow, iid in ((SHORT, "s-1"), (DEFAULT, "d-1"), (FOREVER, "f-1")):
                await rt.workflows.invoke(flow, workflow_instance_id=iid)
                await rt.workflows.send_event(flow, "done", workflow_instance_id=iid)
            await rt.workflows.invoke(SHORT, workflow_instance_id="s-2")  # halted
            await rt.workflows.invoke(SHORT, workflow_instance_id="s-3")
            await rt.workflows.cancel(SHORT, "s-3")

            def gone(iid: str) -> Callable[[], bool]:
                return lambda: store.load(iid) is None

            offset["ms"] = 120_000  # past the runtime's default only
            await until(gone("d-1"), limit=10)
            assert store.history("d-1") == []
            assert all(store.load(i) is not None for i in ("s-1", "s-3", "f-1"))
            offset["ms"] = round(2 * HOUR * 1000)  # past SHORT's hour
            await until(gone("s-1"), limit=10)
            await until(gone("s-3"), limit=10)
            halted = store.load("s-2")
            assert halted is not None  # not closed: kept
            assert halted.status == "halted"
            assert store.load("f-1") is not None  # kept forever
            # a purged id is free: a new instance under it
            again = await rt.workflows.invoke(SHORT, workflow_instance_id="s-1")
            assert again.revision == 1
    finally:
        store.close()


async def test_a_sweep_purges_one_bounded_batch_per_workflow_and_status(
    tmp_path: Path,
) -> None:
    offset = {"ms": 0}
    store = phronomy.SQLiteStore(
        tmp_path / "many.db", clock=lambda: wall_ms() + offset["ms"]
    )
    try:
        async with phronomy.open_runtime(store=store, sweep_interval=0) as rt:
            async with trio.open_nursery() as nursery:
                for n in range(130):

                    async def close(iid: str) -> None:
                        await rt.workflows.invoke(SHORT, workflow_instance_id=iid)
                        await rt.workflows.send_event(
                            SHORT, "done", workflow_instance_id=iid
                        )

                    nursery.start_soon(close, f"m-{n:03d}")

        async def run(op: Any) -> Any:
            return await trio.to_thread.run_sync(store.run, op)

        retention = Retention(run, store.wall_now_ms, {"short": HOUR})
        assert await retention.purge_once() == []  # all younger than an hour
        offset["ms"] = round(2 * HOUR * 1000)
        # each sweep reads one batch on from where the last one stopped (the first
        # pass ended after the first 100 rows: this one reads the last 30)
        first = await retention.purge_once()
        second = await retention.purge_once()
        assert (len(first), len(second)) == (30, 100)
        assert sorted(first + second) == [f"m-{n:03d}" for n in range(130)]
        assert store.list_instances(limit=10).records == ()
    finally:
        store.close()


async def test_a_purge_keeps_an_instance_claimed_again_at_the_same_revision(
    clocked: tuple[Callable[[], Any], dict[str, int]],
) -> None:
    make, _ = clocked
    store = make()
    try:
        async with phronomy.open_runtime(store=store, sweep_interval=0) as rt:
            await rt.workflows.invoke(SHORT, workflow_instance_id="r-1")
            await rt.workflows.send_event(SHORT, "done", workflow_instance_id="r-1")
        listed = store.load("r-1")
        assert listed.status == "finished"
        # a restart claims it after the purge listed it: same revision, now running
        assert store.begin(
            "r-1",
            "short",
            expected_revision=listed.revision,
            lease_owner="B",
            ttl_ms=60_000,
        )
        (op,) = purge_ops([listed], before_ms=listed.updated_at_ms + 1)
        with pytest.raises(phronomy.ConflictError):
            store.run(op)
        assert store.load("r-1").status == "running"  # kept
    finally:
        store.close()
