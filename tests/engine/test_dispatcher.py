"""The dispatcher: posting, sessions, management messages, the terminal gate, diagnostics."""

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
    Engine,
    Event,
    EventSink,
    ExecutionReceiver,
    ResultHandle,
    SessionEnded,
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
        assert engine.post_nowait(Event(type=name, target_id=session.id))
    assert await waiter.result() == ["a", "b", "c"]
    assert session.started
    assert session.lifecycle == "completed"
    assert not engine.post_nowait(Event(type="probe", target_id=session.id))
    # a finished session's sink is refused
    assert not session.sink.post("late")


async def test_halted_session_reports_its_result(engine: Engine) -> None:
    session = CountingSession(engine, n=10)
    waiter = engine.register_session(session)
    engine.post_nowait(Event(type="halt", target_id=session.id))
    assert await waiter.result() == ["halt"]
    assert session.lifecycle == "halted"


async def test_session_error_fails_only_that_session(engine: Engine) -> None:
    # scenario 33: the loop keeps running after one session's error
    bad = CountingSession(engine)
    good = CountingSession(engine)
    bad_waiter = engine.register_session(bad)
    good_waiter = engine.register_session(good)
    engine.post_nowait(Event(type="boom", target_id=bad.id))
    engine.post_nowait(Event(type="ok", target_id=good.id))
    with pytest.raises(RuntimeError, match="deliberate error"):
        await bad_waiter.result()
    assert await good_waiter.result() == ["ok"]
    assert bad.lifecycle == "error"
    assert bad.done_hook_calls == 1
    assert engine.state == "running"


async def test_events_reach_only_admitted_sessions(engine: Engine) -> None:
    # scenario 98, adapted: an event for a session that is not (or no longer) admitted
    # is refused when posted, instead of being queued and dropped later
    assert not engine.post_nowait(Event(type="ping", target_id="nobody-here"))
    session = CountingSession(engine)
    waiter = engine.register_session(session)
    assert engine.post_nowait(Event(type="after", target_id=session.id))
    assert await waiter.result() == ["after"]
    assert not engine.post_nowait(Event(type="late", target_id=session.id))
    assert engine.statistics().dropped_total == 0


async def test_ending_a_session_unadmits_it_at_once(engine: Engine) -> None:
    session = CountingSession(engine, n=5)
    waiter = engine.register_session(session)
    assert session.sink.post("one")
    engine.end_session(
        SessionEnded(session_id=session.id, outcome="finished", result="forced")
    )
    assert not session.sink.post("x")  # refused now, before the dispatcher runs
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
            seen.append(engine.is_dispatcher())
            self.request_terminal("finished", notify_stable=False)

    await engine.register_session(Probe(engine)).result()
    assert seen == [True]
    assert not engine.is_dispatcher()
    with pytest.raises(
        errors.ReentrancyError, match="only be mutated on the runtime's dispatcher"
    ):
        engine.assert_dispatcher()


async def test_foreign_threads_post_through_the_trio_token(engine: Engine) -> None:
    session = CountingSession(engine, n=2)
    waiter = engine.register_session(session)
    event = Event(type="from-thread", target_id=session.id)

    def worker() -> list[bool]:
        with pytest.raises(errors.ReentrancyError, match=r"Engine\.post_nowait"):
            engine.post_nowait(event)
        return [
            trio.from_thread.run_sync(
                engine.post_nowait, event, trio_token=engine.trio_token
            )
            for _ in range(2)
        ]

    assert await trio.to_thread.run_sync(worker) == [True, True]
    assert await waiter.result() == ["from-thread", "from-thread"]


async def test_backlog_warning_at_most_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # scenario 99
    async with open_engine(backlog_threshold=10, backlog_interval=60) as eng:
        sink = CountingSession(eng, n=100)
        eng.register_session(sink)
        for _ in range(2):
            for _ in range(25):
                eng.post_nowait(Event(type="flood", target_id=sink.id))
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
        eng.post_nowait(Event(type="one", target_id=session.id))
        eng.post_nowait(Event(type="two", target_id=session.id))
        await waiter.result()
        # another task hogs the trio thread: the queued event starves
        other = CountingSession(eng, n=1)
        eng.register_session(other)
        await trio.testing.wait_all_tasks_blocked()
        eng.post_nowait(Event(type="starved", target_id=other.id))
        time.sleep(0.03)  # noqa: ASYNC251 - deliberately hog the trio thread
        await trio.testing.wait_all_tasks_blocked()
    text = caplog.text
    assert "dispatch of one took" in text
    assert "move blocking work to an offload pool" in text
    assert f"dispatcher starvation: starved for {other.id} waited" in text


async def test_statistics_count_dispatches_and_lag(engine: Engine) -> None:
    session = CountingSession(engine, n=50)
    waiter = engine.register_session(session)
    for i in range(50):
        engine.post_nowait(Event(type=f"e{i}", target_id=session.id))
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
        self.values: list[Any] = []

    def start(
        self, *, terminal_type: TerminalType, value: Any, sink: EventSink
    ) -> None:
        self.started.append(terminal_type)
        self.values.append(value)

    def handles(self, event: Event) -> bool:
        return event.type == "persisted"

    def decision_for(self, event: Event) -> TerminalDecision:
        if event.payload == "weird":
            raise errors.PhronomyError("unknown terminal persistence outcome")
        return event.payload  # type: ignore[no-any-return]


class Retirees(ExecutionReceiver):
    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self.retired: list[tuple[str, ResultHandle[Any] | None]] = []
        self.errors: list[BaseException | None] = []

    def idle(self) -> bool:
        return True

    def deliver(self, message: Any) -> None:
        raise AssertionError("unused")

    def shutdown(self, error: BaseException | None) -> None:
        for _, waiter in self.retired:
            if waiter is not None:
                waiter.fail(errors.RecoveryRequiredError("cleared at shutdown"))

    def session_retired(
        self,
        session_id: str,
        *,
        waiter: ResultHandle[Any] | None,
        error: BaseException | None,
    ) -> None:
        self.retired.append((session_id, waiter))
        self.errors.append(error)


async def test_gate_waits_for_the_policy_and_ignores_events_meanwhile(
    engine: Engine,
) -> None:
    policy = Policy()
    session = CountingSession(engine, n=1, policy=policy)
    waiter = engine.register_session(session)
    # a policy result before any terminal request is ignored (scenario 86)
    engine.post_nowait(
        Event(
            type="persisted",
            target_id=session.id,
            payload=TerminalDecision(action="complete"),
        )
    )
    engine.post_nowait(Event(type="go", target_id=session.id))
    engine.post_nowait(Event(type="ignored-while-awaiting", target_id=session.id))
    await trio.testing.wait_all_tasks_blocked()
    assert policy.started == ["finished"]
    waiting = (session.lifecycle, waiter.done)  # a local: not narrowed below
    assert waiting == ("awaiting_terminal", False)
    assert session.sink.post("persisted", TerminalDecision(action="complete"))
    assert await waiter.result() == ["go"]
    assert session.lifecycle == "completed"


async def test_gate_fail_decision_and_default_error(engine: Engine) -> None:
    # scenario 88: a fail decision without error becomes a PhronomyError
    session = CountingSession(engine, n=1, policy=Policy())
    waiter = engine.register_session(session)
    engine.post_nowait(Event(type="go", target_id=session.id))
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
    engine.post_nowait(Event(type="go", target_id=session.id))
    await trio.testing.wait_all_tasks_blocked()
    session.sink.post("persisted", "weird")
    with pytest.raises(
        errors.PhronomyError, match="unknown terminal persistence outcome"
    ):
        await waiter.result()


async def test_gate_retire_hands_the_waiter_to_the_receiver(engine: Engine) -> None:
    owner = engine.receiver("retirees", Retirees)
    session = CountingSession(engine, n=1, policy=Policy())
    waiter = engine.register_session(session, receiver=owner)
    engine.post_nowait(Event(type="go", target_id=session.id))
    await trio.testing.wait_all_tasks_blocked()
    uncertain = OSError("connection lost mid-commit")
    session.sink.post("persisted", TerminalDecision(action="retire", error=uncertain))
    await trio.testing.wait_all_tasks_blocked()
    assert session.lifecycle == "retired"
    assert owner.retired == [(session.id, waiter)]
    assert owner.errors == [uncertain]
    assert not waiter.done
    assert not engine.post_nowait(Event(type="probe", target_id=session.id))
    assert engine.statistics().sessions == 0


async def test_gate_policy_start_failure_fails_the_session(engine: Engine) -> None:
    class Refusing(Policy):
        def start(
            self, *, terminal_type: TerminalType, value: Any, sink: EventSink
        ) -> None:
            raise errors.BackpressureError("OffloadPool queue is full (depth: 1)")

    session = CountingSession(engine, n=1, policy=Refusing())
    waiter = engine.register_session(session)
    engine.post_nowait(Event(type="go", target_id=session.id))
    with pytest.raises(errors.BackpressureError):
        await waiter.result()


async def test_register_after_shutdown_is_refused() -> None:
    async with open_engine() as eng:
        pass
    with pytest.raises(
        errors.RuntimeShutdownError, match="new sessions are not accepted"
    ):
        eng.register_session(CountingSession(eng))
    assert not eng.post_nowait(Event(type="x", target_id="y"))
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
    engine.post_nowait(Event(type="go", target_id=session.id))
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


async def test_an_event_for_a_session_registered_in_the_same_batch_is_not_dropped(
    engine: Engine,
) -> None:
    # Sessions registered on the dispatcher start at the end of its batch; an event
    # posted to one before that starts it first instead of being dropped.
    from phronomy.engine import Delivery, ExecutionReceiver

    sessions: list[CountingSession] = []

    class Registrar(ExecutionReceiver):
        def idle(self) -> bool:
            return True

        def shutdown(self, error: BaseException | None) -> None:
            pass

        def deliver(self, message: Any) -> None:
            session = CountingSession(engine)
            sessions.append(session)
            self.engine.register_session(session)
            assert self.engine.post_nowait(Event(type="first", target_id=session.id))

    registrar = engine.receiver(Registrar, Registrar)
    engine.post_nowait(Delivery(receiver=registrar, message="go"))
    with trio.fail_after(5):
        while not sessions or not sessions[0].done:  # noqa: ASYNC110 - dispatcher state
            await trio.lowlevel.checkpoint()
    (session,) = sessions
    assert session.started
    assert [e.type for e in session.seen] == ["first"]
    assert engine.statistics().dropped_total == 0
