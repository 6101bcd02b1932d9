"""Runtime lifecycle: shutdown, receivers' cleanup, body errors, physical quiescence."""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing

from phronomy import errors
from phronomy.engine import Engine, Event, open_engine
from phronomy.engine._shutdown import Shutdown

from .helpers import CountingSession, Other, Recorder, post


async def test_shutdown_from_the_dispatcher_is_refused(engine: Engine) -> None:
    # scenario 100
    caught: list[BaseException] = []

    class Reentrant(CountingSession):
        def start(self) -> None:
            coro = engine.shutdown()
            try:
                coro.send(None)
            except errors.ReentrancyError as exc:
                caught.append(exc)
            finally:
                coro.close()
            self.request_terminal("finished", notify_stable=False)

    await engine.register_session(Reentrant(engine)).result()
    assert len(caught) == 1
    assert engine.state == "running"


async def test_a_failing_flush_is_reported_and_later_receivers_still_flush() -> None:
    # A receiver's flush (the writes it owes at shutdown) raising does not stop the
    # others; the result says cleanup is incomplete.
    flushed: list[str] = []

    class Flushing(Recorder):
        async def flush(self) -> None:
            await trio.lowlevel.checkpoint()
            flushed.append(type(self).__name__)

    class Broken(Flushing):
        async def flush(self) -> None:
            await super().flush()
            raise OSError("disk gone")

    async with open_engine() as eng:
        eng.receiver(Broken, Broken)
        eng.receiver(Flushing, Flushing)
    assert flushed == ["Broken", "Flushing"]
    result = eng.shutdown_result
    assert result is not None
    assert result.outcome == "failed"
    assert not result.cleanup_complete
    assert isinstance(result.error, OSError)
    assert any("flushing a receiver" in note for note in result.error.__notes__)
    with pytest.raises(errors.RuntimeShutdownError):
        eng.receiver(Other, Other)


async def test_live_session_is_cut_off_at_the_deadline() -> None:
    # scenario 132, adapted: nothing outlives the async with block (DESIGN.md)
    started = time.monotonic()
    async with open_engine(shutdown_timeout=0.1) as eng:
        session = CountingSession(eng, n=2)
        waiter = eng.register_session(session)
    elapsed = time.monotonic() - started
    result = eng.shutdown_result
    assert result is not None
    assert result.dispatcher_status == "cancel_timeout"
    assert result.outcome == "terminated"
    assert f"session {session.id}" in result.cut_off
    assert waiter.done
    with pytest.raises(errors.RuntimeShutdownError):
        await waiter.result()
    assert 0.1 <= elapsed < 1.5
    assert session.done_hook_calls == 1


async def test_graceful_exit_waits_for_live_work_to_finish() -> None:
    async with open_engine(shutdown_timeout=2) as eng:
        session = CountingSession(eng, n=1)
        waiter = eng.register_session(session)
        eng.timers.schedule(
            0.05, lambda: eng.post_nowait(Event(type="late", target_id=session.id))
        )
    assert await waiter.result() == ["late"]
    assert eng.shutdown_result is not None
    assert eng.shutdown_result.clean


async def test_body_exception_propagates_unwrapped_and_cuts_off_work() -> None:
    waiters: list[Any] = []
    engines: list[Engine] = []

    async def body() -> None:
        async with open_engine() as eng:
            engines.append(eng)
            waiters.append(eng.register_session(CountingSession(eng, n=2)))
            await trio.testing.wait_all_tasks_blocked()  # the session started
            raise KeyError("body failed")

    with pytest.raises(KeyError) as caught:
        await body()
    assert not isinstance(caught.value, BaseExceptionGroup)
    with pytest.raises(errors.RuntimeShutdownError):
        await waiters[0].result()
    result = engines[0].shutdown_result
    assert result is not None
    assert result.outcome == "terminated"
    assert result.dispatcher_status == "cancel_timeout"


async def test_body_cancellation_propagates() -> None:
    # cancelled once the session is registered (a 50 ms deadline could fire before the
    # engine had opened on a loaded machine, and the test failed on an unbound name)
    with trio.CancelScope() as scope:
        async with open_engine() as eng:
            waiter = eng.register_session(CountingSession(eng, n=2))
            scope.cancel()
            await trio.sleep_forever()
    assert scope.cancelled_caught
    assert waiter.done
    assert eng.state in ("terminated", "failed")


async def test_keyboard_interrupt_from_the_body_is_not_wrapped() -> None:
    with pytest.raises(KeyboardInterrupt):
        async with open_engine():
            raise KeyboardInterrupt


async def test_stuck_worker_makes_cleanup_incomplete() -> None:
    gate = threading.Event()
    entered = threading.Event()

    def stuck() -> None:
        entered.set()
        gate.wait(10)

    async with open_engine(shutdown_timeout=0.05, cancel_grace=0.1) as eng:
        handle = eng.default_pool.submit_nowait(stuck)
        await trio.to_thread.run_sync(entered.wait)
    result = eng.shutdown_result
    assert result is not None
    assert not result.cleanup_complete
    assert result.threads_running == 1
    assert eng.state == "failed"
    gate.set()
    await handle.wait_physical()


async def test_queued_operations_are_cancelled_when_the_drain_deadline_passes() -> None:
    gate = threading.Event()
    ran = threading.Event()
    async with open_engine(shutdown_timeout=0.05, cancel_grace=2) as eng:
        pool = eng.pool("one", size=1, queue_size=4)
        blocker = pool.submit_nowait(gate.wait, 0.3)
        queued = pool.submit_nowait(ran.set)
    assert blocker.physically_complete  # waited for within the grace period
    assert isinstance(queued.error, errors.RuntimeShutdownError)
    assert not ran.is_set()
    result = eng.shutdown_result
    assert result is not None
    assert result.cleanup_complete


class _Journal:
    """Offloaded 'writes' that record when they start and end (RELIABILITY.md T11)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: list[tuple[str, str, float]] = []
        self.started = threading.Semaphore(0)

    def write(self, write_id: str, seconds: float, gate: threading.Event | None) -> str:
        with self.lock:
            self.entries.append((write_id, "start", time.monotonic()))
        self.started.release()
        if gate is not None:
            gate.wait(10)
        time.sleep(seconds)
        with self.lock:
            self.entries.append((write_id, "end", time.monotonic()))
        return write_id

    def ids(self, kind: str, *, until: float = math.inf) -> set[str]:
        with self.lock:
            return {w for w, k, t in self.entries if k == kind and t <= until}

    async def wait_started(self, n: int) -> None:
        for _ in range(n):
            await trio.to_thread.run_sync(self.started.acquire)


@pytest.mark.parametrize("seed", range(4))
async def test_terminated_is_reported_only_after_every_offloaded_write_returned(
    seed: int,
) -> None:
    # RELIABILITY.md T11: after a clean report, no write starts or finishes.
    rng = random.Random(seed)
    journal = _Journal()
    async with open_engine(shutdown_timeout=0, cancel_grace=5) as eng:
        handles = [
            eng.default_pool.submit_nowait(
                journal.write, f"w{i}", rng.uniform(0, 0.3), None
            )
            for i in range(8)
        ]
        await journal.wait_started(8)
    reported_at = time.monotonic()
    result = eng.shutdown_result
    assert result is not None
    assert result.cleanup_complete
    assert result.threads_running == 0
    assert eng.state == "terminated"
    assert (
        journal.ids("start")
        == journal.ids("end", until=reported_at)
        == {f"w{i}" for i in range(8)}
    )
    assert all(h.physically_complete for h in handles)


async def test_writes_still_running_at_the_deadline_are_reported_honestly() -> None:
    # The other outcome of T11: the report says how many writes still run.
    journal = _Journal()
    gate = threading.Event()
    async with open_engine(shutdown_timeout=0, cancel_grace=0.1) as eng:
        pool = eng.pool("writes", size=3, queue_size=2)
        running = [
            pool.submit_nowait(journal.write, f"r{i}", 0, gate) for i in range(3)
        ]
        queued = [pool.submit_nowait(journal.write, f"q{i}", 0, None) for i in range(2)]
        await journal.wait_started(3)
    result = eng.shutdown_result
    assert result is not None
    assert not result.cleanup_complete
    assert result.threads_running == 3
    assert eng.state == "failed"
    assert journal.ids("end") == set()  # nothing had finished when it reported
    for handle in queued:  # queued writes never start once the runtime closed
        assert isinstance(handle.error, errors.RuntimeShutdownError)
    gate.set()
    for handle in running:
        await handle.wait_physical()
    assert journal.ids("start") == journal.ids("end") == {"r0", "r1", "r2"}


async def test_shutdown_arguments_are_validated(engine: Engine) -> None:
    with pytest.raises(errors.InvalidInputError, match="non-negative"):
        await engine.shutdown(timeout=-1)


async def test_concurrent_shutdown_calls_share_one_result() -> None:
    results: list[Any] = []
    async with open_engine() as eng:
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(lambda: _collect(eng, results))
    assert len({id(r) for r in results}) == 1
    assert eng.shutdown_result is results[0]


async def _collect(eng: Engine, results: list[Any]) -> None:
    results.append(await eng.shutdown())


@pytest.mark.parametrize("step", ["pool.close", "pool.cancel_queued", "timers"])
async def test_a_failing_shutdown_step_is_reported_not_raised(step: str) -> None:
    # scenario 105. Before: the block raised PhronomyInternalError (without its cause),
    # shutdown_result stayed None and the state stuck at "stopping".
    boom = OSError(f"{step} failed")

    def fail(*args: object) -> None:
        raise boom

    async with open_engine(shutdown_timeout=0.5) as eng:
        pool = eng.pool("tools")
        if step == "timers":
            eng.timers.shutdown = fail  # type: ignore[method-assign]
        else:
            setattr(pool, step.split(".")[1], fail)
    result = eng.shutdown_result
    assert result is not None
    assert result.outcome == "failed"
    assert not result.cleanup_complete
    assert result.error is boom
    assert any("during runtime shutdown" in note for note in boom.__notes__)
    assert eng.state == "failed"


async def test_an_internal_failure_keeps_its_cause(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before: raise ... from None wiped the cause, leaving nothing to report.
    def broken_fail(self: object, error: BaseException) -> None:
        raise RuntimeError("a bug in the failure path") from error

    monkeypatch.setattr(Shutdown, "fail", broken_fail)

    async def run() -> None:
        async with open_engine(shutdown_timeout=0.5) as eng:
            recorder = eng.receiver(Recorder, Recorder)
            post(eng, recorder, ("raise", KeyError("original")))
            await trio.sleep_forever()

    with pytest.raises(errors.PhronomyInternalError, match="please report") as caught:
        await run()
    cause = caught.value.__cause__
    assert isinstance(cause, BaseExceptionGroup)
    leaf = cause.exceptions[0]
    assert isinstance(leaf, RuntimeError)
    assert isinstance(leaf.__cause__, KeyError)


async def test_after_threads_runs_its_cleanup_after_the_last_thread_returns() -> None:
    order: list[str] = []
    release = threading.Event()
    logged = trio.Event()

    class Logged(logging.Handler):  # the system task logs on the trio thread
        def emit(self, record: logging.LogRecord) -> None:
            order.append(record.getMessage())
            logged.set()

    def stuck() -> None:
        release.wait(10)
        order.append("thread returned")

    def cleanup() -> None:
        order.append("cleanup")
        raise OSError("cleanup failed")

    handler = Logged(logging.ERROR)
    supervision = logging.getLogger("phronomy.engine._supervision")
    supervision.addHandler(handler)
    try:
        async with open_engine(shutdown_timeout=0, cancel_grace=0) as eng:
            eng.default_pool.submit_nowait(stuck)
        try:
            await eng.after_threads(cleanup)  # returns at once: the thread still runs
            assert order == []
        finally:
            release.set()
        with trio.fail_after(5):
            await logged.wait()
    finally:
        supervision.removeHandler(handler)
    assert order == [
        "thread returned",
        "cleanup",
        "the cleanup after the last worker thread failed",
    ]


async def test_after_threads_runs_now_when_no_thread_runs_and_raises_its_error() -> (
    None
):
    async with open_engine() as eng:
        with pytest.raises(errors.InvalidInputError, match="after the engine stopped"):
            await eng.after_threads(lambda: pytest.fail("must not run"))
        await eng.default_pool.run(int)
    ran: list[int] = []
    await eng.after_threads(lambda: ran.append(threading.get_ident()))
    assert len(ran) == 1  # awaited
    assert ran[0] != threading.get_ident()  # in a worker thread

    def broken() -> None:
        raise OSError("cleanup failed")

    with pytest.raises(OSError, match="cleanup failed"):
        await eng.after_threads(broken)
