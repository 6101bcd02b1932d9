"""Durable timers as users meet them: wait-state timeouts that escalate after days (on
the test clock), disarming, stale visits, ``effects.schedule`` across restarts, keys,
cancellation, live timeouts, diagrams and bad input."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.testing

import phronomy
from phronomy.storage import InboxEntry, Posting, PostOp, StoredTimer, TimersOp
from phronomy.testing import TestClock
from records import loaded

from .helpers import runtime_on as _runtime_on, until

if TYPE_CHECKING:
    from collections.abc import Callable

DAY = timedelta(days=1)


def runtime_on(store: phronomy.storage.BaseStore[Any], **kw: Any) -> Any:
    """A runtime that polls every 20 ms (a timer fires within that of its due time)."""
    return _runtime_on(
        store, inbox_poll_interval=kw.pop("inbox_poll_interval", 0.02), **kw
    )


@pytest.fixture
def clock() -> trio.testing.MockClock:
    """trio's clock for these tests: real time, plus the jumps a test makes."""
    return trio.testing.MockClock(rate=1)


@pytest.fixture
def test_clock(clock: trio.testing.MockClock) -> TestClock:
    return TestClock(clock)


@pytest.fixture(params=["memory", "sqlite"])
def timed_store(
    request: pytest.FixtureRequest,
    tmp_path: Any,
    test_clock: TestClock,
    open_sqlite: Callable[..., phronomy.SQLiteStore],
) -> phronomy.storage.BaseStore[Any]:
    if request.param == "memory":
        return phronomy.MemoryStore(clock=test_clock)
    return open_sqlite(tmp_path / "timers.db", clock=test_clock)


class Expense(phronomy.State):
    amount: int = 0
    escalated: int = 0
    reminded: int = 0
    visits: int = 0


def expense_flow(*, remind: bool = False) -> phronomy.WorkflowDefinition[Expense]:
    """awaiting (wait) -approve-> FINISH; after 2 days -> escalated (wait); a bounce
    through review comes back to awaiting (a new visit)."""

    def enter_awaiting(s: Expense, _event: Any, effects: Any) -> Expense:
        if remind:
            effects.schedule(timedelta(hours=12), "remind", {"n": 1}, key="reminder")
        return s.merge(visits=s.visits + 1)

    wf = phronomy.Workflow(Expense, name="expense")
    wf.wait_state("awaiting")
    wf.entry("awaiting", enter_awaiting)
    wf.wait_state("review")
    wf.wait_state("escalated")
    wf.transition("awaiting", phronomy.FINISH, on="approve")
    wf.transition(
        "awaiting",
        "escalated",
        after=timedelta(days=2),
        action=lambda s: s.merge(escalated=s.escalated + 1),
    )
    wf.transition(
        "awaiting",
        "awaiting",
        on="remind",
        action=lambda s: s.merge(reminded=s.reminded + 1),
    )
    wf.wait_state("quiet")
    wf.transition(
        "awaiting",
        "quiet",
        on="forget",
        action=lambda s, e, effects: effects.cancel_timer("reminder"),
    )
    wf.transition(
        "awaiting",
        "quiet",
        on="hush",
        action=lambda s, e, effects: effects.schedule(DAY, "remind", key="nudge"),
    )
    wf.transition("quiet", "awaiting", on="remind")
    wf.transition("awaiting", "review", on="bounce")
    wf.transition("review", "awaiting", on="back")
    wf.transition("escalated", phronomy.FINISH, on="approve")
    return wf.build()


def _timers(store: phronomy.storage.BaseStore[Any], iid: str) -> list[StoredTimer]:
    return list(store.run(TimersOp(workflow_instance_id=iid)))


async def _events(rt: phronomy.Runtime, iid: str) -> list[InboxEntry]:
    history = await rt.workflows.history(iid)
    entries = [e for e in history if isinstance(e, InboxEntry)]
    return sorted(entries, key=lambda e: e.seq)


async def _settle(store: phronomy.storage.BaseStore[Any], iid: str, **want: Any) -> Any:
    """The row once it shows *want* (the poll fires timers every 0.1 s)."""
    await until(
        lambda: all(getattr(loaded(store, iid), k) == v for k, v in want.items())
    )
    return loaded(store, iid)


async def test_a_wait_state_timeout_escalates_after_two_days_of_test_clock(
    timed_store: phronomy.storage.BaseStore[Any], test_clock: TestClock
) -> None:
    flow = expense_flow()
    async with runtime_on(timed_store, workflows=[flow]) as rt:
        halted = await rt.workflows.invoke(flow, workflow_instance_id="x-1")
        assert (halted.phase, halted.revision) == ("awaiting", 1)
        (timer,) = _timers(timed_store, "x-1")
        assert (timer.kind, timer.state, timer.armed_revision) == (
            "timeout",
            "awaiting",
            1,
        )
        assert timer.due_at_ms - timer.armed_at_ms == 2 * 86_400_000
        test_clock.skip(DAY + timedelta(hours=23))
        await trio.sleep(0.1)  # polls run: nothing is due yet
        assert loaded(timed_store, "x-1").revision == 1
        test_clock.skip(timedelta(hours=1))
        row = await _settle(timed_store, "x-1", phase="escalated")
        assert (row.status, row.revision) == ("halted", 2)
        assert _timers(timed_store, "x-1") == []
        (fired,) = await _events(rt, "x-1")
        assert fired.event_id == "timer:after:172800000:awaiting@1"
        assert (fired.status, fired.revision) == ("transitioned", 2)
        result = await rt.workflows.send_event(
            flow, "approve", workflow_instance_id="x-1"
        )
        assert result.state.escalated == 1  # the timeout's action ran once
        assert result.phase == phronomy.FINISH


async def test_an_event_before_the_timeout_disarms_it_and_it_never_fires(
    timed_store: phronomy.storage.BaseStore[Any], test_clock: TestClock
) -> None:
    flow = expense_flow()
    async with runtime_on(timed_store, workflows=[flow]) as rt:
        await rt.workflows.invoke(flow, workflow_instance_id="x-2")
        test_clock.skip(DAY)
        await rt.workflows.send_event(
            flow, "bounce", workflow_instance_id="x-2"
        )  # leaves awaiting
        assert _timers(timed_store, "x-2") == []
        test_clock.skip(3 * DAY)
        await trio.sleep(0.1)
        row = loaded(timed_store, "x-2")
        assert (row.phase, row.revision) == ("review", 2)
        assert [e.event for e in await _events(rt, "x-2")] == ["bounce"]


async def test_a_timeout_never_fires_into_a_later_visit_of_its_state(
    timed_store: phronomy.storage.BaseStore[Any], test_clock: TestClock
) -> None:
    flow = expense_flow()
    async with runtime_on(timed_store, workflows=[flow]) as rt:
        await rt.workflows.invoke(flow, workflow_instance_id="x-3")  # visit 1
        test_clock.skip(timedelta(hours=36))
        await rt.workflows.send_event(flow, "bounce", workflow_instance_id="x-3")
        await rt.workflows.send_event(
            flow, "back", workflow_instance_id="x-3"
        )  # visit 2, revision 3
        (timer,) = _timers(timed_store, "x-3")
        assert timer.armed_revision == 3
        test_clock.skip(timedelta(hours=13))  # visit 1's timeout would be due now
        await trio.sleep(0.1)
        assert loaded(timed_store, "x-3").phase == "awaiting"
        test_clock.skip(timedelta(hours=36))  # visit 2's is
        row = await _settle(timed_store, "x-3", phase="escalated")
        assert row.revision == 4
        assert row.snapshot is not None


async def test_a_fired_timeout_of_another_visit_is_dropped_not_applied(
    timed_store: phronomy.storage.BaseStore[Any],
) -> None:
    flow = expense_flow()
    async with runtime_on(timed_store, workflows=[flow]) as rt:
        await rt.workflows.invoke(flow, workflow_instance_id="x-4")
        await rt.workflows.send_event(flow, "bounce", workflow_instance_id="x-4")
        await rt.workflows.send_event(
            flow, "back", workflow_instance_id="x-4"
        )  # revision 3
        # fired timeouts of a state the instance left, and of no visit it had
        # (the save that leaves a state refuses its fired entries: these cannot
        # happen but by hand)
        stale = [
            Posting(
                workflow_instance_id="x-4",
                event_id=event_id,
                event="__after_172800000ms__",
                payload=b"null",
            )
            for event_id in (
                "timer:after:172800000:review@2",
                "timer:after:172800000:awaiting@9",
            )
        ]
        for posting in stale:
            assert timed_store.run(PostOp(posting=posting)).outcome == "stored"

        def judged() -> list[InboxEntry]:
            entries = timed_store.run(
                phronomy.storage.InboxOp(workflow_instance_id="x-4", pending_only=False)
            )
            return [e for e in entries if e.event_id.startswith("timer:")]

        await until(lambda: all(e.status != "pending" for e in judged()) and judged())
        details = sorted((e.status, e.detail or "") for e in judged())
        assert [status for status, _ in details] == ["dropped", "dropped"]
        assert "state 'review' was armed at revision 2" in details[1][1]
        assert "state 'awaiting' was armed at revision 9" in details[0][1]
        row = loaded(timed_store, "x-4")
        assert (row.phase, row.revision) == ("awaiting", 3)
        # a caller may not send a timeout's event itself
        with pytest.raises(phronomy.InvalidInputError, match="Unknown event"):
            await rt.workflows.post(flow, "x-4", "__after_172800000ms__")


async def test_an_actions_timer_survives_a_restart_and_fires_once(
    timed_store: phronomy.storage.BaseStore[Any], test_clock: TestClock
) -> None:
    flow = expense_flow(remind=True)
    async with runtime_on(timed_store, workflows=[flow]) as rt:
        await rt.workflows.invoke(flow, workflow_instance_id="r-1")
    names = sorted(t.name for t in _timers(timed_store, "r-1"))
    assert names == ["after:172800000:awaiting", "key:reminder"]
    test_clock.skip(timedelta(hours=12))
    async with runtime_on(timed_store, workflows=[flow]) as rt:  # another runtime
        row = await _settle(timed_store, "r-1", revision=2)
        state = phronomy.storage.decode_snapshot(
            row.snapshot, workflow_instance_id="r-1", revision=2, state_type=Expense
        ).fields
        assert (state.reminded, state.visits) == (1, 2)
        # the reminder's transition re-entered awaiting: a new visit, new timers
        timers = {t.name: t for t in _timers(timed_store, "r-1")}
        assert {t.armed_revision for t in timers.values()} == {2}
        (fired,) = await _events(rt, "r-1")
        assert (fired.event, fired.payload, fired.status) == (
            "remind",
            b'{"n":1}',
            "transitioned",
        )


async def test_cancel_timer_disarms_a_stored_timer_by_key(
    timed_store: phronomy.storage.BaseStore[Any], test_clock: TestClock
) -> None:
    flow = expense_flow(remind=True)
    async with runtime_on(timed_store, workflows=[flow]) as rt:
        await rt.workflows.invoke(flow, workflow_instance_id="r-2")
        await rt.workflows.invoke(flow, workflow_instance_id="r-3")
        await rt.workflows.send_event(flow, "forget", workflow_instance_id="r-2")
        await rt.workflows.send_event(flow, "hush", workflow_instance_id="r-3")
        # leaving awaiting disarms its timeout; an action's timer stays armed until
        # it fires or is cancelled
        assert _timers(timed_store, "r-2") == []
        assert sorted(t.name for t in _timers(timed_store, "r-3")) == [
            "key:nudge",
            "key:reminder",
        ]
        test_clock.skip(timedelta(hours=12))
        await _settle(timed_store, "r-3", phase="awaiting", revision=3)
        await trio.sleep(0.1)
        assert loaded(timed_store, "r-2").phase == "quiet"


async def test_a_closed_instance_drops_its_timers_and_none_fires(
    timed_store: phronomy.storage.BaseStore[Any], test_clock: TestClock
) -> None:
    flow = expense_flow(remind=True)
    async with runtime_on(timed_store, workflows=[flow]) as rt:
        await rt.workflows.invoke(flow, workflow_instance_id="c-1")
        await rt.workflows.invoke(flow, workflow_instance_id="c-2")
        assert len(_timers(timed_store, "c-1")) == 2
        await rt.workflows.cancel(flow, "c-1", reason="withdrawn")
        await rt.workflows.send_event(flow, "approve", workflow_instance_id="c-2")
        assert _timers(timed_store, "c-1") == _timers(timed_store, "c-2") == []
        test_clock.skip(3 * DAY)
        await trio.sleep(0.1)
        assert (
            loaded(timed_store, "c-1").status,
            loaded(timed_store, "c-1").revision,
        ) == (
            "cancelled",
            2,
        )
        assert [e.event for e in await _events(rt, "c-2")] == ["approve"]


class Charge(phronomy.State):
    outcome: str = ""


async def _never(*_: Any) -> None:
    await trio.sleep_forever()


def charging_flow() -> phronomy.WorkflowDefinition[Charge]:
    """charging (live: waits for its effect) times out after 0.2 s."""
    wf = phronomy.Workflow(Charge, name="charging")
    wf.state(
        "charging",
        entry=lambda s, e, effects: effects.start_soon(_never, on_done="charged"),
    )
    wf.transition(
        "charging",
        phronomy.FINISH,
        on="charged",
        action=lambda s: s.merge(outcome="charged"),
    )
    wf.transition(
        "charging",
        phronomy.FINISH,
        after=0.2,
        action=lambda s: s.merge(outcome="timed out"),
    )
    return wf.build()


async def test_a_live_states_timeout_runs_in_its_segment(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    flow = charging_flow()
    store = make_store()
    async with runtime_on(store, workflows=[flow]) as rt:
        with trio.fail_after(5):
            result = await rt.workflows.invoke(flow, workflow_instance_id="ch-1")
        assert (result.phase, result.state.outcome) == (phronomy.FINISH, "timed out")
    async with phronomy.open_runtime() as memory:  # in memory: the same
        with trio.fail_after(5):
            result = await memory.workflows.invoke(flow)
        assert result.state.outcome == "timed out"


async def test_timers_fire_on_every_store_in_real_time(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    wf = phronomy.Workflow(Expense, name="quick")
    wf.wait_state("awaiting")
    wf.transition("awaiting", phronomy.FINISH, after=0.3)
    flow = wf.build()
    store = make_store()
    async with runtime_on(store, workflows=[flow]) as rt:
        started = trio.current_time()
        await rt.workflows.invoke(flow, workflow_instance_id="q-1")
        await until(lambda: loaded(store, "q-1").status == "finished")
        assert 0.3 <= trio.current_time() - started < 3.0


def test_diagrams_show_timeout_transitions() -> None:
    flow = expense_flow()
    assert "awaiting --> escalated : after 2d" in flow.to_mermaid()
    assert '"awaiting" -> "escalated" [label="after 2d", style=dashed];' in (
        flow.to_dot()
    )
    assert phronomy.workflow._definition.describe_delay(5_400_000) == "1h30m"
    assert phronomy.workflow._definition.describe_delay(250) == "250ms"


@pytest.mark.parametrize(
    ("after", "message"),
    [
        (0, "more than 0"),
        (-1, "more than 0"),
        (timedelta(days=366 * 101), "at most 100 years"),
        (float("nan"), "more than 0"),
        ("2d", "timedelta or seconds"),
        (True, "timedelta or seconds"),
    ],
)
def test_bad_timeouts_are_refused_naming_the_transition(
    after: Any, message: str
) -> None:
    wf = phronomy.Workflow(Expense, name="bad")
    wf.wait_state("a")
    with pytest.raises(phronomy.DefinitionError, match=message) as info:
        wf.transition("a", phronomy.FINISH, after=after)
    assert "'a' -> '__end__'" in str(info.value)


def test_a_timeout_beside_an_event_or_an_automatic_transition_is_refused() -> None:
    wf = phronomy.Workflow(Expense, name="bad")
    wf.wait_state("a")
    with pytest.raises(phronomy.DefinitionError, match="not both"):
        wf.transition("a", phronomy.FINISH, on="go", after=5)
    auto = phronomy.Workflow(Expense, name="auto")
    auto.state("s")
    auto.transition("s", phronomy.FINISH)
    auto.transition("s", phronomy.FINISH, after=5)
    with pytest.raises(phronomy.DefinitionError, match=r"\['s'\].*never fire"):
        auto.build()


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda fx: fx.schedule(-1, "go"), "from 0 seconds to 100 years"),
        (lambda fx: fx.schedule(timedelta(days=40000), "go"), "100 years"),
        (lambda fx: fx.schedule("5", "go"), "from 0 seconds"),
        (lambda fx: fx.schedule(1, "nope"), "declares no event 'nope'"),
        (lambda fx: fx.schedule(1, "go", key=""), "non-empty string"),
        (lambda fx: fx.cancel_timer(7), "key must be a non-empty"),
    ],
    ids=["negative", "huge", "text", "unknown-event", "empty-key", "bad-cancel"],
)
async def test_bad_timer_requests_fail_the_segment_and_write_nothing(
    tmp_path: Any,
    open_sqlite: Callable[..., phronomy.SQLiteStore],
    call: Callable[[Any], None],
    message: str,
) -> None:
    wf = phronomy.Workflow(Expense, name="bad-timer")
    wf.state("s", entry=lambda s, e, effects: call(effects))
    wf.transition("s", phronomy.FINISH, on="go")
    flow = wf.build()
    store = open_sqlite(tmp_path / "bad.db")
    async with runtime_on(store) as rt:
        with pytest.raises(phronomy.InvalidInputError, match=message):
            await rt.workflows.invoke(flow, workflow_instance_id="b-1")
    assert _timers(store, "b-1") == []
    row = store.load("b-1")
    assert row is None or row.revision == 0


async def test_a_delayed_start_starts_once_when_due_in_a_runtime_serving_it(
    timed_store: phronomy.storage.BaseStore[Any], test_clock: TestClock
) -> None:
    flow = expense_flow()
    async with runtime_on(timed_store, workflows=[flow]) as rt:
        row = await rt.workflows.start_later(
            flow, {"amount": 7}, workflow_instance_id="s-1", after=timedelta(hours=3)
        )
        assert (row.status, row.phase, row.revision) == ("halted", "__scheduled__", 1)
        (timer,) = await rt.workflows.timers("s-1")
        assert (timer.name, timer.kind) == ("start", "start")
        assert timer.due_at_ms - timer.armed_at_ms == 3 * 3_600_000
        with pytest.raises(phronomy.InstanceExistsError, match="'s-1' exists"):
            await rt.workflows.start_later(flow, workflow_instance_id="s-1", after=1)
        early = await rt.workflows.post(flow, "s-1", "approve", event_id="early")
        await until(
            lambda: any(
                e.event_id == "early" and e.status == "refused"
                for e in timed_store.run(
                    phronomy.storage.InboxOp(
                        workflow_instance_id="s-1", pending_only=False
                    )
                )
            )
        )
        assert early.status == "pending"
        test_clock.skip(timedelta(hours=3))
        started = await _settle(timed_store, "s-1", phase="awaiting")
        assert (started.status, started.revision) == ("halted", 2)
        state = phronomy.storage.decode_snapshot(
            started.snapshot, workflow_instance_id="s-1", revision=2, state_type=Expense
        ).fields
        assert (state.amount, state.visits) == (7, 1)  # entry actions ran once
        # the start armed the entry point's own timeout
        assert [t.name for t in await rt.workflows.timers("s-1")] == [
            "after:172800000:awaiting"
        ]
        refused = await rt.workflows.receipt("s-1", "early")
        assert refused is not None
        assert "had not started yet" in (refused.detail or "")


async def test_a_delayed_start_at_a_time_and_a_cancelled_one(
    timed_store: phronomy.storage.BaseStore[Any], test_clock: TestClock
) -> None:
    flow = expense_flow()
    when = datetime.fromtimestamp(test_clock() / 1000 + 86_400, tz=UTC)
    async with runtime_on(timed_store, workflows=[flow]) as rt:
        await rt.workflows.start_later(flow, workflow_instance_id="s-2", at=when)
        await rt.workflows.start_later(flow, workflow_instance_id="s-3", at=when)
        (timer,) = await rt.workflows.timers("s-2")
        assert abs(timer.due_at_ms - when.timestamp() * 1000) < 1000
        await rt.workflows.cancel(flow, "s-3", reason="not needed")
        assert await rt.workflows.timers("s-3") == ()
        test_clock.skip(DAY)
        await _settle(timed_store, "s-2", phase="awaiting")
        await trio.sleep(0.1)
        assert loaded(timed_store, "s-3").status == "cancelled"


@pytest.mark.parametrize(
    ("when", "message"),
    [
        ({}, "at= .* or after="),
        ({"at": datetime(2030, 1, 1), "after": 1}, "not both"),  # noqa: DTZ001
        ({"at": datetime(2030, 1, 1)}, "timezone-aware"),  # noqa: DTZ001
        ({"at": "tomorrow"}, "timezone-aware"),
        ({"after": -1}, "from now to 100 years"),
        ({"after": timedelta(days=366 * 101)}, "from now to 100 years"),
        ({"after": "1h"}, "timedelta or seconds"),
    ],
    ids=["neither", "both", "naive", "text", "negative", "huge", "text-delay"],
)
async def test_bad_delayed_starts_are_refused_and_write_nothing(
    tmp_path: Any,
    open_sqlite: Callable[..., phronomy.SQLiteStore],
    when: dict[str, Any],
    message: str,
) -> None:
    store = open_sqlite(tmp_path / "bad.db")
    async with runtime_on(store) as rt:
        with pytest.raises(phronomy.InvalidInputError, match=message):
            await rt.workflows.start_later(
                expense_flow(), workflow_instance_id="b-2", **when
            )
        with pytest.raises(phronomy.InvalidInputError, match="reserved"):
            await rt.workflows.post(
                expense_flow(), "x", "approve", event_id="timer:x@1"
            )
    assert store.load("b-2") is None


async def test_a_restart_drops_the_earlier_run_s_timers(
    timed_store: phronomy.storage.BaseStore[Any], test_clock: TestClock
) -> None:
    # Before: start(if_exists="restart") kept the earlier run's action timers, which
    # then fired into the new run.
    flow = expense_flow(remind=True)
    async with runtime_on(timed_store, workflows=[flow]) as rt:
        await rt.workflows.invoke(flow, workflow_instance_id="rs-1")
        await rt.workflows.send_event(flow, "hush", workflow_instance_id="rs-1")
        names = [t.name for t in _timers(timed_store, "rs-1")]
        assert sorted(names) == ["key:nudge", "key:reminder"]
        old = _timers(timed_store, "rs-1")[0]
        restarted = await rt.workflows.invoke(
            flow, workflow_instance_id="rs-1", if_exists="restart"
        )
        assert restarted.revision == 3
        timers = _timers(timed_store, "rs-1")
        assert sorted(t.name for t in timers) == [
            "after:172800000:awaiting",
            "key:reminder",
        ]
        assert {t.armed_revision for t in timers} == {3}  # none of the earlier run
        assert old.armed_revision == 1


def test_timer_keys_with_at_signs_are_refused() -> None:
    effects = phronomy.Effects(workflow="w", events=frozenset({"go"}))
    effects.open()
    with pytest.raises(phronomy.InvalidInputError, match="without '@'"):
        effects.schedule(1, "go", key="a@b")
