"""The timers' and schedules' part of the store contract: every store arms, disarms,
fires (once) and drops timers, and stores and ticks schedules, alike (memory, SQLite,
PostgreSQL, and the faulty wrappers)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import msgspec
import pytest

from phronomy import errors
from phronomy.storage import (
    DeleteScheduleOp,
    FireOp,
    InboxOp,
    MarkOp,
    NextDueOp,
    PendingOp,
    Posting,
    PostOp,
    PutScheduleOp,
    SaveOp,
    ScheduleOp,
    ScheduleRecord,
    SchedulesOp,
    TickOp,
    TimersOp,
    TimerSpec,
)

from .test_contract import request, store

if TYPE_CHECKING:
    from collections.abc import Callable

    from phronomy.storage import BaseStore, SaveRequest

__all__ = ["store"]  # the fixture, shared with the contract

Store = Any
LATER = 3_600_000  # an hour: never due within a test


def _armed(req: SaveRequest, *specs: TimerSpec, disarm: tuple[str, ...] = ()) -> Any:
    return msgspec.structs.replace(req, arm=specs, disarm=disarm)


def _spec(name: str, delay_ms: int = 0, event: str = "tick") -> TimerSpec:
    return TimerSpec(name=name, delay_ms=delay_ms, event=event, payload=b'{"n":1}')


def _names(store: Store, iid: str) -> list[tuple[str, int]]:
    timers = store.run(TimersOp(workflow_instance_id=iid))
    return [(t.name, t.armed_revision) for t in timers]


def _inbox(store: Store, iid: str) -> list[tuple[str, str]]:
    entries = store.run(InboxOp(workflow_instance_id=iid, pending_only=False))
    return sorted((e.event_id, e.status) for e in entries)


def test_pending_counts_the_entries_and_timers_of_the_workflows_asked(
    store: Store,
) -> None:
    assert store.run(PendingOp(workflows=("wf",))) == (0, 0)
    store.save(_armed(request("a", None), _spec("t1", LATER), _spec("t2", LATER)))
    other = msgspec.structs.replace(request("o", None), workflow="other")
    store.save(_armed(other, _spec("t", LATER)))
    for iid, n in (("a", 1), ("a", 2), ("o", 1)):
        posting = Posting(
            workflow_instance_id=iid, event_id=f"e{n}", event="go", payload=b"1"
        )
        assert store.run(PostOp(posting=posting)).outcome == "stored"
    assert store.run(PendingOp(workflows=("wf",))) == (2, 2)
    assert store.run(PendingOp(workflows=("wf", "other"))) == (3, 3)
    assert store.run(PendingOp(workflows=("nobody",))) == (0, 0)
    store.save(request("a", 1, status="finished"))  # refuses them, drops its timers
    assert store.run(PendingOp(workflows=("wf", "other"))) == (1, 1)


def test_a_save_arms_timers_due_on_the_store_s_clock(store: Store) -> None:
    store.save(_armed(request("a", None), _spec("soon"), _spec("late", LATER)))
    timers = {t.name: t for t in store.run(TimersOp(workflow_instance_id="a"))}
    assert sorted(timers) == ["late", "soon"]
    late = timers["late"]
    assert late.due_at_ms - late.armed_at_ms == LATER
    assert (late.armed_revision, late.event, late.payload, late.kind) == (
        1,
        "tick",
        b'{"n":1}',
        "timer",
    )
    # soonest first
    assert [t.name for t in store.run(TimersOp(workflow_instance_id="a"))] == [
        "soon",
        "late",
    ]


def test_arming_a_name_again_replaces_it_and_disarm_removes_it(store: Store) -> None:
    store.save(_armed(request("b", None), _spec("x", LATER), _spec("y", LATER)))
    store.save(_armed(request("b", 1), _spec("x", LATER), disarm=("y", "never")))
    assert _names(store, "b") == [("x", 2)]


def test_due_timers_fire_once_into_the_inbox_of_instances_the_runtime_serves(
    store: Store,
) -> None:
    for iid in ("free", "mine", "theirs", "unserved", "later"):
        req = request(iid, None)
        if iid == "unserved":
            req = msgspec.structs.replace(req, workflow="other")
        store.save(_armed(req, _spec("t", LATER if iid == "later" else 0)))
    assert store.begin(
        "mine", "wf", expected_revision=1, lease_owner="A", ttl_ms=60_000
    )
    assert store.begin(
        "theirs", "wf", expected_revision=1, lease_owner="B", ttl_ms=60_000
    )
    due = store.run(NextDueOp(owner="A", workflows=("wf",)))
    assert due is not None
    assert due <= 0
    assert store.run(FireOp(owner="A", workflows=("wf",))) == 2
    assert store.run(FireOp(owner="A", workflows=("wf",))) == 0  # once
    for iid in ("free", "mine"):
        assert _names(store, iid) == []
        assert _inbox(store, iid) == [("timer:t@1", "pending")]
    for iid in ("theirs", "unserved", "later"):
        assert _inbox(store, iid) == []
        assert _names(store, iid) == [("t", 1)]
    # "theirs" is due, but B holds it: the next due time says so, A fires nothing
    left = store.run(NextDueOp(owner="A", workflows=("wf",)))
    assert left is not None
    assert left <= 0
    assert store.run(FireOp(owner="A", workflows=("wf",))) == 0
    assert store.run(NextDueOp(owner="A")) is None  # no workflow served
    assert store.run(FireOp(owner="B", workflows=("other",))) == 1  # "unserved"
    assert store.run(FireOp(owner="B", workflows=("wf",))) == 1  # "theirs"
    later = store.run(NextDueOp(owner="A", workflows=("wf", "other")))
    assert later is not None
    assert LATER - 60_000 < later <= LATER  # "later" only


def test_a_firing_numbers_an_instance_s_due_timers_in_order_and_each_once(
    store: Store,
) -> None:
    """Several due timers of one instance are numbered one after another in its inbox
    (armed by one save: due at once, in the order of their names); a timer whose event is in the inbox already is stored no
    second time, and its number goes back (the next entry takes it)."""
    store.save(_armed(request("two", None), _spec("b"), _spec("c"), _spec("a")))
    store.save(_armed(request("one", None), _spec("t")))
    store.save(_armed(request("dup", None), _spec("t")))
    early = Posting(
        workflow_instance_id="dup", event_id="timer:t@1", event="tick", payload=b"1"
    )
    assert store.run(PostOp(posting=early)).outcome == "stored"
    assert store.run(FireOp(owner="A", workflows=("wf",))) == 4  # not "dup"'s
    entries = store.run(InboxOp(workflow_instance_id="two", pending_only=False))
    assert sorted((e.seq, e.event_id) for e in entries) == [
        (1, "timer:a@1"),
        (2, "timer:b@1"),
        (3, "timer:c@1"),
    ]
    assert _inbox(store, "one") == [("timer:t@1", "pending")]
    assert [_names(store, iid) for iid in ("two", "one", "dup")] == [[], [], []]
    later = Posting(
        workflow_instance_id="dup", event_id="later", event="tick", payload=b"2"
    )
    stored = store.run(PostOp(posting=later))
    assert stored.outcome == "stored"
    assert stored.entry.seq == 2  # the firing's number was given back


def test_disarming_a_fired_timer_refuses_its_pending_entry(store: Store) -> None:
    store.save(_armed(request("c", None), _spec("t")))
    assert store.run(FireOp(owner="A", workflows=("wf",))) == 1
    store.save(_armed(request("c", 1), disarm=("t",)))
    (entry,) = store.run(InboxOp(workflow_instance_id="c", pending_only=False))
    assert (entry.status, entry.revision) == ("refused", 2)
    assert "timer 't' was disarmed" in (entry.detail or "")


@pytest.mark.parametrize("how", ["finished", "cancelled-mark", "deleted"])
def test_a_closed_or_deleted_instance_drops_its_timers(store: Store, how: str) -> None:
    store.save(_armed(request("d", None), _spec("t", LATER), _spec("u", LATER)))
    if how == "finished":
        store.save(request("d", 1, status="finished"))
    elif how == "cancelled-mark":
        assert store.run(
            MarkOp(workflow_instance_id="d", status="cancelled", expected_revision=1)
        )
    else:
        store.delete("d", 1)
    assert _names(store, "d") == []
    assert store.run(NextDueOp(owner="A", workflows=("wf",))) is None


def test_a_refused_save_arms_and_disarms_nothing(store: Store) -> None:
    store.save(_armed(request("e", None), _spec("keep", LATER)))
    with pytest.raises(errors.ConflictError):
        store.save(_armed(request("e", 5), _spec("new"), disarm=("keep",)))
    # in a batch beside a good save: the good one commits alone
    results = store.execute(
        [
            SaveOp(request=_armed(request("e", 1), _spec("ok", LATER))),
            SaveOp(request=_armed(request("e", 9), _spec("bad"))),
        ]
    )
    assert [r.unwrap().outcome for r in results] == ["success", "known_failure"]
    assert _names(store, "e") == [("keep", 1), ("ok", 2)]


def test_bad_timer_specs_are_refused_naming_the_timer() -> None:
    for delay in (-1, 10**15, 1.5, True):
        with pytest.raises(errors.InvalidInputError, match="timer 'x': delay_ms"):
            TimerSpec(name="x", delay_ms=delay, event="e")  # type: ignore[arg-type]


def test_two_runtimes_firing_at_once_fire_each_timer_once(
    open_postgres: Callable[..., BaseStore[Any]],
) -> None:
    first, second = open_postgres(), open_postgres()
    count = 60
    for n in range(count):
        first.save(_armed(request(f"r{n}", None), _spec("t")))
    fired: list[int] = []
    start = threading.Barrier(2)

    def fire(store: BaseStore[Any], owner: str) -> None:
        start.wait()
        while (done := store.run(FireOp(owner=owner, workflows=("wf",), limit=7))) or (
            store.run(NextDueOp(owner=owner, workflows=("wf",))) is not None
        ):
            fired.append(done)

    threads = [
        threading.Thread(target=fire, args=(s, o))
        for s, o in ((first, "A"), (second, "B"))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sum(fired) == count
    for n in range(count):
        assert _inbox(first, f"r{n}") == [("timer:t@1", "pending")]


def _schedule(sid: str, **fields: Any) -> ScheduleRecord:
    base: dict[str, Any] = {
        "schedule_id": sid,
        "workflow": "wf",
        "next_tick_ms": 0,
        "every_ms": 60_000,
    }
    return ScheduleRecord(**{**base, **fields})


def test_schedules_are_stored_once_and_changed_by_version(store: Store) -> None:
    first = _schedule("s")
    assert store.run(PutScheduleOp(record=first)) is True
    assert store.run(PutScheduleOp(record=first)) is False  # the id is taken
    stored = store.run(ScheduleOp(schedule_id="s"))
    assert (stored.version, stored.every_ms) == (1, 60_000)
    assert stored.created_at_ms > 0
    changed = msgspec.structs.replace(stored, paused=True, version=2, note="why")
    assert store.run(PutScheduleOp(record=changed, expected_version=1)) is True
    assert store.run(PutScheduleOp(record=changed, expected_version=1)) is False
    again = store.run(ScheduleOp(schedule_id="s"))
    assert (again.paused, again.note, again.version) == (True, "why", 2)
    assert store.run(ScheduleOp(schedule_id="none")) is None
    assert store.run(DeleteScheduleOp(schedule_id="s")) is True
    assert store.run(DeleteScheduleOp(schedule_id="s")) is False


def test_due_schedules_are_the_unpaused_ones_of_served_workflows(store: Store) -> None:
    store.run(PutScheduleOp(record=_schedule("a", next_tick_ms=LATER * 10**6)))
    store.run(PutScheduleOp(record=_schedule("b", next_tick_ms=5)))
    store.run(PutScheduleOp(record=_schedule("c", next_tick_ms=1, paused=True)))
    store.run(PutScheduleOp(record=_schedule("d", next_tick_ms=2, workflow="x")))
    store.run(
        PutScheduleOp(
            record=_schedule("e", next_tick_ms=LATER * 10**6, buffered_tick_ms=3)
        )
    )
    now, due = store.run(SchedulesOp(workflows=("wf",), due=True))
    assert now > 0
    assert [r.schedule_id for r in due] == ["e", "b"]  # by the tick due first
    _, every = store.run(SchedulesOp())
    assert [r.schedule_id for r in every] == ["a", "b", "c", "d", "e"]
    _, later = store.run(SchedulesOp(workflows=("x",), after="a"))
    assert [r.schedule_id for r in later] == ["d"]


def test_a_tick_writes_once_per_version_and_each_instance_once(store: Store) -> None:
    store.run(PutScheduleOp(record=_schedule("t")))
    stored = store.run(ScheduleOp(schedule_id="t"))
    starts = (request("t@1", None), request("t@2", None))
    store.save(request("t@2", None))  # this tick started before
    nxt = msgspec.structs.replace(stored, next_tick_ms=180_000, version=2, started=2)
    ticked = store.run(TickOp(record=nxt, expected_version=1, starts=starts))
    assert (ticked.written, ticked.started) == (True, ("t@1",))
    # another runtime's tick of the same version: nothing written
    late = store.run(
        TickOp(record=nxt, expected_version=1, starts=(request("t@3", None),))
    )
    assert (late.written, late.started) == (False, ())
    assert store.load("t@3") is None
    assert store.run(ScheduleOp(schedule_id="t")).version == 2
