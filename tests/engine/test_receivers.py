"""Execution receivers: registration, deliveries, the admission gate, cleanup."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing

from phronomy import errors
from phronomy.engine import (
    Engine,
    Event,
    ResultHandle,
    open_engine,
)

from .helpers import CountingSession, Other, Recorder, post


async def _shutdown_in_background(
    engine: Engine, nursery: trio.Nursery, **kwargs: float
) -> trio.Event:
    done = trio.Event()

    async def run() -> None:
        await engine.shutdown(**kwargs)
        done.set()

    nursery.start_soon(run)
    with trio.fail_after(2):
        while engine.state == "running":
            await trio.lowlevel.checkpoint()
    return done


async def test_one_receiver_per_key_and_registration_closes_at_drain() -> None:
    # scenario 90
    async with open_engine() as eng, trio.open_nursery() as nursery:
        results: list[Recorder] = []

        async def get() -> None:
            await trio.lowlevel.checkpoint()
            results.append(eng.receiver(Recorder, Recorder))

        async with trio.open_nursery() as inner:
            for _ in range(8):
                inner.start_soon(get)
        assert len({id(r) for r in results}) == 1
        recorder = results[0]
        # keep the engine busy so it stays draining
        session = CountingSession(eng)
        waiter = eng.register_session(session)
        await _shutdown_in_background(eng, nursery, timeout=2)
        assert eng.state == "draining"
        assert eng.receiver(Recorder, Recorder) is recorder
        with pytest.raises(
            errors.RuntimeShutdownError,
            match="execution receivers cannot be registered",
        ):
            eng.receiver(Other, Other)
        eng.post_nowait(Event(type="finish", target_id=session.id))
        await waiter.result()
    assert eng.shutdown_result is not None
    assert eng.shutdown_result.clean


async def test_unregistered_and_foreign_receivers(engine: Engine) -> None:
    # scenario 92
    loose = Recorder(engine)
    assert not post(engine, loose, "x", admission=True)
    async with open_engine() as other_engine:
        foreign = other_engine.receiver(Recorder, Recorder)
        assert not post(engine, foreign, "x")
        with pytest.raises(ValueError, match="not registered on this engine"):
            engine.register_session(CountingSession(engine), receiver=foreign)
    assert engine.statistics().sessions == 0


async def test_queued_admission_survives_drain_and_blocks_idleness() -> None:
    # scenario 93
    async with open_engine() as eng, trio.open_nursery() as nursery:
        recorder = eng.receiver(Recorder, Recorder)
        completion: ResultHandle[Any] = ResultHandle("admission")
        # queued while running, dispatched after draining began
        assert post(eng, recorder, ("admit", 1), admission=True, caller=completion)
        done = await _shutdown_in_background(eng, nursery, timeout=2)
        assert not post(eng, recorder, ("admit", 2), admission=True)
        await trio.testing.wait_all_tasks_blocked()
        assert recorder.admitted == [("admit", 1)]
        assert not done.is_set()  # the admitted work keeps the engine busy
        assert post(eng, recorder, ("done", 1), admission=False)
        with trio.fail_after(2):
            await done.wait()
    assert not post(eng, recorder, "late", admission=False)
    # receiver shutdown ran once, with no error, off the dispatcher, after it ended
    assert recorder.shutdown_calls == [(None, False)]
    assert eng.shutdown_result is not None
    assert eng.shutdown_result.clean


async def test_continuation_cannot_admit_while_draining() -> None:
    # scenario 94
    async with open_engine() as eng, trio.open_nursery() as nursery:
        recorder = eng.receiver(Recorder, Recorder)
        session = CountingSession(eng)
        waiter = eng.register_session(session)
        await _shutdown_in_background(eng, nursery, timeout=2)
        completion: ResultHandle[Any] = ResultHandle("continuation")
        assert post(eng, recorder, ("admit", 9), admission=False, caller=completion)
        with pytest.raises(
            errors.RuntimeShutdownError,
            match=r"shutting down \(draining\); it refused new work",
        ):
            await completion.result()
        # the failed delivery failed the dispatcher: the session's waiter got the error too
        with pytest.raises(errors.RuntimeShutdownError):
            await waiter.result()
    result = eng.shutdown_result
    assert result is not None
    assert result.outcome == "failed"
    assert isinstance(result.error, errors.RuntimeShutdownError)


async def test_delivery_error_fails_the_dispatcher_and_everything_queued() -> None:
    # scenario 95
    async with open_engine() as eng:
        recorder = eng.receiver(Recorder, Recorder)
        first: ResultHandle[Any] = ResultHandle("first")
        second: ResultHandle[Any] = ResultHandle("second")
        io_error = OSError("broken pipe")
        post(eng, recorder, ("raise", io_error), admission=False, caller=first)
        post(eng, recorder, "queued", admission=False, caller=second)
        with pytest.raises(OSError) as caught:
            await first.result()
        assert caught.value is io_error
        with pytest.raises(OSError) as caught_second:
            await second.result()
        assert caught_second.value is io_error
        assert eng.state == "failed"
        assert recorder.shutdown_calls == [
            (io_error, True)
        ]  # on the failing dispatcher
        assert not eng.post_nowait(Event(type="x", target_id="y"))
        assert not post(eng, recorder, "later", admission=False)
    result = eng.shutdown_result
    assert result is not None
    assert result.outcome == "failed"
    assert result.error is io_error
    assert result.dispatcher_status == "failed"
    assert result.cleanup_complete  # cleanup can still be complete (scenario 109)
    assert len(recorder.shutdown_calls) == 1


async def test_receiver_cleanup_failure_is_reported_and_later_receivers_still_run() -> (
    None
):
    # scenario 96
    class Exploding(Recorder):
        def shutdown(self, error: BaseException | None) -> None:
            super().shutdown(error)
            raise RuntimeError("cannot clean up")

    async with open_engine() as eng:
        exploding = eng.receiver(Exploding, Exploding)
        later = eng.receiver(Recorder, Recorder)
    result = eng.shutdown_result
    assert result is not None
    assert not result.cleanup_complete
    assert result.outcome == "failed"
    assert "receiver cleanup failed" in str(result.error)
    assert len(exploding.shutdown_calls) == 1
    assert len(later.shutdown_calls) == 1


async def test_mutation_off_the_dispatcher_is_refused(engine: Engine) -> None:
    # scenario 60 (generic part)
    recorder = engine.receiver(Recorder, Recorder)
    with pytest.raises(
        errors.ReentrancyError, match="only be mutated on the runtime's dispatcher"
    ):
        recorder.deliver(("admit", 1))
    assert recorder.idle()


async def test_cut_off_work_is_described_in_the_shutdown_result() -> None:
    async with open_engine(shutdown_timeout=0.05) as eng:
        recorder = eng.receiver(Recorder, Recorder)
        post(eng, recorder, ("admit", 1), admission=True)
        session = CountingSession(eng, n=5)
        waiter = eng.register_session(session)
        await trio.testing.wait_all_tasks_blocked()
    result = eng.shutdown_result
    assert result is not None
    assert result.dispatcher_status == "cancel_timeout"
    assert "recorder busy=1" in result.cut_off
    assert f"session {session.id}" in result.cut_off
    assert not result.clean
    with pytest.raises(
        errors.RuntimeShutdownError, match="before the session finished"
    ):
        await waiter.result()
