"""The dispatcher: posting, sessions, management events, diagnostics (spec §2.6, §2.8.7)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing

from phronomy import errors
from phronomy.engine import (
    SYSTEM_CHANNEL,
    Engine,
    Event,
    ExecutionReceiver,
    GatedSession,
    ResultHandle,
    SessionOutcome,
    TerminalDecision,
    TerminalType,
    open_engine,
)

from .helpers import CountingSession


async def test_session_receives_events_in_fifo_order_and_finishes(
    engine: Engine,
) -> None:
    session = CountingSession(engine, n=3)
    waiter = engine.register_session(session)
    for name in ("a", "b", "c"):
        assert engine.post(Event(type=name, target_id=session.id))
    assert await waiter.result() == ["a", "b", "c"]
    assert session.started
    assert session.lifecycle == "completed"
    assert not engine.is_session_admitted(session.id)
    # a finished session's sink is refused
    assert not session.sink.post("late")


async def test_halted_session_reports_its_result(engine: Engine) -> None:
    session = CountingSession(engine, n=10)
    waiter = engine.register_session(session)
    engine.post(Event(type="halt", target_id=session.id))
    assert await waiter.result() == ["halt"]
    assert session.lifecycle == "halted"


async def test_session_error_fails_only_that_session(engine: Engine) -> None:
    # scenario 33: the loop keeps running after one session's error
    bad = CountingSession(engine)
    good = CountingSession(engine)
    bad_waiter = engine.register_session(bad)
    good_waiter = engine.register_session(good)
    engine.post(Event(type="boom", target_id=bad.id))
    engine.post(Event(type="ok", target_id=good.id))
    with pytest.raises(RuntimeError, match="deliberate error"):
        await bad_waiter.result()
    assert await good_waiter.result() == ["ok"]
    assert bad.lifecycle == "error"
    assert bad.done_hook_calls == 1
    assert engine.state == "running"


async def test_unknown_target_is_dropped_with_a_warning(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    # scenario 98
    assert engine.post(Event(type="ping", target_id="nobody-here"))
    session = CountingSession(engine)
    waiter = engine.register_session(session)
    engine.post(Event(type="after", target_id=session.id))
    assert await waiter.result() == ["after"]
    assert "'ping'" in caplog.text
    assert "'nobody-here'" in caplog.text
    assert engine.statistics().dropped_total == 1


async def test_post_to_session_requires_an_admitted_target(engine: Engine) -> None:
    assert not engine.post_to_session(Event(type="x", target_id="unknown"))
    with pytest.raises(ValueError, match="system channel"):
        engine.post_to_session(Event(type="x", target_id=SYSTEM_CHANNEL))


async def test_terminal_management_event_unadmits_at_post_time(engine: Engine) -> None:
    session = CountingSession(engine, n=5)
    waiter = engine.register_session(session)
    assert engine.is_session_admitted(session.id)
    engine.post(
        Event(
            type="finished",
            target_id=SYSTEM_CHANNEL,
            payload=SessionOutcome(session_id=session.id, result="forced"),
        )
    )
    assert not engine.is_session_admitted(session.id)
    assert not session.sink.post("x")
    assert await waiter.result() == "forced"


async def test_duplicate_registration_is_refused(engine: Engine) -> None:
    session = CountingSession(engine)
    engine.register_session(session)
    with pytest.raises(errors.PhronomyError, match="already registered"):
        engine.register_session(session)


async def test_registration_with_foreign_receiver_is_refused(engine: Engine) -> None:
    class Loose(ExecutionReceiver):
        def idle(self) -> bool:
            return True

    with pytest.raises(ValueError, match="not registered"):
        engine.register_session(CountingSession(engine), receiver=Loose(engine))


async def test_is_dispatcher_distinguishes_tasks(engine: Engine) -> None:
    seen: list[bool] = []

    class Probe(CountingSession):
        def start(self) -> None:
            seen.append(self.engine.is_dispatcher())
            self.request_terminal("finished", notify_stable=False)

    await engine.register_session(Probe(engine)).result()
    assert seen == [True]
    assert not engine.is_dispatcher()
    with pytest.raises(
        errors.DispatcherOnlyError, match="only be mutated on the runtime's dispatcher"
    ):
        engine.assert_dispatcher()


async def test_foreign_threads_post_through_the_trio_token(engine: Engine) -> None:
    session = CountingSession(engine, n=2)
    waiter = engine.register_session(session)
    event = Event(type="from-thread", target_id=session.id)
    errors_seen: list[BaseException] = []

    def worker() -> list[bool]:
        try:
            engine.post(event)
        except errors.ReentrancyError as exc:
            errors_seen.append(exc)
        return [engine.post_from_thread(event), engine.post_from_thread(event)]

    assert await trio.to_thread.run_sync(worker) == [True, True]
    assert await waiter.result() == ["from-thread", "from-thread"]
    assert len(errors_seen) == 1
    with pytest.raises(errors.ReentrancyError, match="use post"):
        engine.post_from_thread(event)


async def test_post_from_thread_after_the_run_returns_false() -> None:
    holder: dict[str, Engine] = {}

    async def main() -> None:
        async with open_engine() as eng:
            holder["engine"] = eng

    await trio.to_thread.run_sync(trio.run, main)
    results: list[bool] = []
    event = Event(type="x", target_id="y")
    thread = threading.Thread(
        target=lambda: results.append(holder["engine"].post_from_thread(event))
    )
    thread.start()
    await trio.to_thread.run_sync(thread.join)
    assert results == [False]


async def test_backlog_warning_at_most_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # scenario 99
    async with open_engine(backlog_threshold=10, backlog_interval=60) as eng:
        for _ in range(2):
            for _ in range(25):
                eng.post(Event(type="flood", target_id="nobody"))
            await trio.testing.wait_all_tasks_blocked()  # the flood was dispatched
    warnings = [r for r in caplog.records if "dispatcher backlog" in r.getMessage()]
    assert len(warnings) == 1
    assert "threshold=10" in warnings[0].getMessage()
    assert "event=flood" in warnings[0].getMessage()


async def test_starvation_and_long_dispatch_warnings(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Slow(CountingSession):
        def handle_live(self, event: Event) -> None:
            time.sleep(0.03)
            super().handle_live(event)

    async with open_engine(starvation_threshold=0.01, dispatch_threshold=0.01) as eng:
        session = Slow(eng, n=2)
        waiter = eng.register_session(session)
        eng.post(Event(type="one", target_id=session.id))
        eng.post(Event(type="two", target_id=session.id))
        await waiter.result()
        # another task hogs the trio thread: the queued event starves
        eng.post(Event(type="starved", target_id="gone"))
        time.sleep(0.03)  # noqa: ASYNC251 - deliberately hog the trio thread
        await trio.testing.wait_all_tasks_blocked()
    text = caplog.text
    assert "dispatch of one took" in text
    assert "move blocking work to an offload pool" in text
    assert "dispatcher starvation: starved for gone waited" in text


async def test_statistics_count_dispatches_and_lag(engine: Engine) -> None:
    session = CountingSession(engine, n=50)
    waiter = engine.register_session(session)
    for i in range(50):
        engine.post(Event(type=f"e{i}", target_id=session.id))
    before = engine.statistics()
    assert before.queue_depth >= 50
    await waiter.result()
    stats = engine.statistics()
    assert stats.dispatched_total >= 51
    assert stats.max_queue_depth >= 50
    assert stats.queue_depth == 0
    assert stats.max_lag_seconds >= stats.average_lag_seconds > 0
    assert stats.sessions == 0
    assert stats.state == "running"


# --- the terminal gate ----------------------------------------------------------------


class Policy:
    """A terminal policy whose decisions the test controls."""

    def __init__(self) -> None:
        self.started: list[TerminalType] = []
        self.sessions: list[GatedSession] = []

    def start(self, *, terminal_type: TerminalType, session: GatedSession) -> None:
        self.started.append(terminal_type)
        self.sessions.append(session)

    def handles(self, event: Event) -> bool:
        return event.type == "persisted"

    def decision_for(self, event: Event) -> TerminalDecision:
        if event.payload == "weird":
            raise errors.PhronomyError("unknown terminal persistence outcome")
        return event.payload  # type: ignore[no-any-return]


class Retirees(ExecutionReceiver):
    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self.retired: list[tuple[str, str, ResultHandle[Any] | None]] = []
        self.errors: list[BaseException | None] = []

    def idle(self) -> bool:
        return True

    def deliver(self, message: Any) -> None:
        raise AssertionError("unused")

    def shutdown(self, error: BaseException | None) -> None:
        for _, _, waiter in self.retired:
            if waiter is not None:
                waiter.fail(errors.RecoveryRequiredError("cleared at shutdown"))

    def session_retired(
        self,
        session_id: str,
        *,
        reason: str,
        waiter: ResultHandle[Any] | None,
        error: BaseException | None,
    ) -> None:
        self.retired.append((session_id, reason, waiter))
        self.errors.append(error)


async def test_gate_waits_for_the_policy_and_ignores_events_meanwhile(
    engine: Engine,
) -> None:
    policy = Policy()
    session = CountingSession(engine, n=1, policy=policy)
    waiter = engine.register_session(session)
    # a policy result before any terminal request is ignored (scenario 86)
    engine.post(
        Event(
            type="persisted",
            target_id=session.id,
            payload=TerminalDecision(action="complete"),
        )
    )
    engine.post(Event(type="go", target_id=session.id))
    engine.post(Event(type="ignored-while-awaiting", target_id=session.id))
    await trio.testing.wait_all_tasks_blocked()
    assert policy.started == ["finished"]
    assert session.lifecycle == "awaiting_terminal"
    assert not waiter.done
    assert session.sink.post("persisted", TerminalDecision(action="complete"))
    assert await waiter.result() == ["go"]
    assert session.lifecycle == "completed"


async def test_gate_fail_decision_and_default_error(engine: Engine) -> None:
    # scenario 88: a fail decision without error becomes a PhronomyError
    session = CountingSession(engine, n=1, policy=Policy())
    waiter = engine.register_session(session)
    engine.post(Event(type="go", target_id=session.id))
    await trio.testing.wait_all_tasks_blocked()
    session.sink.post("persisted", TerminalDecision(action="fail"))
    session.sink.post(
        "persisted", TerminalDecision(action="fail", error=ValueError("second"))
    )
    with pytest.raises(errors.PhronomyError, match="terminal persistence failed"):
        await waiter.result()


async def test_gate_unknown_outcome_becomes_the_session_error(engine: Engine) -> None:
    # scenario 87
    session = CountingSession(engine, n=1, policy=Policy())
    waiter = engine.register_session(session)
    engine.post(Event(type="go", target_id=session.id))
    await trio.testing.wait_all_tasks_blocked()
    session.sink.post("persisted", "weird")
    with pytest.raises(
        errors.PhronomyError, match="unknown terminal persistence outcome"
    ):
        await waiter.result()


async def test_gate_retire_hands_the_waiter_to_the_receiver(engine: Engine) -> None:
    owner = engine.register_receiver("retirees", Retirees(engine))
    session = CountingSession(engine, n=1, policy=Policy())
    waiter = engine.register_session(session, receiver=owner)
    engine.post(Event(type="go", target_id=session.id))
    await trio.testing.wait_all_tasks_blocked()
    uncertain = OSError("connection lost mid-commit")
    session.sink.post("persisted", TerminalDecision(action="retire", error=uncertain))
    await trio.testing.wait_all_tasks_blocked()
    assert session.lifecycle == "retired"
    assert owner.retired == [(session.id, "recovery_required", waiter)]
    assert owner.errors == [uncertain]
    assert not waiter.done
    assert not engine.is_session_admitted(session.id)
    assert engine.statistics().sessions == 0


async def test_gate_policy_start_failure_fails_the_session(engine: Engine) -> None:
    class Refusing(Policy):
        def start(self, *, terminal_type: TerminalType, session: GatedSession) -> None:
            raise errors.BackpressureError("OffloadPool queue is full (depth: 1)")

    session = CountingSession(engine, n=1, policy=Refusing())
    waiter = engine.register_session(session)
    engine.post(Event(type="go", target_id=session.id))
    with pytest.raises(errors.BackpressureError):
        await waiter.result()


async def test_register_after_shutdown_is_refused() -> None:
    async with open_engine() as eng:
        pass
    with pytest.raises(
        errors.RuntimeShutdownError, match="new sessions are not accepted"
    ):
        eng.register_session(CountingSession(eng))
    assert not eng.post(Event(type="x", target_id="y"))
    with pytest.raises(errors.RuntimeShutdownError):
        eng.start_task(trio.sleep, 0)


async def test_wake_from_another_task_recomputes_the_timer_wait(engine: Engine) -> None:
    fired = trio.Event()
    # the dispatcher is blocked in receive(); scheduling from this task must wake it
    engine.timers.schedule(0.01, fired.set)
    with trio.fail_after(2):
        await fired.wait()


async def test_supervised_task_completes_fails_and_cancels(engine: Engine) -> None:
    async def value() -> int:
        await trio.lowlevel.checkpoint()
        return 5

    async def boom() -> None:
        raise KeyError("k")

    started = trio.Event()

    async def forever() -> None:
        started.set()
        await trio.sleep_forever()

    assert await engine.start_task(value).result() == 5
    with pytest.raises(KeyError):
        await engine.start_task(boom).result()
    handle = engine.start_task(forever)
    await started.wait()
    handle.cancel()
    await handle.wait_physical()
    assert handle.status == "cancelled"
    assert engine.statistics().supervised_tasks == 0


async def test_threads_see_a_non_dispatcher_identity(engine: Engine) -> None:
    assert not await trio.to_thread.run_sync(
        lambda: threading.current_thread() is threading.main_thread()
    )


async def test_a_session_retired_without_a_receiver_settles_its_waiter(
    engine: Engine,
) -> None:
    # Before: nobody owned the retired session, so its waiter stayed pending forever.
    policy = Policy()
    session = CountingSession(engine, n=1, policy=policy)
    waiter = engine.register_session(session)
    engine.post(Event(type="go", target_id=session.id))
    await trio.testing.wait_all_tasks_blocked()
    uncertain = OSError("commit outcome unknown")
    session.sink.post("persisted", TerminalDecision(action="retire", error=uncertain))
    with (
        trio.fail_after(5),
        pytest.raises(errors.RecoveryRequiredError, match="unknown") as caught,
    ):
        await waiter.result()
    assert caught.value.__cause__ is uncertain
    assert session.lifecycle == "retired"
