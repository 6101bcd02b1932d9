"""Schedules: ticks in time zones across daylight saving, overlap policies, catch-up,
three runtimes ticking one schedule (each tick starts one instance), pause, resume,
trigger, backfill, delete, and bad input."""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.testing

import phronomy
from phronomy.storage import ListOp, ScheduleRecord
from phronomy.testing import TestClock
from phronomy.workflow._ticks import next_tick, plan_ticks, tick_instance_id

from .helpers import runtime_on as _runtime_on, until

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

START = datetime(2026, 3, 1, tzinfo=UTC)


def runtime_on(store: phronomy.storage.BaseStore[Any], **kw: Any) -> Any:
    """A runtime that polls every 20 ms (a timer fires within that of its due time)."""
    return _runtime_on(
        store, inbox_poll_interval=kw.pop("inbox_poll_interval", 0.02), **kw
    )


def _ms(at: datetime) -> int:
    return round(at.timestamp() * 1000)


def _cron(expression: str, zone: str) -> ScheduleRecord:
    return ScheduleRecord(
        schedule_id="s", workflow="wf", next_tick_ms=0, cron=expression, timezone=zone
    )


def _ticks(record: ScheduleRecord, start: datetime, end: datetime) -> list[str]:
    """The ticks from *start* to *end*, as local times with their UTC offsets."""
    zone = phronomy.workflow._ticks.check_zone(record.timezone)
    found, tick = [], next_tick(record, _ms(start) - 1)
    while tick is not None and tick < _ms(end):
        found.append(datetime.fromtimestamp(tick / 1000, tz=zone).isoformat())
        tick = next_tick(record, tick)
    return found


@pytest.mark.parametrize(
    ("zone", "spring", "autumn"),
    [("Europe/Berlin", "2026-03-29", "2026-10-25"), ("America/New_York", "2026-03-08", "2026-11-01")],
)  # fmt: skip
def test_a_daily_tick_in_a_skipped_or_repeated_hour_runs_once(
    zone: str, spring: str, autumn: str
) -> None:
    hour = 2 if zone == "Europe/Berlin" else 1  # the repeated hour's local start
    daily = _cron(f"30 {hour} * * *", zone)
    skipped = _cron("30 2 * * *", zone)
    day = timedelta(days=1)
    start = datetime.fromisoformat(spring).replace(tzinfo=UTC) - day
    spring_ticks = _ticks(skipped, start, start + 3 * day)
    # 02:30 does not exist that day: it runs once, at the end of the gap (03:00)
    assert [t[11:16] for t in spring_ticks] == ["02:30", "03:00", "02:30"]
    assert len(set(spring_ticks)) == 3
    start = datetime.fromisoformat(autumn).replace(tzinfo=UTC) - day
    autumn_ticks = _ticks(daily, start, start + 3 * day)
    # the time occurs twice that day: it runs once, at the first occurrence
    assert [t[11:16] for t in autumn_ticks] == [f"0{hour}:30"] * 3
    assert len(autumn_ticks) == 3


def test_hourly_ticks_follow_real_time_across_both_changes() -> None:
    hourly = _cron("0 * * * *", "Europe/Berlin")
    spring = datetime(2026, 3, 28, 23, tzinfo=UTC)
    autumn = datetime(2026, 10, 24, 22, tzinfo=UTC)
    assert len(_ticks(hourly, spring, spring + timedelta(hours=24))) == 24
    assert len(_ticks(hourly, autumn, autumn + timedelta(hours=24))) == 24
    # never a tick at or before the moment asked from, within the repeated hour
    for minute in range(0, 120, 7):
        at = _ms(datetime(2026, 10, 25, 0, tzinfo=UTC) + timedelta(minutes=minute))
        tick = next_tick(hourly, at)
        assert tick is not None
        assert tick > at


def _every(overlap: Any, **fields: Any) -> ScheduleRecord:
    base: dict[str, Any] = {
        "schedule_id": "s",
        "workflow": "wf",
        "next_tick_ms": 60_000,
        "every_ms": 60_000,
        "anchor_ms": 0,
        "overlap": overlap,
        "catchup_window_ms": fields.pop("window", 3_600_000),
    }
    return ScheduleRecord(**{**base, **fields})


@pytest.mark.parametrize(
    ("overlap", "previous_open", "start", "skipped", "buffered"),
    [
        ("allow_all", True, (60_000, 120_000, 180_000), 0, None),
        ("skip", True, (), 3, None),
        ("skip", False, (60_000,), 2, None),
        ("buffer_one", True, (), 2, 60_000),
        ("buffer_one", False, (60_000,), 1, 120_000),
    ],
)
def test_overlap_policies_decide_what_due_ticks_start(
    overlap: Any,
    previous_open: bool,
    start: tuple[int, ...],
    skipped: int,
    buffered: int | None,
) -> None:
    plan = plan_ticks(_every(overlap), 180_500, previous_open=previous_open)
    assert (plan.start, plan.skipped, plan.record.buffered_tick_ms) == (
        start,
        skipped,
        buffered,
    )
    assert plan.record.next_tick_ms == 240_000
    assert plan.record.version == 2
    assert plan.record.started == len(start)


def test_a_buffered_tick_starts_once_the_previous_instance_closed() -> None:
    record = _every("buffer_one", buffered_tick_ms=60_000, next_tick_ms=240_000)
    plan = plan_ticks(record, 200_000, previous_open=False)
    assert (plan.start, plan.record.buffered_tick_ms) == ((60_000,), None)
    assert plan.record.last_instance_id == tick_instance_id("s", 60_000)


def test_ticks_older_than_the_catch_up_window_are_skipped() -> None:
    plan = plan_ticks(_every("allow_all", window=90_000), 300_000, previous_open=False)
    assert plan.start == (240_000, 300_000)  # within 90 s of now
    assert plan.skipped == 3


class Job(phronomy.State):
    n: int = 0


def job_flow() -> phronomy.WorkflowDefinition[Job]:
    wf = phronomy.Workflow(Job, name="job")
    wf.state("run", entry=lambda s: s.merge(n=s.n + 1))
    wf.transition("run", phronomy.FINISH)
    return wf.build()


def _instances(store: phronomy.storage.BaseStore[Any], prefix: str) -> list[Any]:
    rows: list[Any] = []
    after = None
    while True:
        page = store.run(ListOp(limit=1000, after=after))
        rows.extend(
            r for r in page.records if r.workflow_instance_id.startswith(prefix)
        )
        if page.next_after is None:
            return rows
        after = page.next_after


@pytest.fixture
def clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(rate=1)


async def test_three_runtimes_start_exactly_one_instance_per_tick(
    clock: trio.testing.MockClock,
    tmp_path: Path,
    open_sqlite: Callable[..., phronomy.SQLiteStore],
) -> None:
    test_clock = TestClock(clock, start_ms=_ms(START))
    stores = [open_sqlite(tmp_path / "s.db", clock=test_clock) for _ in range(3)]
    flow = job_flow()
    async with (
        runtime_on(stores[0], workflows=[flow]) as first,
        runtime_on(stores[1], workflows=[flow]),
        runtime_on(stores[2], workflows=[flow]),
    ):
        created = await first.schedules.create(
            "minutely",
            flow,
            every=60,
            input={"n": 10},
            overlap="allow_all",
            catchup_window=timedelta(hours=1),
        )
        assert created.next_tick_ms % 60_000 == 0  # on the minute
        test_clock.skip((created.next_tick_ms - test_clock()) / 1000)  # the first
        await until(lambda: len(_instances(stores[0], "minutely@")) == 1)

        def finished(count: int) -> bool:
            rows = _instances(stores[0], "minutely@")
            return len(rows) == count and all(r.status == "finished" for r in rows)

        for batch in range(20):  # 200 more ticks, ten at a time
            # (skip time only while nothing runs: a runtime holding a lease sees a
            # skip as a renewal that came too late)
            await until(functools.partial(finished, 1 + 10 * batch), limit=10)
            test_clock.skip(600)
        await until(lambda: finished(201), limit=10)
        await trio.sleep(0.1)  # a late double would show now
        rows = _instances(stores[0], "minutely@")
        assert len(rows) == 201
        assert len({r.workflow_instance_id for r in rows}) == 201
        record = await first.schedules.get("minutely")
        assert (record.started, record.skipped) == (201, 0)
        done = stores[0].load(rows[0].workflow_instance_id)
        assert done is not None
        assert done.snapshot is not None
        state = phronomy.storage.decode_snapshot(
            done.snapshot,
            workflow_instance_id=done.workflow_instance_id,
            revision=done.revision,
            state_type=Job,
        ).fields
        assert state.n == 11  # the schedule's input, then the entry action once
    print("schedule ticks: 3 runtimes, 201 ticks, 201 instances, 0 doubled")  # noqa: T201


async def test_pause_resume_trigger_backfill_and_delete(
    clock: trio.testing.MockClock,
    tmp_path: Path,
    open_sqlite: Callable[..., phronomy.SQLiteStore],
) -> None:
    test_clock = TestClock(clock, start_ms=_ms(START))
    store = open_sqlite(tmp_path / "p.db", clock=test_clock)
    flow = job_flow()
    async with runtime_on(store, workflows=[flow]) as rt:
        created = await rt.schedules.create(
            "hourly", flow, cron="0 * * * *", timezone="Europe/Berlin"
        )
        first = START + timedelta(hours=1)
        assert created.next_tick_ms == _ms(first)  # the next full hour
        test_clock.skip(timedelta(hours=1))
        await until(lambda: len(_instances(store, "hourly@")) == 1)
        paused = await rt.schedules.pause("hourly", note="maintenance")
        assert (paused.paused, paused.note) == (True, "maintenance")
        test_clock.skip(timedelta(hours=3))
        await trio.sleep(0.1)
        assert len(_instances(store, "hourly@")) == 1  # nothing while paused
        resumed = await rt.schedules.resume("hourly")
        assert resumed.next_tick_ms == _ms(first + timedelta(hours=4))
        triggered = await rt.schedules.trigger("hourly")  # a request: the poll
        assert triggered.startswith("hourly@2026-03-01T04:00:")
        await until(lambda: store.load(triggered) is not None)
        window = (first, first + timedelta(hours=3))
        planned = await rt.schedules.backfill("hourly", *window)
        assert planned == tuple(
            tick_instance_id("hourly", _ms(first + timedelta(hours=h)))
            for h in range(3)
        )
        await until(lambda: len(_instances(store, "hourly@")) == 4)  # 2 new
        assert await rt.schedules.backfill("hourly", *window) == planned
        await until(
            lambda: (
                store.run(
                    phronomy.storage.ScheduleOp(schedule_id="hourly")
                ).backfill_from_ms
                is None
            )
        )
        await trio.sleep(0.1)
        assert len(_instances(store, "hourly@")) == 4  # none started twice
        with pytest.raises(phronomy.InvalidInputError, match="end is before start"):
            await rt.schedules.backfill("hourly", window[1], window[0])
        assert [r.schedule_id for r in await rt.schedules.list()] == ["hourly"]
        assert await rt.schedules.delete("hourly") is True
        assert await rt.schedules.delete("hourly") is False
        with pytest.raises(phronomy.NotFoundError, match="no schedule 'hourly'"):
            await rt.schedules.get("hourly")
        await until(
            lambda: all(r.status == "finished" for r in _instances(store, "hourly@"))
        )
        assert len(_instances(store, "hourly@")) == 4  # they stay


async def test_skip_overlap_waits_for_the_open_instance(
    clock: trio.testing.MockClock,
    tmp_path: Path,
    open_sqlite: Callable[..., phronomy.SQLiteStore],
) -> None:
    wf = phronomy.Workflow(Job, name="slow")
    wf.wait_state("waiting")
    wf.transition("waiting", phronomy.FINISH, on="done")
    flow = wf.build()
    test_clock = TestClock(clock, start_ms=_ms(START))
    store = open_sqlite(tmp_path / "o.db", clock=test_clock)
    async with runtime_on(store, workflows=[flow]) as rt:
        created = await rt.schedules.create("o", flow, every=60, catchup_window=600)
        test_clock.skip((created.next_tick_ms - test_clock()) / 1000)
        await until(lambda: len(_instances(store, "o@")) == 1)
        test_clock.skip(180)  # three ticks while the first waits
        await trio.sleep(0.1)
        assert len(_instances(store, "o@")) == 1
        first = _instances(store, "o@")[0].workflow_instance_id
        await until(lambda: store.load(first).phase == "waiting")  # type: ignore[union-attr]
        await rt.workflows.send_event(flow, "done", workflow_instance_id=first)
        test_clock.skip(60)
        await until(lambda: len(_instances(store, "o@")) == 2)
        record = await rt.schedules.get("o")
        assert (record.started, record.skipped) == (2, 3)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "cron= .* or every="),
        ({"cron": "* * * * *", "every": 60}, "not both"),
        ({"cron": "61 * * * *"}, "invalid cron expression '61 \\* \\* \\* \\*'"),
        ({"cron": "0 0 31 2 *"}, "invalid cron expression"),
        ({"cron": "foo"}, "invalid cron expression 'foo'"),
        ({"cron": "0 * * * *", "timezone": "Mars/Olympus"}, "unknown time zone"),
        ({"every": 0}, "every= must be from 1 ms"),
        ({"every": -5}, "every= must be from 1 ms"),
        ({"every": "1h"}, "timedelta or seconds"),
        ({"every": 60, "overlap": "sometimes"}, "overlap must be one of"),
        ({"every": 60, "start_at": datetime(2030, 1, 1)}, "timezone-aware"),  # noqa: DTZ001
        ({"every": 60, "input": {"nope": 1}}, "nope"),
    ],
    ids=[
        "neither", "both", "minute", "never", "text", "zone", "zero", "negative",
        "text-interval", "overlap", "naive", "input",
    ],
)  # fmt: skip
async def test_bad_schedules_are_refused_naming_the_value_and_write_nothing(
    tmp_path: Path,
    open_sqlite: Callable[..., phronomy.SQLiteStore],
    options: dict[str, Any],
    message: str,
) -> None:
    store = open_sqlite(tmp_path / "bad.db")
    async with runtime_on(store) as rt:
        with pytest.raises(phronomy.InvalidInputError, match=message):
            await rt.schedules.create("bad", job_flow(), **options)
        assert await rt.schedules.list() == []
        for bad_id in ("", "a@b", "x" * 201):
            with pytest.raises(phronomy.InvalidInputError, match="schedule_id"):
                await rt.schedules.create(bad_id, job_flow(), every=60)
        await rt.schedules.create("ok", job_flow(), every=60)
        with pytest.raises(phronomy.InvalidInputError, match="'ok' exists"):
            await rt.schedules.create("ok", job_flow(), every=120)
        assert (await rt.schedules.get("ok")).every_ms == 60_000


def test_operator_requests_start_their_ticks_whatever_the_overlap() -> None:
    record = _every(
        "skip",
        next_tick_ms=600_000,
        trigger_ms=250_500,
        backfill_from_ms=0,
        backfill_to_ms=180_000,
    )
    plan = plan_ticks(record, 300_000, previous_open=True)
    assert plan.start == (0, 60_000, 120_000, 250_500)  # the open instance: no matter
    assert (plan.record.trigger_ms, plan.record.backfill_from_ms) == (None, None)
    assert plan.record.started == 4
    assert plan.record.last_instance_id is None  # requests are not regular ticks


@pytest.mark.parametrize(
    ("zone", "day", "expected"),
    [
        ("Europe/Berlin", datetime(2026, 3, 28, tzinfo=UTC),
         ["2026-03-28T01:30:00Z", "2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"]),
        ("America/New_York", datetime(2026, 3, 7, 12, tzinfo=UTC),
         ["2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z", "2026-03-10T06:30:00Z"]),
    ],
    ids=["berlin", "new-york"],
)  # fmt: skip
async def test_a_spring_forward_day_starts_its_skipped_tick_once(
    clock: trio.testing.MockClock,
    tmp_path: Path,
    open_sqlite: Callable[..., phronomy.SQLiteStore],
    zone: str,
    day: datetime,
    expected: list[str],
) -> None:
    test_clock = TestClock(clock, start_ms=_ms(day))
    store = open_sqlite(tmp_path / "dst.db", clock=test_clock)
    flow = job_flow()
    async with runtime_on(store, workflows=[flow]) as rt:
        await rt.schedules.create(
            "d", flow, cron="30 2 * * *", timezone=zone, catchup_window=2 * 86400
        )
        for count in range(1, 4):
            test_clock.skip(timedelta(days=1))
            await until(
                functools.partial(
                    lambda n: (
                        len(_instances(store, "d@")) == n
                        and all(r.status == "finished" for r in _instances(store, "d@"))
                    ),
                    count,
                )
            )
    ids = sorted(r.workflow_instance_id for r in _instances(store, "d@"))
    assert ids == [f"d@{at}" for at in expected]


def test_a_long_outage_is_caught_up_in_one_pass_counting_what_it_skipped() -> None:
    # Before: a pass walked 100 missed ticks at a time (864 passes after a day of an
    # every-second schedule) before it started anything.
    record = _every("allow_all", every_ms=1000, next_tick_ms=0, window=10_000)
    day = 86_400_000
    plan = plan_ticks(record, day, previous_open=False)
    assert plan.start[0] >= day - 15_000  # the window (and a poll's lateness)
    assert plan.start[-1] == day
    assert plan.skipped == len(range(0, day - 15_000, 1000))
    assert plan.record.next_tick_ms == day + 1000


def test_a_tick_seen_a_poll_late_starts_even_without_a_catch_up_window() -> None:
    # Before: with catchup_window=0 every tick (seen at the next poll) was skipped.
    record = _every("allow_all", next_tick_ms=60_000, window=0)
    plan = plan_ticks(record, 60_150, previous_open=False)
    assert (plan.start, plan.skipped) == ((60_000,), 0)


async def test_triggers_and_backfills_need_an_active_schedule_and_queue_one(
    tmp_path: Path, open_sqlite: Callable[..., phronomy.SQLiteStore]
) -> None:
    store = open_sqlite(tmp_path / "t.db")
    async with runtime_on(store) as rt:  # serves nothing: requests stay pending
        await rt.schedules.create("s", job_flow(), every=3600)
        await rt.schedules.trigger("s")
        with pytest.raises(
            phronomy.InvalidInputError, match="trigger of 's' is pending"
        ):
            await rt.schedules.trigger("s")
        await rt.schedules.pause("s")
        with pytest.raises(phronomy.InvalidInputError, match="paused: resume it"):
            await rt.schedules.backfill("s", START, START + timedelta(hours=2))
        with pytest.raises(phronomy.InvalidInputError, match="'agent:x' must"):
            await rt.schedules.create("agent:x", job_flow(), every=60)
