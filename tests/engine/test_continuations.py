"""Continuations: work handed to the dispatcher at its place in the queue
(``Engine.call_soon``), events handed to a session at once from there
(``Engine.post_nowait(at_once=True)``), and the batcher handing a batch's callbacks over."""

from __future__ import annotations

import functools
import threading
from typing import Any

import outcome
import pytest
import trio

from phronomy import errors
from phronomy.engine import Batcher, Engine, Event, ResultHandle, open_engine
from phronomy.engine._messages import Continuation
from polling import until

from .helpers import CountingSession, Recorder, post


async def test_a_continuation_runs_on_the_dispatcher_in_fifo_order(
    engine: Engine,
) -> None:
    recorder = engine.receiver(Recorder, Recorder)
    after: ResultHandle[Any] = ResultHandle("after")

    def continuation() -> None:
        recorder.delivered.append(("call", engine.is_dispatcher()))

    assert post(engine, recorder, "before")
    assert engine.call_soon(continuation)
    assert post(engine, recorder, "after", caller=after)
    await until(lambda: len(recorder.delivered) == 3)
    assert recorder.delivered == ["before", ("call", True), "after"]


async def test_an_event_posted_at_once_is_handed_over_on_the_dispatcher(
    engine: Engine,
) -> None:
    session = CountingSession(engine, 3)
    engine.register_session(session)
    await until(lambda: session.started)
    order: list[str] = []

    def continuation() -> None:
        assert engine.post_nowait(Event(type="queued", target_id=session.id))
        assert engine.post_nowait(Event(type="now", target_id=session.id), at_once=True)
        order.append(",".join(e.type for e in session.seen))

    assert engine.call_soon(continuation)
    # off the dispatcher it posts, in FIFO order
    assert engine.post_nowait(Event(type="posted", target_id=session.id), at_once=True)
    await until(lambda: len(session.seen) == 3)
    assert order == ["now"]  # taken at once, before what was queued
    assert [e.type for e in session.seen] == ["now", "posted", "queued"]
    assert not engine.post_nowait(
        Event(type="late", target_id=session.id), at_once=True
    )  # ended


async def test_a_continuation_that_raises_fails_the_dispatcher() -> None:
    broken = RuntimeError("a broken continuation")

    def breaks() -> None:
        raise broken

    async with open_engine(shutdown_timeout=1.0) as engine:
        queued: ResultHandle[Any] = ResultHandle("queued")
        recorder = engine.receiver(Recorder, Recorder)
        assert engine.call_soon(breaks)
        post(engine, recorder, "queued", caller=queued)
        with pytest.raises(RuntimeError) as caught:
            await queued.result()  # what was queued behind it fails with it
        assert caught.value is broken
        assert engine.state == "failed"
        assert not engine.call_soon(lambda: None)  # refused once failed
    result = engine.shutdown_result
    assert result is not None
    assert result.error is broken


async def test_an_event_handed_over_after_the_engine_stopped_accepting_is_taken(
    engine: Engine,
) -> None:
    # Before: a continuation accepted while the engine drained, and dispatched once it
    # was stopping, had its at-once event (a terminal save's result) refused while
    # the session was live: the session was cut off with RuntimeShutdownError although
    # its save had committed. Posted directly at that moment, the event was delivered.
    session = CountingSession(engine, 2)
    handle = engine.register_session(session)
    await until(lambda: session.started)
    assert engine.post_nowait(Event(type="first", target_id=session.id))
    taken: list[bool] = []

    def result_arrives() -> None:
        event = Event(type="result", target_id=session.id)
        taken.append(engine.post_nowait(event, at_once=True))

    assert engine.call_soon(result_arrives)  # accepted ...
    engine._lifecycle.set("stopping")  # ... and dispatched once the engine stops
    await until(lambda: bool(taken))
    assert taken == [True]
    assert await handle.result() == ["first", "result"]
    assert not engine.post_nowait(Event(type="late", target_id=session.id))


async def test_a_write_submitted_while_a_failed_dispatcher_stops_is_flushed() -> None:
    # Before: what the failure's handling submitted to a batcher on the dispatcher
    # task waited for the end of a batch that never came: the batcher stayed
    # scheduled, and the write (a release owed, say) was never sent.
    written: list[int] = []
    async with open_engine(shutdown_timeout=0.5) as engine:
        batcher: Batcher[int, int] = Batcher(
            engine.pool("writes", size=1),
            lambda items: [outcome.Value(i) for i in items],
            defer=engine.at_batch_end,
            handoff=engine.call_soon,
        )

        def breaks() -> None:
            batcher.submit(1, lambda done: written.append(done.unwrap()))
            raise RuntimeError("a broken continuation")

        def write_owed() -> None:  # queued behind it: run while the engine fails
            batcher.submit(2, lambda done: written.append(done.unwrap()))

        assert engine.call_soon(breaks)
        assert engine.call_soon(write_owed)
        with trio.fail_after(5):
            await until(lambda: engine.state == "failed")
            await batcher.wait_idle()
        assert written == [1, 2]


async def test_a_continuation_queued_when_the_engine_stops_runs_at_teardown() -> None:
    ran: list[bool] = []
    async with open_engine(shutdown_timeout=1.0) as engine:
        session = CountingSession(engine, 5)
        engine.register_session(session)
        await trio.sleep(0.01)

        def cut_off_first() -> None:
            # queued behind the stop: it runs after the dispatcher stopped, and
            # what it posts then is refused
            ran.append(engine.post_nowait(Event(type="x", target_id=session.id)))

        engine._dispatcher._scope.cancel()  # the stop, at once
        await engine._dispatcher.exited.wait()
        engine._dispatcher.enqueue(  # as if queued before the stop
            Continuation(call=cut_off_first)
        )
    assert ran == [False]
    assert not engine.call_soon(lambda: None)


async def test_the_batcher_hands_a_batch_s_callbacks_over(engine: Engine) -> None:
    handed: list[int] = []

    def handoff(call: Any) -> bool:
        handed.append(1)
        return engine.call_soon(call)

    where: list[tuple[int, bool]] = []
    done = trio.Event()

    def collect(i: int, result: outcome.Outcome[int]) -> None:
        where.append((result.unwrap(), engine.is_dispatcher()))
        if len(where) == 3:
            done.set()

    batcher: Batcher[int, int] = Batcher(
        engine.pool("h", size=1),
        lambda items: [outcome.Value(i * 2) for i in items],
        handoff=handoff,
    )
    for i in (1, 2, 3):
        batcher.submit(i, functools.partial(collect, i))
    with trio.fail_after(5):
        await done.wait()
    assert handed  # one hand-off per batch
    assert [value for value, _ in where] == [2, 4, 6]
    assert all(on_dispatcher for _, on_dispatcher in where)


async def test_a_failed_batch_s_errors_are_handed_over_in_order_too(
    engine: Engine,
) -> None:
    # Before: a batch that failed ran its callbacks at once, wherever it completed,
    # possibly before the queued hand-off of the batch that completed before it.
    got: list[tuple[str, bool]] = []

    def run_batch(items: list[int]) -> list[outcome.Outcome[int]]:
        if 0 in items:
            raise OSError("the store is away")
        return [outcome.Value(i) for i in items]

    def collect(result: outcome.Outcome[int]) -> None:
        value = "error" if isinstance(result, outcome.Error) else str(result.unwrap())
        got.append((value, engine.is_dispatcher()))

    batcher: Batcher[int, int] = Batcher(
        engine.pool("f", size=1), run_batch, handoff=engine.call_soon, max_batch=1
    )
    for i in (1, 0, 2):
        batcher.submit(i, collect)
    with trio.fail_after(5):
        await until(lambda: len(got) == 3)
    assert got == [("1", True), ("error", True), ("2", True)]


async def test_a_batch_the_engine_refuses_runs_its_callbacks_at_once(
    engine: Engine,
) -> None:
    where: list[str] = []

    def collect(result: outcome.Outcome[int]) -> None:
        where.append(threading.current_thread().name if result.unwrap() else "?")

    batcher: Batcher[int, int] = Batcher(
        engine.pool("r", size=1),
        lambda items: [outcome.Value(1) for _ in items],
        handoff=lambda call: False,  # the engine no longer accepts it
    )
    batcher.submit(1, collect)
    with trio.fail_after(5):
        await batcher.wait_idle()
    assert where == [threading.main_thread().name]  # run where the batch completed
    with pytest.raises(errors.ReentrancyError):
        await trio.to_thread.run_sync(engine.call_soon, lambda: None)
