"""Offload pools (spec §2.5, scenarios 110-111, 116-119)."""

from __future__ import annotations

import contextvars
import functools
import gc
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, TypeVar

import outcome
import pytest
import sniffio
import trio
import trio.testing
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from phronomy import errors
from phronomy.engine import CancellationToken, Engine, ResultHandle, open_engine
from polling import until

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

T = TypeVar("T")


def _blocker(entered: threading.Event, gate: threading.Event, value: object) -> object:
    entered.set()
    gate.wait(10)
    return value


async def test_runs_in_a_worker_thread_and_returns_value(engine: Engine) -> None:
    pool = engine.pool("io", size=2, queue_size=4)
    handle = pool.submit_nowait(threading.get_ident)
    assert await handle.result() != threading.get_ident()
    assert handle.physically_complete
    assert await pool.run(sum, [1, 2, 3]) == 6
    stats = pool.statistics()
    assert stats.completed_total == 2
    assert stats.active_count == 0


async def test_exceptions_from_the_worker_settle_the_handle(engine: Engine) -> None:
    def boom() -> None:
        raise OSError("disk")

    handle = engine.default_pool.submit_nowait(boom)
    with pytest.raises(OSError, match="disk"):
        await handle.result()


async def test_timeout_before_start_never_runs_and_is_not_abandoned(
    engine: Engine,
) -> None:
    # scenario 116
    pool = engine.pool("single", size=1, queue_size=4)
    entered, gate = threading.Event(), threading.Event()
    first = pool.submit_nowait(_blocker, entered, gate, "first")
    await until(entered.is_set)
    ran = threading.Event()
    second = pool.submit_nowait(ran.set, timeout=0.05)
    with pytest.raises(errors.DeadlineExceededError, match=r"timed out after 0\.05s"):
        await second.result()
    assert second.status == "failed"
    gate.set()
    assert await first.result() == "first"
    await second.wait_physical()
    await pool.wait_idle()  # had the skipped operation started, it would run first
    assert not ran.is_set()
    assert pool.statistics().abandoned_total == 0


async def test_timeout_after_start_abandons_and_discards_the_result(
    engine: Engine,
) -> None:
    # scenario 117
    pool = engine.pool("single", size=1, queue_size=4)
    entered, gate = threading.Event(), threading.Event()
    handle = pool.submit_nowait(_blocker, entered, gate, "late value", timeout=0.05)
    seen: list[str] = []
    handle.on_complete(lambda h: seen.append(h.status))
    with pytest.raises(errors.DeadlineExceededError):
        await handle.result()
    assert seen == ["failed"]
    stats = pool.statistics()
    assert (
        stats.abandoned_total,
        stats.abandoned_active_count,
        stats.active_count,
    ) == (1, 1, 1)
    assert not handle.physically_complete
    gate.set()
    await handle.wait_physical()
    assert seen == ["failed"]  # the callback ran once; the late value was discarded
    assert isinstance(handle.error, errors.DeadlineExceededError)
    assert pool.statistics().abandoned_active_count == 0


async def test_pre_cancelled_token_never_runs(engine: Engine) -> None:
    # scenario 118
    token = CancellationToken()
    token.cancel()
    ran = threading.Event()
    handle = engine.default_pool.submit_nowait(ran.set, cancellation=token)
    assert handle.status == "cancelled"
    assert handle.physically_complete
    with pytest.raises(errors.CancellationError, match="before execution"):
        await handle.result()
    assert not ran.is_set()


async def test_expired_token_deadline_counts_as_cancelled(engine: Engine) -> None:
    token = CancellationToken(deadline=trio.current_time() - 1)
    handle = engine.default_pool.submit_nowait(int, cancellation=token)
    assert handle.status == "cancelled"
    assert token.cancelled


async def test_timeout_without_timer_queue_is_a_configuration_error() -> None:
    from phronomy.engine import OffloadPool

    pool = OffloadPool("bare", pool_size=1, queue_size=1, timers=None)
    with pytest.raises(errors.InvalidInputError, match="no timer queue"):
        pool.submit_nowait(int, timeout=1)


async def test_non_positive_timeout_settles_immediately(engine: Engine) -> None:
    ran = threading.Event()
    handle = engine.default_pool.submit_nowait(ran.set, timeout=0)
    assert isinstance(handle.error, errors.DeadlineExceededError)
    await engine.default_pool.wait_idle()
    assert not ran.is_set()


async def test_cancel_after_start_is_not_physically_complete_until_the_worker_returns(
    engine: Engine,
) -> None:
    # scenario 119
    token = CancellationToken()
    entered, gate = threading.Event(), threading.Event()
    handle = engine.default_pool.submit_nowait(
        _blocker, entered, gate, 1, cancellation=token
    )
    await until(entered.is_set)
    token.cancel()
    assert handle.status == "cancelled"
    assert not handle.physically_complete
    gate.set()
    await handle.wait_physical()
    assert handle.status == "cancelled"


async def test_physical_completion_is_published_before_logical_callbacks(
    engine: Engine,
) -> None:
    order: list[str] = []
    handle = engine.default_pool.submit_nowait(int, "5")
    handle.on_complete(
        lambda h: order.append(f"logical physical={h.physically_complete}")
    )
    handle.on_physical_complete(lambda h: order.append(f"physical done={h.done}"))
    assert await handle.result() == 5
    assert order == ["physical done=False", "logical physical=True"]


async def test_backpressure_when_threads_and_queue_are_full(engine: Engine) -> None:
    pool = engine.pool("tight", size=1, queue_size=1)
    entered, gate = threading.Event(), threading.Event()
    running = pool.submit_nowait(_blocker, entered, gate, "a")
    await until(entered.is_set)
    queued = pool.submit_nowait(_blocker, threading.Event(), gate, "b")
    with pytest.raises(errors.BackpressureError, match=r"queue is full \(depth: 1\)"):
        pool.submit_nowait(int)
    with pytest.raises(errors.BackpressureError):
        await pool.submit(int, on_full="raise")
    gate.set()
    assert [await running.result(), await queued.result()] == ["a", "b"]


async def test_on_full_wait_waits_for_space(engine: Engine) -> None:
    pool = engine.pool("tight", size=1, queue_size=0)
    entered, gate = threading.Event(), threading.Event()
    first = pool.submit_nowait(_blocker, entered, gate, "a")
    await until(entered.is_set)
    admitted: list[ResultHandle[Any]] = []

    async def waiter() -> None:
        admitted.append(await pool.submit(str, 42))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()  # parked, waiting for space
        assert admitted == []
        gate.set()
    assert await first.result() == "a"
    assert await admitted[0].result() == "42"
    with pytest.raises(errors.InvalidInputError):
        await pool.submit(int, on_full="sometimes")  # type: ignore[arg-type]


async def test_submit_after_close_raises_pool_shutdown(engine: Engine) -> None:
    pool = engine.pool("closing", size=1, queue_size=1)
    pool.close()
    with pytest.raises(errors.RuntimeShutdownError, match="has been shut down"):
        pool.submit_nowait(int)
    with pytest.raises(errors.RuntimeShutdownError):
        await pool.submit(int)


async def test_named_pools_are_shared_and_validated(engine: Engine) -> None:
    assert engine.pool("db") is engine.pool("db", size=3)
    with pytest.raises(errors.InvalidInputError):
        engine.pool("bad", size=0)
    assert {p.name for p in engine.statistics().pools} >= {"default", "db"}


async def test_pools_after_shutdown_refuse_work() -> None:
    # scenario 110 (the parts that apply to trio)
    async with open_engine() as eng:
        pool = eng.pool("named")
    with pytest.raises(errors.RuntimeShutdownError):
        pool.submit_nowait(int)
    with pytest.raises(errors.RuntimeShutdownError, match="new work is not accepted"):
        eng.pool("another")
    with pytest.raises(
        errors.RuntimeShutdownError, match="TimerQueue has been shut down"
    ):
        eng.timers.schedule(1, lambda: None)


async def test_cancelled_worker_keeps_cleanup_incomplete_until_it_returns() -> None:
    # scenario 111: a cancelled operation's worker still running at shutdown
    token = CancellationToken()
    entered, gate = threading.Event(), threading.Event()
    async with open_engine(shutdown_timeout=0, cancel_grace=0) as eng:
        handle = eng.default_pool.submit_nowait(
            _blocker, entered, gate, 1, cancellation=token
        )
        await until(entered.is_set)
        token.cancel()
    result = eng.shutdown_result
    assert result is not None
    assert not result.cleanup_complete
    assert result.threads_running == 1
    assert eng.default_pool.active_count == 1
    assert eng.state == "failed"
    gate.set()
    await handle.wait_physical()
    assert eng.default_pool.active_count == 0


class PoolModel(RuleBasedStateMachine):
    """Submit, release and cancel blocking operations; the pool's accounting must match.

    The engine lives in ``trio.run`` on a helper thread (hypothesis-trio is broken).
    """

    POOL_SIZE = 2
    QUEUE_SIZE = 2

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[dict[str, Any]] = []
        self.queue: list[int] = []  # FIFO of queued op indexes
        self.abandoned_total = 0
        self._ready = threading.Event()
        self._outcome: outcome.Outcome[None] | None = None
        self._thread = threading.Thread(target=self._host_thread, daemon=True)
        self._thread.start()
        self._ready.wait(10)
        failed: outcome.Outcome[None] | None = self._outcome  # set by the thread
        if failed is not None:
            failed.unwrap()

    def _host_thread(self) -> None:
        self._outcome = outcome.capture(trio.run, self._host)
        self._ready.set()

    async def _host(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        async with open_engine(shutdown_timeout=5) as eng:
            self.pool = eng.pool(
                "model", size=self.POOL_SIZE, queue_size=self.QUEUE_SIZE
            )
            self._ready.set()
            await self._stop.wait()

    def _call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        return trio.from_thread.run(fn, *args, trio_token=self._token)

    def _call_sync(self, fn: Callable[..., T], *args: Any) -> T:
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)

    # --- model helpers ------------------------------------------------------------

    def _busy(self) -> int:
        return sum(op["state"] in ("running", "abandoned") for op in self.ops)

    def _promote(self) -> None:
        while self.queue and self._busy() < self.POOL_SIZE:
            op = self.ops[self.queue.pop(0)]
            op["state"] = "done" if op["gate"].is_set() else "running"

    async def _settle(self) -> None:
        def stable() -> bool:
            for op in self.ops:
                if op["state"] == "running" and not op["entered"].is_set():
                    return False
                if (
                    op["state"] in ("done", "abandoned_done")
                    and not op["handle"].physically_complete
                ):
                    return False
            return True

        await until(stable)
        await trio.testing.wait_all_tasks_blocked(0.01)

    # --- rules ----------------------------------------------------------------------

    @rule()
    def submit(self) -> None:
        index = len(self.ops)
        entered, gate, token = threading.Event(), threading.Event(), None
        full = len(self.queue) >= self.QUEUE_SIZE + max(
            self.POOL_SIZE - self._busy(), 0
        )

        def do_submit() -> Any:
            nonlocal token
            token = CancellationToken()
            return outcome.capture(
                self.pool.submit_nowait,
                functools.partial(_blocker, entered, gate, index),
                cancellation=token,
            )

        result = self._call_sync(do_submit)
        if full:
            with pytest.raises(errors.BackpressureError):
                result.unwrap()
            return
        self.ops.append(
            {
                "handle": result.unwrap(),
                "entered": entered,
                "gate": gate,
                "token": token,
                "state": "queued",
            }
        )
        self.queue.append(index)
        self._promote()
        self._call(self._settle)

    @precondition(
        lambda self: any(
            op["state"] in ("queued", "running", "abandoned") for op in self.ops
        )
    )
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        candidates = [
            i
            for i, op in enumerate(self.ops)
            if op["state"] in ("queued", "running", "abandoned")
        ]
        index = data.draw(st.sampled_from(candidates))
        op = self.ops[index]
        op["gate"].set()
        if op["state"] == "running":
            op["state"] = "done"
        elif op["state"] == "abandoned":
            op["state"] = "abandoned_done"
        self._promote()
        self._call(self._settle)

    @precondition(
        lambda self: any(op["state"] in ("queued", "running") for op in self.ops)
    )
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        candidates = [
            i for i, op in enumerate(self.ops) if op["state"] in ("queued", "running")
        ]
        index = data.draw(st.sampled_from(candidates))
        op = self.ops[index]
        self._call_sync(op["token"].cancel)
        if op["state"] == "queued":
            op["state"] = "cancelled"
            self.queue.remove(index)
        else:
            op["state"] = "abandoned"
            self.abandoned_total += 1
        self._promote()
        self._call(self._settle)

    @invariant()
    def accounting_matches(self) -> None:
        stats = self._call_sync(self.pool.statistics)
        assert stats.active_count == self._busy()
        assert stats.queue_depth == len(self.queue)
        assert stats.abandoned_total == self.abandoned_total
        assert stats.abandoned_active_count == sum(
            op["state"] == "abandoned" for op in self.ops
        )
        for i, op in enumerate(self.ops):
            handle = op["handle"]
            match op["state"]:
                case "queued" | "running":
                    assert handle.status == "pending"
                case "done":
                    assert handle.status == "completed"
                    assert handle.result_nowait() == i
                case "cancelled" | "abandoned" | "abandoned_done":
                    assert handle.status == "cancelled"

    def teardown(self) -> None:
        for op in self.ops:
            op["gate"].set()
        if hasattr(self, "_token"):
            self._call_sync(self._stop.set)
        self._thread.join(10)
        assert self._outcome is not None
        self._outcome.unwrap()


TestPoolModel = PoolModel.TestCase
TestPoolModel.settings = settings(
    max_examples=30, stateful_step_count=12, deadline=None
)


async def test_average_wait_is_measured(engine: Engine) -> None:
    pool = engine.pool("w", size=1, queue_size=2)
    entered, gate = threading.Event(), threading.Event()
    first = pool.submit_nowait(_blocker, entered, gate, 1)
    second = pool.submit_nowait(time.monotonic)
    await until(entered.is_set)
    await trio.sleep(0.05)
    gate.set()
    await first.result()
    await second.result()
    assert pool.statistics().average_wait_seconds > 0.01


def _workers(pool_name: str) -> list[trio.lowlevel.Task]:
    """The pool's worker tasks alive now (system tasks, named for the pool)."""
    root = trio.lowlevel.current_root_task()
    assert root is not None
    return [
        task
        for nursery in root.child_nurseries
        for task in nursery.child_tasks
        if task.name == f"phronomy.pool.{pool_name}"
    ]


async def test_workers_are_reused_and_end_when_the_pool_closes(engine: Engine) -> None:
    pool = engine.pool("reuse", size=2, queue_size=4)
    for i in range(20):  # one after the other: one worker runs them all
        assert await pool.run(int, str(i)) == i
    [worker] = _workers("reuse")
    entered, gate = threading.Event(), threading.Event()
    busy = pool.submit_nowait(_blocker, entered, gate, "busy")
    await until(entered.is_set)
    assert await pool.run(int, "7") == 7  # beside a busy one: a second worker
    assert worker in _workers("reuse")
    assert len(_workers("reuse")) == 2
    gate.set()
    assert await busy.result() == "busy"
    await pool.wait_idle()
    pool.close()  # the waiting workers end; a busy one would end once done
    await trio.testing.wait_all_tasks_blocked()
    assert _workers("reuse") == []
    assert pool.statistics().completed_total == 22


async def test_a_waiting_worker_keeps_nothing_of_its_last_operation(
    engine: Engine,
) -> None:
    class Blob:
        pass

    pool = engine.pool("keep", size=1, queue_size=1)
    blob = Blob()
    gone = weakref.ref(blob)
    assert await pool.run(lambda b: b, blob) is blob
    del blob
    gc.collect()
    assert len(_workers("keep")) == 1  # it waits for the next one
    assert gone() is None  # argument and result freed with the operation


VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="unset")


async def test_each_operation_starts_from_a_clean_context(engine: Engine) -> None:
    pool = engine.pool("context", size=1, queue_size=1)

    def mark_in_thread() -> str:
        VAR.set("set in a thread")
        return VAR.get()

    handle = pool.submit_nowait(mark_in_thread)
    handle.on_complete(lambda _: VAR.set("set by a callback on the worker"))
    assert await handle.result() == "set in a thread"
    assert len(_workers("context")) == 1  # the same worker runs the next one
    assert await pool.run(VAR.get) == "unset"

    def library() -> str:
        try:
            return sniffio.current_async_library()
        except sniffio.AsyncLibraryNotFoundError:
            return "none"

    assert await pool.run(library) == "none"  # a thread, as trio.to_thread's
