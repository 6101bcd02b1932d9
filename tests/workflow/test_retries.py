"""Retries of effects: the policy and its jitter, in-memory and durable retries (the
instance halts between attempts; the count survives a restart), errors that end
retries, the last error's on_error, timeouts per attempt, cancellation, bad input."""

from __future__ import annotations

import collections
import functools
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import msgspec
import pytest
import trio
import trio.lowlevel
import trio.testing
from hypothesis import given, strategies as st

import phronomy
from phronomy.storage import InboxEntry, TimersOp
from phronomy.testing import TestClock
from phronomy.workflow._retries import RetryPolicy, retry_delay, retryable
from records import loaded

from .helpers import runtime_on as _runtime_on, until

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

ATTEMPTS: collections.Counter[str] = collections.Counter()
"""Attempts of the effects below, by their argument."""


def runtime_on(store: phronomy.storage.BaseStore[Any], **kw: Any) -> Any:
    """A runtime that polls every 20 ms (a timer fires within that of its due time)."""
    return _runtime_on(
        store, inbox_poll_interval=kw.pop("inbox_poll_interval", 0.02), **kw
    )


def flaky(name: str, failures: int) -> str:
    """Fail *failures* times for *name*, then return."""
    ATTEMPTS[name] += 1
    if ATTEMPTS[name] <= failures:
        raise ConnectionError(f"{name}: attempt {ATTEMPTS[name]} failed")
    return f"{name} done after {ATTEMPTS[name]}"


def refusing(name: str) -> str:
    ATTEMPTS[name] += 1
    raise phronomy.NonRetryableError(f"{name}: card declined")


async def flaky_task(name: str, failures: int) -> str:
    await trio.lowlevel.checkpoint()
    return flaky(name, failures)


async def slow_task(name: str) -> None:
    ATTEMPTS[name] += 1
    await trio.sleep_forever()


class Charge(phronomy.State):
    name: str = ""
    failures: int = 0
    outcome: str = ""


def charge_flow(
    policy: RetryPolicy | None, *, fn: Any = flaky, task: bool = False
) -> phronomy.WorkflowDefinition[Charge]:
    """charging (live: runs the effect) -> done (FINISH) or declined (a wait state)."""

    def start(s: Charge, _event: Any, effects: Any) -> None:
        args = (s.name, s.failures) if fn in (flaky, flaky_task) else (s.name,)
        if task:
            effects.start_soon(
                fn, *args, on_done="charged", on_error="failed", retry=policy
            )
        else:
            effects.offload(
                fn, *args, on_done="charged", on_error="failed", retry=policy
            )

    wf = phronomy.Workflow(Charge, name="charge")
    wf.state("charging", entry=start)
    wf.wait_state("declined")
    wf.transition(
        "charging",
        phronomy.FINISH,
        on="charged",
        action=lambda s, e: s.merge(outcome=e.payload),
    )
    wf.transition(
        "charging",
        "declined",
        on="failed",
        action=lambda s, e: s.merge(outcome=f"{type(e.payload).__name__}: {e.payload}"),
    )
    wf.transition("declined", phronomy.FINISH, on="give_up")
    return wf.build()


QUICK = RetryPolicy(max_attempts=3, initial_interval=0.01, max_interval=0.05)


@given(
    attempt=st.integers(1, 60),
    initial=st.floats(0, 1000),
    backoff=st.floats(1, 10),
    ceiling=st.floats(0, 10_000),
    draw=st.floats(0, 1, exclude_max=True),
    jitter=st.sampled_from(["full", "equal", "none"]),
)
def test_the_wait_before_an_attempt_stays_within_its_cap(
    attempt: int,
    initial: float,
    backoff: float,
    ceiling: float,
    draw: float,
    jitter: Any,
) -> None:
    policy = RetryPolicy(
        initial_interval=initial, backoff=backoff, max_interval=ceiling, jitter=jitter
    )
    cap = min(ceiling, initial * backoff ** (attempt - 1))
    delay = retry_delay(policy, attempt, lambda: draw)
    low = {"full": 0.0, "equal": cap / 2, "none": cap}[jitter]
    assert low - 1e-9 <= delay <= cap + 1e-9
    if jitter == "full":
        assert delay == pytest.approx(cap * draw)


def test_which_errors_are_tried_again() -> None:
    policy = RetryPolicy(max_attempts=3, non_retryable=(KeyError,))
    assert retryable(policy, ConnectionError(), 1)
    assert retryable(policy, ConnectionError(), 2)
    assert not retryable(policy, ConnectionError(), 3)  # the last attempt
    assert not retryable(policy, KeyError(), 1)
    assert not retryable(policy, phronomy.NonRetryableError(), 1)


@pytest.mark.parametrize("task", [False, True], ids=["offload", "start_soon"])
async def test_an_in_memory_effect_is_tried_until_it_succeeds(task: bool) -> None:
    name = f"mem-{task}"
    flow = charge_flow(QUICK, fn=flaky_task if task else flaky, task=task)
    async with phronomy.open_runtime() as rt:
        result = await rt.workflows.invoke(flow, {"name": name, "failures": 2})
    assert (result.phase, result.state.outcome) == (
        phronomy.FINISH,
        f"{name} done after 3",
    )
    assert ATTEMPTS[name] == 3


async def test_after_the_last_attempt_on_error_gets_the_last_error() -> None:
    flow = charge_flow(QUICK)
    async with phronomy.open_runtime() as rt:
        result = await rt.workflows.invoke(flow, {"name": "last", "failures": 9})
    assert result.phase == "declined"
    assert result.state.outcome == "ConnectionError: last: attempt 3 failed"
    assert ATTEMPTS["last"] == 3  # not one more


@pytest.mark.parametrize("how", ["marker", "listed"])
async def test_non_retryable_errors_end_retries_at_once(how: str) -> None:
    name = f"refuse-{how}"
    policy = RetryPolicy(
        max_attempts=5,
        initial_interval=0.01,
        non_retryable=(phronomy.NonRetryableError,) if how == "listed" else (),
    )
    async with phronomy.open_runtime() as rt:
        result = await rt.workflows.invoke(
            charge_flow(policy, fn=refusing), {"name": name}
        )
    assert result.state.outcome == f"NonRetryableError: {name}: card declined"
    assert ATTEMPTS[name] == 1


async def test_a_runtime_default_policy_applies_to_effects_that_name_none() -> None:
    flow = charge_flow(None)
    async with phronomy.open_runtime(retry=QUICK) as rt:
        result = await rt.workflows.invoke(flow, {"name": "default", "failures": 1})
    assert result.state.outcome == "default done after 2"
    with pytest.raises(phronomy.InvalidInputError, match="retry must be a RetryPolicy"):
        async with phronomy.open_runtime(retry=3):  # type: ignore[arg-type]
            pass  # pragma: no cover


async def test_a_timeout_per_attempt_cancels_a_task_and_counts_it_failed() -> None:
    policy = RetryPolicy(
        max_attempts=2, initial_interval=0.01, timeout_per_attempt=0.05
    )
    flow = charge_flow(policy, fn=slow_task, task=True)
    async with phronomy.open_runtime() as rt:
        with trio.fail_after(5):
            result = await rt.workflows.invoke(flow, {"name": "slow"})
    assert result.state.outcome.startswith("TooSlowError")
    assert ATTEMPTS["slow"] == 2


@pytest.fixture
def clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(rate=1)


DURABLE = RetryPolicy(
    max_attempts=4, initial_interval=600, backoff=2, max_interval=3600, jitter="none"
)


def _retry_timer(store: phronomy.storage.BaseStore[Any], iid: str) -> Any:
    timers = [
        t for t in store.run(TimersOp(workflow_instance_id=iid)) if t.kind == "retry"
    ]
    return timers[0] if timers else None


async def test_a_durable_effect_waits_halted_and_its_count_survives_a_restart(
    clock: trio.testing.MockClock,
    tmp_path: Path,
    open_sqlite: Callable[..., phronomy.SQLiteStore],
) -> None:
    test_clock = TestClock(clock)
    store = open_sqlite(tmp_path / "retry.db", clock=test_clock)
    flow = charge_flow(DURABLE)
    async with runtime_on(store, workflows=[flow]) as rt:
        halted = await rt.workflows.invoke(
            flow, {"name": "dur", "failures": 2}, workflow_instance_id="r-1"
        )
        # the first attempt failed: it waits, halted at its state, for the second
        assert (halted.phase, halted.revision) == ("charging", 1)
        timer = _retry_timer(store, "r-1")
        assert timer is not None
        stored = msgspec.json.decode(timer.payload)
        assert (stored["attempt"], stored["fn"]) == (2, f"{__name__}:flaky")
        assert stored["errors"] == ["ConnectionError: dur: attempt 1 failed"]
        assert timer.due_at_ms - timer.armed_at_ms == 600_000  # no jitter: the cap
    assert ATTEMPTS["dur"] == 1
    test_clock.skip(timedelta(minutes=10))
    async with runtime_on(store, workflows=[flow]):  # another runtime, after a stop
        await until(lambda: ATTEMPTS["dur"] == 2)
        await until(lambda: loaded(store, "r-1").revision == 2)
        timer = _retry_timer(store, "r-1")
        assert msgspec.json.decode(timer.payload)["attempt"] == 3
        assert timer.due_at_ms - timer.armed_at_ms == 1_200_000  # doubled
        test_clock.skip(timedelta(minutes=20))
        row = await until_status(store, "r-1", "finished")
    assert ATTEMPTS["dur"] == 3  # one attempt each: none repeated, none extra
    assert row.revision == 3
    assert _retry_timer(store, "r-1") is None
    history = await _history(store, "r-1", flow)
    fired = [e for e in history if e.event_id.startswith("timer:retry:charging@")]
    assert [msgspec.json.decode(e.payload)["attempt"] for e in fired] == [2, 3]
    assert all(e.status == "transitioned" for e in fired)


async def until_status(
    store: phronomy.storage.BaseStore[Any], iid: str, status: str
) -> Any:
    await until(lambda: loaded(store, iid).status == status)
    return loaded(store, iid)


async def _history(
    store: phronomy.storage.BaseStore[Any], iid: str, flow: Any
) -> list[InboxEntry]:
    async with runtime_on(store) as rt:
        items = await rt.workflows.history(iid)
    return sorted((e for e in items if isinstance(e, InboxEntry)), key=lambda e: e.seq)


async def test_a_durable_effect_gives_up_after_its_last_attempt(
    clock: trio.testing.MockClock,
    tmp_path: Path,
    open_sqlite: Callable[..., phronomy.SQLiteStore],
) -> None:
    test_clock = TestClock(clock)
    store = open_sqlite(tmp_path / "giveup.db", clock=test_clock)
    flow = charge_flow(DURABLE)
    async with runtime_on(store, workflows=[flow]) as rt:
        await rt.workflows.invoke(
            flow, {"name": "never", "failures": 99}, workflow_instance_id="g-1"
        )
        for attempt in (2, 3, 4):
            test_clock.skip(timedelta(hours=1))
            await until(lambda a=attempt: ATTEMPTS["never"] == a)  # type: ignore[misc]
            await until(lambda: loaded(store, "g-1").status == "halted")
        row = loaded(store, "g-1")
        assert row.phase == "declined"
        decoded = phronomy.storage.decode_snapshot(
            row.snapshot,  # type: ignore[arg-type]
            workflow_instance_id="g-1",
            revision=row.revision,
            state_type=Charge,
        ).fields
        assert decoded.outcome == "ConnectionError: never: attempt 4 failed"
        test_clock.skip(timedelta(hours=2))
        await trio.sleep(0.1)
    assert ATTEMPTS["never"] == 4


async def test_cancelling_during_a_durable_wait_settles_at_once(
    clock: trio.testing.MockClock,
    tmp_path: Path,
    open_sqlite: Callable[..., phronomy.SQLiteStore],
) -> None:
    test_clock = TestClock(clock)
    store = open_sqlite(tmp_path / "cancel.db", clock=test_clock)
    flow = charge_flow(DURABLE)
    async with runtime_on(store, workflows=[flow]) as rt:
        await rt.workflows.invoke(
            flow, {"name": "cancelled", "failures": 9}, workflow_instance_id="c-1"
        )
        with trio.fail_after(2):
            cancelled = await rt.workflows.cancel(flow, "c-1", reason="stop")
        assert cancelled.status == "cancelled"
        assert store.run(TimersOp(workflow_instance_id="c-1")) == ()
        test_clock.skip(timedelta(hours=1))
        await trio.sleep(0.1)
    assert ATTEMPTS["cancelled"] == 1


async def test_a_durable_retried_effect_must_be_importable_with_json_arguments(
    tmp_path: Path, open_sqlite: Callable[..., phronomy.SQLiteStore]
) -> None:
    store = open_sqlite(tmp_path / "bad.db")

    def local(name: str) -> str:  # a closure: another process cannot import it
        return name

    async with runtime_on(store) as rt:
        with pytest.raises(phronomy.InvalidInputError, match="module-level function"):
            await rt.workflows.invoke(
                charge_flow(QUICK, fn=local), {"name": "x"}, workflow_instance_id="b-1"
            )
        async with phronomy.open_runtime() as memory:  # in memory: any callable
            result = await memory.workflows.invoke(
                charge_flow(QUICK, fn=local), {"name": "y"}
            )
            assert result.state.outcome == "y"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_attempts": 0}, "max_attempts must be an int >= 1"),
        ({"max_attempts": 2.5}, "max_attempts"),
        ({"initial_interval": -1}, "initial_interval must be a number"),
        ({"backoff": 0.5}, "backoff must be a number from 1"),
        ({"max_interval": float("inf")}, "max_interval"),
        ({"jitter": "some"}, "jitter must be"),
        ({"non_retryable": ("ValueError",)}, "exception types"),
        ({"timeout_per_attempt": 0}, "timeout_per_attempt"),
    ],
    ids=["zero", "float", "negative", "shrinking", "infinite", "jitter", "names", "timeout"],
)  # fmt: skip
def test_bad_policies_are_refused_naming_the_field(
    fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(phronomy.InvalidInputError, match=message):
        RetryPolicy(**fields)


async def test_offload_refuses_a_timeout_per_attempt() -> None:
    policy = RetryPolicy(timeout_per_attempt=1)
    async with phronomy.open_runtime() as rt:
        with pytest.raises(
            phronomy.InvalidInputError, match="thread cannot be stopped"
        ):
            await rt.workflows.invoke(charge_flow(policy), {"name": "t"})


def always_fails(name: str) -> str:
    ATTEMPTS[name] += 1
    raise ConnectionError(f"{name}: down")


def _attempted(name: str, count: int) -> bool:
    return ATTEMPTS[name] == count


def _at_revision(store: Any, iid: str, revision: int) -> bool:
    return bool(loaded(store, iid).revision == revision)


async def test_a_state_s_timeout_still_fires_while_its_effect_is_retried(
    clock: trio.testing.MockClock,
    tmp_path: Path,
    open_sqlite: Callable[..., phronomy.SQLiteStore],
) -> None:
    # Before: the timeout armed by the first wait was judged stale once the segment
    # halted at the same state again (a later revision): it never fired.
    policy = RetryPolicy(
        max_attempts=10,
        initial_interval=1800,
        backoff=2,
        max_interval=86400,
        jitter="none",
    )

    def start(s: Charge, _event: Any, effects: Any) -> None:
        effects.offload(always_fails, s.name, on_done="charged", retry=policy)

    wf = phronomy.Workflow(Charge, name="charge-timeout")
    wf.state("charging", entry=start)
    wf.wait_state("timed_out")
    wf.transition("charging", phronomy.FINISH, on="charged")
    wf.transition("charging", "timed_out", after=timedelta(hours=2))
    flow = wf.build()
    test_clock = TestClock(clock)
    store = open_sqlite(tmp_path / "timeout.db", clock=test_clock)
    async with runtime_on(store, workflows=[flow]) as rt:
        await rt.workflows.invoke(flow, {"name": "t-out"}, workflow_instance_id="to-1")
        for attempts, wait in ((2, 30), (3, 60)):  # minutes before each attempt
            test_clock.skip(timedelta(minutes=wait))
            await until(functools.partial(_attempted, "t-out", attempts))
            await until(functools.partial(_at_revision, store, "to-1", attempts))
        timeouts = list(store.run(TimersOp(workflow_instance_id="to-1")))
        assert {t.kind for t in timeouts} == {"timeout", "retry"}
        test_clock.skip(timedelta(minutes=31))  # 2 h 1 min since charging began
        await until(lambda: loaded(store, "to-1").phase == "timed_out")
    assert ATTEMPTS["t-out"] == 3
    assert store.run(TimersOp(workflow_instance_id="to-1")) == ()


async def test_a_runtime_wide_policy_retries_a_closure_in_the_segment(
    tmp_path: Path, open_sqlite: Callable[..., phronomy.SQLiteStore]
) -> None:
    # Before: the runtime's policy made every durable effect that another process
    # could not import fail at once, even one that would have succeeded.
    calls: list[int] = []

    def local(name: str) -> str:
        calls.append(1)
        if len(calls) < 2:
            raise ConnectionError("once")
        return name

    store = open_sqlite(tmp_path / "closure.db")
    async with runtime_on(store, retry=QUICK) as rt:
        result = await rt.workflows.invoke(
            charge_flow(None, fn=local), {"name": "c"}, workflow_instance_id="cl-1"
        )
    assert (result.phase, result.state.outcome, len(calls)) == (phronomy.FINISH, "c", 2)
