"""Dispatcher-driven timers, cancellation tokens and token deadlines."""

from __future__ import annotations

import threading

import pytest
import trio

from phronomy import errors
from phronomy.engine import CancellationToken, Engine, TimerQueue


async def test_timers_fire_in_deadline_order_and_are_isolated(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    fired: list[tuple[str, bool]] = []
    done = trio.Event()

    def boom() -> None:
        fired.append(("boom", engine.is_dispatcher()))
        raise RuntimeError("timer exploded")

    def late() -> None:
        fired.append(("late", engine.is_dispatcher()))
        done.set()

    engine.timers.schedule(0.05, late)
    engine.timers.schedule(
        0.02, lambda: fired.append(("early", engine.is_dispatcher()))
    )
    engine.timers.schedule(0.03, boom)
    with trio.fail_after(2):
        await done.wait()
    assert fired == [("early", True), ("boom", True), ("late", True)]
    assert "timer exploded" in caplog.text


async def test_cancelled_timer_does_not_fire(engine: Engine) -> None:
    fired: list[str] = []
    timer = engine.timers.schedule(0.01, lambda: fired.append("cancelled"))
    later = trio.Event()
    engine.timers.schedule(0.02, later.set)  # timers fire in deadline order
    assert engine.timers.pending_count == 2
    timer.cancel()
    assert engine.timers.pending_count == 1
    await later.wait()  # the cancelled timer's deadline passed before this one's
    assert fired == []


async def test_schedule_validates_and_refuses_after_shutdown() -> None:
    queue = TimerQueue()
    with pytest.raises(TypeError):
        queue.schedule(1, "not callable")  # type: ignore[arg-type]
    woke: list[int] = []
    queue = TimerQueue(wake=lambda: woke.append(1))
    queue.schedule(5, lambda: None)
    queue.schedule(1, lambda: None)  # earlier: wakes
    queue.schedule(9, lambda: None)  # later: no wake
    assert woke == [1, 1]
    assert queue.seconds_until_next() == pytest.approx(1, abs=0.05)
    queue.shutdown()
    assert queue.seconds_until_next() is None
    assert queue.fire_due() == 0
    with pytest.raises(
        errors.RuntimeShutdownError, match="TimerQueue has been shut down"
    ):
        queue.schedule(1, lambda: None)


async def test_a_token_deadline_settles_a_watching_operation_only_at_expiry(
    engine: Engine, autojump_clock: trio.testing.MockClock
) -> None:
    # five seconds of (fake) time: the operation is blocked in its thread throughout
    release = threading.Event()
    token = CancellationToken.after(5)
    start = trio.current_time()
    handle = await engine.default_pool.submit(release.wait, cancellation=token)
    await trio.sleep(4.9)
    early = (token.cancelled, handle.done)  # read now (a local: not narrowed later)
    assert early == (False, False)
    with trio.fail_after(1):
        with pytest.raises(errors.DeadlineExceededError):
            await handle.result()
    assert trio.current_time() - start == pytest.approx(5, abs=0.01)
    assert token.cancelled
    assert token.remaining() == 0
    release.set()
    await handle.wait_physical()  # no fail_after: the fake clock jumps past threads


async def test_token_cancel_is_idempotent_and_isolates_callbacks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    token = CancellationToken()
    calls: list[str] = []

    def bad() -> None:
        calls.append("bad")
        raise RuntimeError("cb")

    token.on_cancel(bad)
    token.on_cancel(lambda: calls.append("good"))
    removed = lambda: calls.append("removed")  # noqa: E731
    token.on_cancel(removed)
    token.remove_callback(removed)
    assert token.cancel("stop")
    assert not token.cancel("again")
    assert calls == ["bad", "good"]
    token.on_cancel(lambda: calls.append("late"))
    assert calls[-1] == "late"
    with pytest.raises(errors.CancellationError, match="halt"):
        token.raise_if_cancelled("halt")


async def test_token_deadline_without_callbacks() -> None:
    token = CancellationToken.after(10)
    remaining = token.remaining()
    assert remaining is not None
    assert 9 < remaining <= 10
    assert not token.cancelled
    past = CancellationToken(deadline=trio.current_time() - 0.1)
    assert past.cancelled
    assert past.remaining() == 0
    assert CancellationToken().remaining() is None
