"""What open_runtime accepts as its store, and what it leaves of it when its block
raises."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

import pytest
import trio

import phronomy
from workflow.helpers import live_flow, start_live

if TYPE_CHECKING:
    from pathlib import Path


def _flow() -> phronomy.WorkflowDefinition[phronomy.State]:
    return phronomy.Workflow(phronomy.State, name="one").state("s").build()


async def test_a_path_opens_a_sqlite_store(tmp_path: Path) -> None:
    # Before: AttributeError: 'str' object has no attribute 'max_concurrency' (and a
    # second one during cleanup).
    for given in (str(tmp_path / "orders.db"), tmp_path / "orders.db"):
        async with phronomy.open_runtime(store=given) as rt:
            assert isinstance(rt.store, phronomy.SQLiteStore)
            done = await rt.workflows.invoke(
                _flow(), workflow_instance_id="o-1", if_exists="return"
            )
            assert done.revision == 1
    assert (tmp_path / "orders.db").exists()


async def test_a_postgresql_uri_opens_a_postgres_store(postgres_dsn: str) -> None:
    async with phronomy.open_runtime(store=postgres_dsn) as rt:
        assert isinstance(rt.store, phronomy.PostgresStore)
        assert rt.durable


@pytest.mark.parametrize("bad", [42, b"orders.db", "", object()])
async def test_anything_else_is_refused_naming_what_is_accepted(bad: object) -> None:
    with pytest.raises(phronomy.InvalidInputError, match="a SQLite file path, or a"):
        async with phronomy.open_runtime(store=bad):  # type: ignore[arg-type]
            pytest.fail("the body must not run")


async def test_a_raising_block_releases_its_leases_before_the_error_arrives(
    tmp_path: Path,
) -> None:
    # Before: the cut-off's release ran in a worker thread after the block had exited:
    # the row was still leased when the error arrived, and a caller closing the store
    # then had it reopened (a leaked connection, a ResourceWarning at the next test).
    path = str(tmp_path / "live.db")
    marks: list[str] = []

    def slow_mark(point: str) -> None:
        if point == "mark.before":
            time.sleep(0.3)
        elif point == "mark.after":
            marks.append(point)

    async def fail_while_live() -> None:
        store = phronomy.SQLiteStore(path, fault_hook=slow_mark)
        async with phronomy.open_runtime(store=store, shutdown_timeout=2) as rt:
            await start_live(rt, live_flow(), "live-1")
            raise LookupError("the body failed")

    with pytest.raises(LookupError, match="the body failed"):
        await fail_while_live()
    assert marks == ["mark.after"]
    reader = phronomy.SQLiteStore(path)
    row = reader.load("live-1")
    reader.close()
    assert row is not None
    assert (row.status, row.lease_owner) == ("failed", None)  # cut off, released


async def test_a_store_write_that_outlives_the_shutdown_is_closed_after_it_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: with a worker thread still running when the shutdown gave up on it, the
    # runtime never closed the store: its two connections leaked (a ResourceWarning
    # in whichever later test the garbage collector ran, a CI failure).
    events: list[str] = []
    release = threading.Event()
    closed = trio.Event()

    def held_mark(point: str) -> None:
        if point == "mark.before":
            assert release.wait(10), "the test never released the mark"
        elif point == "commit.after" and release.is_set():
            events.append("mark committed")

    store = phronomy.SQLiteStore(str(tmp_path / "live.db"), fault_hook=held_mark)
    close = store.close

    def observed_close() -> None:  # called in a worker thread
        close()
        events.append("closed")
        trio.from_thread.run_sync(closed.set)

    monkeypatch.setattr(store, "close", observed_close)

    runtimes: list[phronomy.Runtime] = []

    async def fail_while_live() -> None:
        async with phronomy.open_runtime(store=store, cancel_grace=0) as rt:
            runtimes.append(rt)
            await start_live(rt, live_flow(), "live-1")
            raise LookupError("the body failed")

    try:
        with pytest.raises(LookupError, match="the body failed"):
            await fail_while_live()
        result = runtimes[0].engine.shutdown_result
        assert result is not None
        assert result.threads_running >= 1  # the mark's (and maybe a lease renewal's)
        assert events == []  # the block did not wait for it
    finally:
        release.set()
    with trio.fail_after(5):
        await closed.wait()
    assert events == ["mark committed", "closed"]  # the close waited for the commit


async def test_a_failing_close_never_hides_the_blocks_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Before: the close's OSError replaced the block's LookupError.
    store = phronomy.SQLiteStore(str(tmp_path / "close.db"))
    close = store.close

    def failing_close() -> None:
        close()
        raise OSError("the disk went away")

    monkeypatch.setattr(store, "close", failing_close)

    async def fail() -> None:
        async with phronomy.open_runtime(store=store):
            raise LookupError("the body failed")

    with pytest.raises(LookupError, match="the body failed"):
        await fail()
    assert "closing SQLiteStore(" in caplog.text
    assert "OSError: the disk went away" in caplog.text
    with pytest.raises(OSError, match="the disk went away"):  # nothing else to tell
        async with phronomy.open_runtime(store=store):
            pass
