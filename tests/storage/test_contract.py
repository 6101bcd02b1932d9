"""The store contract every store must pass (spec §4.1, scenario 63 and more)."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import msgspec
import outcome
import pytest

from phronomy import errors, storage
from phronomy.storage import (
    SAVE_LOG_DEPTH,
    BaseStore,
    BeginOp,
    ClaimOp,
    DeleteOp,
    Lease,
    LoadOp,
    MarkOp,
    MemoryStore,
    RecoverOp,
    RenewOp,
    RequestCancelOp,
    SaveOp,
    SaveRequest,
    SQLiteStore,
    check_startable,
)
from phronomy.testing import FaultyStore

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

Store = BaseStore[Any]
"""Every store the contract runs on (they share BaseStore's shortcuts)."""

_ids = itertools.count()


def request(
    iid: str, expected: int | None, snapshot: bytes = b"{}", status: str = "halted"
) -> SaveRequest:
    return SaveRequest(
        workflow_instance_id=iid,
        expected_revision=expected,
        snapshot=snapshot,
        write_id=f"w{next(_ids)}",
        status=status,  # type: ignore[arg-type]
        phase="p",
        workflow="wf",
    )


STORES: dict[str, Callable[[Path], Store]] = {
    "memory": lambda path: MemoryStore(),
    "sqlite": lambda path: SQLiteStore(path / "contract.db"),
    "faulty-sqlite": lambda path: FaultyStore(SQLiteStore(path / "faulty.db")),
}
SERVER_STORES: dict[str, Callable[[Callable[..., Store]], Store]] = {
    "postgres": lambda open_postgres: open_postgres(),
    "faulty-postgres": lambda open_postgres: FaultyStore(open_postgres()),
}


@pytest.fixture(params=sorted(STORES) + sorted(SERVER_STORES))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param in SERVER_STORES:
        opener = request.getfixturevalue("open_postgres")
        made = SERVER_STORES[request.param](opener)
    else:
        made = STORES[request.param](tmp_path)
    yield made
    made.close()


def test_revision_contract(store: Store) -> None:
    # scenario 63
    assert store.load("missing") is None
    assert store.save(request("a", None)) == 1
    assert store.save(request("a", 1)) == 2
    with pytest.raises(errors.ConflictError):
        store.save(request("a", None))
    with pytest.raises(errors.ConflictError):
        store.save(request("a", 1))
    with pytest.raises(errors.ConflictError):
        store.save(request("b", 3))
    with pytest.raises(errors.ConflictError):
        store.delete("a", 99)
    store.delete("a", 2)
    assert store.load("a") is None
    # a deleted id starts again at revision 1
    assert store.save(request("a", None)) == 1


def test_loaded_rows_are_isolated_values(store: Store) -> None:
    store.save(request("iso", None, snapshot=b'{"fields":{"x":[1]}}'))
    first = store.load("iso")
    assert first is not None
    with pytest.raises(AttributeError):
        first.revision = 9  # type: ignore[misc]
    assert isinstance(first.snapshot, bytes)
    second = store.load("iso")
    assert second == first


def test_rows_carry_status_phase_workflow_and_write_id(store: Store) -> None:
    saved = request("row", None, status="finished")
    store.save(saved)
    row = store.load("row")
    assert row is not None
    assert (row.revision, row.status, row.phase, row.workflow, row.write_id) == (
        1,
        "finished",
        "p",
        "wf",
        saved.write_id,
    )
    assert row.updated_at_ms > 0


def test_find_write_identifies_committed_saves(store: Store) -> None:
    first, second = request("fw", None), request("fw", 1)
    store.save(first)
    store.save(second)
    assert store.find_write("fw", first.write_id) == 1
    assert store.find_write("fw", second.write_id) == 2
    assert store.find_write("fw", "never-written") is None
    assert store.find_write("other", first.write_id) is None


def test_the_save_log_keeps_the_recent_saves_of_each_instance(
    store: Store,
) -> None:
    requests = [request("deep", None)] + [
        request("deep", revision) for revision in range(1, SAVE_LOG_DEPTH + 8)
    ]
    for saved in requests:
        store.save(saved)
    latest = len(requests)
    remembered = [store.find_write("deep", r.write_id) for r in requests]
    assert remembered[-SAVE_LOG_DEPTH:] == list(
        range(latest - SAVE_LOG_DEPTH + 1, latest + 1)
    )
    assert remembered[0] is None  # forgotten: reconciliation would fail closed
    store.save(request("other", None))
    assert store.find_write("other", requests[-1].write_id) is None


def test_begin_marks_running_at_the_expected_revision(store: Store) -> None:
    assert store.begin("c", "wf")  # no row: a revision-0 placeholder
    placeholder = store.load("c")
    assert placeholder is not None
    assert (placeholder.revision, placeholder.status, placeholder.snapshot) == (
        0,
        "running",
        None,
    )
    assert (
        store.save(request("c", None)) == 1
    )  # a save over the placeholder creates revision 1
    assert store.load("c").status == "halted"  # type: ignore[union-attr]
    assert store.begin("c", "wf", expected_revision=1)
    assert store.load("c").status == "running"  # type: ignore[union-attr]
    assert not store.begin("c", "wf", expected_revision=5)
    assert not store.begin("c", "wf")  # the row moved past the placeholder
    assert not store.begin("absent", "wf", expected_revision=3)
    assert store.load("absent") is None


def test_startable_rows(store: Store) -> None:
    store.save(request("s", None))
    row = store.load("s")
    assert row is not None
    check_startable(row, "wf")
    check_startable(row, "")  # an unnamed workflow is not checked
    with pytest.raises(errors.InstanceStateError, match="belongs to workflow 'wf'"):
        check_startable(row, "other")


def test_recovery_required_is_fail_closed(store: Store) -> None:
    store.save(request("r", None))
    assert store.mark("r", "recovery_required", detail="lost ack")
    row = store.load("r")
    assert row is not None
    with pytest.raises(errors.RecoveryRequiredError, match="lost ack") as caught:
        check_startable(row, "wf")
    assert caught.value.instance_id == "r"
    assert not store.begin("r", "wf", expected_revision=1)
    assert store.load("r").status == "recovery_required"  # type: ignore[union-attr]


def test_mark_is_guarded_by_revision(store: Store) -> None:
    store.save(request("m", None))
    assert not store.mark("m", "failed", expected_revision=7)
    assert store.mark("m", "failed", expected_revision=1, detail="boom")
    row = store.load("m")
    assert row is not None
    assert (row.status, row.detail, row.revision) == ("failed", "boom", 1)
    assert not store.mark("nobody", "failed")
    store.save(request("m", 1))
    assert store.load("m").detail is None  # type: ignore[union-attr]


def test_listing_filters_and_paginates(store: Store) -> None:
    for i in range(5):
        store.save(request(f"i{i}", None, status="halted" if i % 2 else "finished"))
    page = store.list_instances(limit=2)
    assert [r.workflow_instance_id for r in page.records] == ["i0", "i1"]
    assert all(r.snapshot is None for r in page.records)
    assert page.next_after == "i1"
    rest = store.list_instances(limit=10, after=page.next_after)
    assert [r.workflow_instance_id for r in rest.records] == ["i2", "i3", "i4"]
    assert rest.next_after is None
    halted = store.list_instances(status="halted")
    assert [r.workflow_instance_id for r in halted.records] == ["i1", "i3"]
    for bad in (store.list_instances, lambda limit: store.history("i1", limit=limit)):
        with pytest.raises(errors.InvalidInputError, match="limit must be >= 1, got 0"):
            bad(limit=0)


def test_batches_check_each_save_on_its_own(store: Store) -> None:
    store.save(request("x", None))
    results = store.execute(
        [
            SaveOp(request=request("y", None)),
            SaveOp(request=request("x", None)),  # conflict: only this one fails
            SaveOp(request=request("x", 1)),
            LoadOp(workflow_instance_id="x"),
            BeginOp(workflow_instance_id="z", workflow="wf"),
            BeginOp(workflow_instance_id="nobody", workflow="wf", expected_revision=9),
            MarkOp(workflow_instance_id="y", status="failed", expected_revision=1),
        ]
    )
    assert all(isinstance(r, outcome.Value) for r in results), results
    values = [r.unwrap() for r in results]
    assert (values[0].outcome, values[0].revision) == ("success", 1)
    assert values[1].outcome == "known_failure"
    assert isinstance(values[1].error, errors.ConflictError)
    assert (values[2].outcome, values[2].revision) == ("success", 2)
    assert values[3].revision == 2  # operations run in order
    assert values[4] == 1  # the first claim: epoch 1
    assert values[5] is None
    assert values[6] is True
    assert store.load("x").revision == 2  # type: ignore[union-attr]


def test_errors_stay_inside_the_batch(store: Store) -> None:
    store.save(request("bad", None))
    results = store.execute(
        [
            DeleteOp(workflow_instance_id="bad", expected_revision=7),
            SaveOp(request=request("ok", None)),
        ]
    )
    assert isinstance(results[0], outcome.Error)
    assert isinstance(results[0].error, errors.ConflictError)
    assert results[1].unwrap().outcome == "success"


def leased(
    iid: str, expected: int | None, lease: Lease | None, status: str = "halted"
) -> SaveRequest:
    return msgspec.structs.replace(request(iid, expected, status=status), lease=lease)


def test_a_lease_admits_one_owner_and_fences_its_writes(store: Store) -> None:
    assert store.begin("l", "wf", lease_owner="A", ttl_ms=60_000) == 1
    assert store.begin("l", "wf", lease_owner="B", ttl_ms=60_000) is None  # held
    row = store.load("l")
    assert row is not None
    assert (row.status, row.lease_owner, row.lease_epoch) == ("running", "A", 1)
    assert row.lease_expires_at_ms is not None
    with pytest.raises(errors.LeaseLostError, match="epoch 1"):
        store.save(leased("l", None, Lease(owner="B", epoch=1)))
    with pytest.raises(errors.ConflictError, match="holds \\(or held\\) its lease"):
        store.save(leased("l", None, None))  # a writer without the lease
    assert store.run(RenewOp(owner="A", instance_ids=("l", "x"), ttl_ms=60_000)) == {
        "l": (1, None, True)
    }
    assert store.run(RenewOp(owner="B", instance_ids=("l",), ttl_ms=60_000)) == {}
    assert store.save(leased("l", None, Lease(owner="A", epoch=1))) == 1
    row = store.load("l")
    assert row is not None  # a halted save releases the lease, the epoch stays
    assert (row.lease_owner, row.lease_epoch, row.lease_expires_at_ms) == (
        None,
        1,
        None,
    )
    assert (
        store.begin("l", "wf", expected_revision=1, lease_owner="B", ttl_ms=60_000) == 2
    )
    with pytest.raises(errors.LeaseLostError):  # A's stale segment: fenced
        store.save(leased("l", 1, Lease(owner="A", epoch=1)))
    assert store.save(leased("l", 1, Lease(owner="B", epoch=2), "finished")) == 2


def test_an_expired_lease_can_be_claimed_by_another_owner(store: Store) -> None:
    assert store.begin("e", "wf", lease_owner="A", ttl_ms=0) == 1  # expires at once
    assert store.begin("e", "wf", lease_owner="B", ttl_ms=60_000) == 2
    with pytest.raises(errors.LeaseLostError, match="epoch 2"):
        store.save(leased("e", None, Lease(owner="A", epoch=1)))
    assert store.run(RenewOp(owner="A", instance_ids=("e",), ttl_ms=60_000)) == {}
    assert store.save(leased("e", None, Lease(owner="B", epoch=2))) == 1


def test_a_cancel_request_reaches_the_lease_holder_and_ends_with_it(
    store: Store,
) -> None:
    assert store.run(RequestCancelOp(workflow_instance_id="c", reason="x")) is None
    store.begin("c", "wf", lease_owner="A", ttl_ms=60_000)
    assert store.run(RequestCancelOp(workflow_instance_id="c", reason="dup")) == (
        1,
        True,
    )
    renewed = store.run(RenewOp(owner="A", instance_ids=("c",), ttl_ms=60_000))
    assert renewed == {"c": (1, "dup", True)}
    store.save(leased("c", None, Lease(owner="A", epoch=1), "cancelled"))
    row = store.load("c")
    assert row is not None
    assert (row.status, row.cancel_requested, row.lease_owner) == (
        "cancelled",
        None,
        None,
    )
    assert store.run(RequestCancelOp(workflow_instance_id="c")) is None  # not running


def test_marks_keep_the_lease_only_while_the_outcome_is_open(
    store: Store,
) -> None:
    store.begin("m", "wf", lease_owner="A", ttl_ms=60_000)
    # Before: a mark without a lease changed a row a runtime runs under its lease (a
    # stale owner's unfenced recovery_required mark overwrote a finished instance).
    assert not store.mark("m", "recovery_required", detail="unfenced")
    stale = Lease(owner="A", epoch=0)
    assert not store.run(MarkOp(workflow_instance_id="m", status="failed", lease=stale))
    assert store.load("m").status == "running"  # type: ignore[union-attr]
    held = Lease(owner="A", epoch=1)
    assert store.run(
        MarkOp(
            workflow_instance_id="m",
            status="recovery_required",
            detail="unknown outcome",
            expected_revision=0,
            lease=held,
        )
    )
    row = store.load("m")
    assert row is not None
    assert row.lease_owner == "A"  # held: no runtime is admitted until it is resolved
    assert store.mark("m", "failed")  # an operator resolves it (no lease needed)
    row = store.load("m")
    assert row is not None
    assert (row.lease_owner, row.lease_expires_at_ms) == (None, None)


def test_the_recovery_sweep_puts_expired_instances_back(store: Store) -> None:
    store.save(request("h", None))  # halted at revision 1
    assert store.begin("h", "wf", expected_revision=1, lease_owner="A", ttl_ms=0)
    assert store.begin("n", "wf", lease_owner="A", ttl_ms=0)  # never saved
    assert store.begin("live", "wf", lease_owner="A", ttl_ms=60_000)
    recovered = store.run(RecoverOp(limit=10, max_takeovers=2))
    assert sorted(recovered) == [("h", "halted"), ("n", "failed")]
    row = store.load("h")
    assert row is not None
    assert (row.status, row.revision, row.lease_owner) == ("halted", 1, None)
    assert (row.lease_epoch, row.takeovers) == (2, 1)
    assert "back at revision 1" in (row.detail or "")
    with pytest.raises(errors.LeaseLostError):  # the stopped runtime's late save
        store.save(leased("h", 1, Lease(owner="A", epoch=1)))
    live = store.load("live")
    assert live is not None
    assert (live.status, live.lease_owner) == ("running", "A")
    # a second takeover in a row (max_takeovers=2): the instance is poison
    assert store.begin("h", "wf", expected_revision=1, lease_owner="C", ttl_ms=0) == 3
    assert store.run(RecoverOp(limit=10, max_takeovers=2)) == [
        ("h", "recovery_required")
    ]
    assert store.run(RecoverOp(limit=10, max_takeovers=2)) == []
    row = store.load("h")
    assert row is not None
    assert (row.takeovers, row.lease_owner) == (2, None)
    assert "2 times in a row" in (row.detail or "")


def test_the_sweep_halts_a_revision_a_checkpoint_saved_running(store: Store) -> None:
    # Before: the sweep put a row back at the status its revision was saved with, so a
    # checkpoint's save (status running, under the lease) came back running without a
    # lease, and nothing ever resumed it.
    assert store.begin("c", "wf", lease_owner="A", ttl_ms=0) == 1
    held = Lease(owner="A", epoch=1)
    assert store.save(leased("c", None, held, status="running")) == 1
    row = store.load("c")
    assert row is not None
    assert (row.status, row.lease_owner) == ("running", "A")  # the checkpoint kept it
    assert store.run(RecoverOp(limit=10, max_takeovers=5)) == [("c", "halted")]
    row = store.load("c")
    assert row is not None
    assert (row.status, row.revision, row.phase, row.lease_owner) == (
        "halted",
        1,
        "p",
        None,
    )
    assert store.begin("c", "wf", expected_revision=1, lease_owner="B", ttl_ms=60_000)


def test_the_sweep_cancels_an_instance_whose_cancellation_its_runtime_never_saw(
    store: Store,
) -> None:
    # Before: the sweep cleared the request with the lease, so an instance whose
    # runtime died after an operator asked for its cancellation went back to halted,
    # its pending event resumed it, and its effects ran again.
    store.save(request("k", None))  # halted at revision 1
    assert store.begin("k", "wf", expected_revision=1, lease_owner="A", ttl_ms=0)
    store.run(storage.PostOp(posting=_posting("k", "e1")))
    store.run(storage.RequestCancelOp(workflow_instance_id="k", reason="by ops"))
    assert store.begin("n", "wf", lease_owner="A", ttl_ms=0)  # never saved
    store.run(storage.RequestCancelOp(workflow_instance_id="n"))
    assert store.begin("h", "wf", lease_owner="A", ttl_ms=0)  # not asked
    store.save(leased("h", None, Lease(owner="A", epoch=1), status="running"))
    assert sorted(store.run(RecoverOp(limit=10, max_takeovers=5))) == [
        ("h", "halted"),
        ("k", "cancelled"),
        ("n", "cancelled"),
    ]
    row = store.load("k")
    assert row is not None
    assert (row.status, row.revision, row.lease_owner, row.cancel_requested) == (
        "cancelled",
        1,
        None,
        None,
    )
    assert "cancelled (by ops) by the recovery sweep at revision 1" in (
        row.detail or ""
    )
    assert "no reason given" in (store.load("n").detail or "")  # type: ignore[union-attr]
    refused = store.run(storage.EntryOp(workflow_instance_id="k", event_id="e1"))
    assert (refused.status, refused.revision) == ("refused", 1)
    assert store.run(storage.PollOp(owner="B", workflows=("wf",))) == ()
    resume = ClaimOp(
        workflow_instance_id="k",
        workflow="wf",
        lease_owner="B",
        ttl_ms=60_000,
        statuses=("halted", "running"),
    )
    assert store.run(resume).epoch is None  # closed: nothing resumes it
    with pytest.raises(errors.LeaseLostError):  # the stopped runtime's late save
        store.save(leased("k", 1, Lease(owner="A", epoch=1)))


def test_each_logged_revision_keeps_its_state_and_each_takeover_is_logged(
    store: Store,
) -> None:
    store.save(request("r", None, snapshot=b'{"n":1}'))
    assert store.begin("r", "wf", expected_revision=1, lease_owner="A", ttl_ms=0) == 1
    assert store.run(RecoverOp(limit=10, max_takeovers=5)) == [("r", "halted")]
    epoch = store.begin("r", "wf", expected_revision=1, lease_owner="B", ttl_ms=60_000)
    assert epoch == 3
    saved = leased("r", 1, Lease(owner="B", epoch=3), status="finished")
    store.save(msgspec.structs.replace(saved, snapshot=b'{"n":2}'))
    first = store.run(storage.RevisionOp(workflow_instance_id="r", revision=1))
    assert first is not None
    assert (first.revision, first.status, first.phase, first.snapshot) == (
        1,
        "halted",
        "p",
        b'{"n":1}',
    )
    assert (first.workflow, first.lease_owner, first.lease_epoch) == ("wf", None, 0)
    second = store.run(storage.RevisionOp(workflow_instance_id="r", revision=2))
    assert (second.status, second.snapshot) == ("finished", b'{"n":2}')
    assert store.run(storage.RevisionOp(workflow_instance_id="r", revision=3)) is None
    assert store.run(storage.RevisionOp(workflow_instance_id="x", revision=1)) is None
    (takeover,) = store.run(storage.TakeoversOp(workflow_instance_id="r"))
    assert (takeover.epoch, takeover.revision, takeover.status) == (2, 1, "halted")
    assert "back at revision 1" in (takeover.detail or "")
    assert takeover.taken_at_ms > 0
    assert store.run(storage.TakeoversOp(workflow_instance_id="x")) == ()
    row = store.load("r")
    assert row is not None
    assert store.run(DeleteOp(workflow_instance_id="r", expected_revision=2)) is None
    assert store.run(storage.TakeoversOp(workflow_instance_id="r")) == ()
    assert store.run(storage.RevisionOp(workflow_instance_id="r", revision=1)) is None


def test_the_history_keeps_as_many_states_and_takeovers_as_saves(
    store: Store,
) -> None:
    depth = 32  # save_log_depth, every store's default
    store.save(msgspec.structs.replace(request("d", None), snapshot=b"1"))
    for revision in range(1, depth + 3):  # a takeover at each revision, then a save
        begun = store.begin(
            "d", "wf", expected_revision=revision, lease_owner="A", ttl_ms=0
        )
        assert begun is not None
        assert store.run(RecoverOp(limit=10, max_takeovers=10**6)) == [("d", "halted")]
        again = msgspec.structs.replace(
            request("d", revision), snapshot=b"%d" % (revision + 1)
        )
        store.save(again)
    takeovers = store.run(storage.TakeoversOp(workflow_instance_id="d", limit=100))
    assert [t.revision for t in takeovers] == list(range(depth + 2, 2, -1))
    states = [
        store.run(storage.RevisionOp(workflow_instance_id="d", revision=r))
        for r in range(1, depth + 4)
    ]
    kept = [r.snapshot for r in states if r is not None]
    assert kept == [b"%d" % r for r in range(4, depth + 4)]


def test_a_save_resets_the_takeover_count(store: Store) -> None:
    store.save(request("t", None))
    store.begin("t", "wf", expected_revision=1, lease_owner="A", ttl_ms=0)
    store.run(RecoverOp())
    epoch = store.begin("t", "wf", expected_revision=1, lease_owner="B", ttl_ms=60_000)
    assert epoch is not None
    store.save(leased("t", 1, Lease(owner="B", epoch=epoch)))
    row = store.load("t")
    assert row is not None
    assert (row.revision, row.takeovers, row.status) == (2, 0, "halted")


def test_a_claim_loads_and_claims_in_one_write(store: Store) -> None:
    def claim(iid: str, owner: str, statuses: tuple[str, ...], create: bool) -> Any:
        claimed = store.run(
            ClaimOp(
                workflow_instance_id=iid,
                workflow="wf",
                lease_owner=owner,
                ttl_ms=60_000,
                statuses=statuses,  # type: ignore[arg-type]
                create=create,
            )
        )
        return claimed.row, claimed.epoch

    assert claim("new", "A", (), True) == (None, 1)  # a new instance: created, claimed
    row = store.load("new")
    assert row is not None
    assert (row.status, row.revision, row.lease_owner) == ("running", 0, "A")
    assert claim("absent", "A", ("halted",), False) == (None, None)
    assert store.load("absent") is None  # a resume never creates a row
    store.save(request("h", None))
    before, epoch = claim("h", "A", ("halted",), False)
    assert (before.status, before.revision, epoch) == ("halted", 1, 1)
    assert store.load("h").status == "running"  # type: ignore[union-attr]
    before, epoch = claim("h", "B", ("halted", "running"), False)
    assert (before.lease_owner, epoch) == ("A", None)  # held by A: not claimed
    store.save(request("f", None, status="finished"))
    before, epoch = claim("f", "A", ("halted",), True)  # a status it does not run on
    assert (before.status, epoch) == ("finished", None)
    assert store.load("f").status == "finished"  # type: ignore[union-attr]
    # a placeholder whose first segment failed before it saved: claimed on request
    store.run(MarkOp(workflow_instance_id="p", status="failed", create=True))
    before, epoch = claim("p", "A", (), True)
    assert (before.status, epoch) == ("failed", None)  # not without placeholders
    placeholder = ClaimOp(
        workflow_instance_id="p",
        workflow="wf",
        lease_owner="A",
        ttl_ms=60_000,
        create=True,
        placeholders=True,
    )
    claimed = store.run(placeholder)
    before, epoch = claimed.row, claimed.epoch
    assert (before.status, before.revision, epoch) == ("failed", 0, 1)
    store.save(
        msgspec.structs.replace(request("p", None), lease=Lease(owner="A", epoch=1))
    )
    # a saved failure is no placeholder any more
    store.run(MarkOp(workflow_instance_id="p", status="failed", expected_revision=1))
    claimed = store.run(placeholder)
    assert (claimed.row.revision, claimed.epoch) == (1, None)


def test_a_leased_save_of_a_row_that_is_gone_is_a_conflict(
    store: Store,
) -> None:
    # Before: MemoryStore accepted it and created the row again (the SQL stores
    # refused it): a lease-holding save always updates the row its claim made.
    assert store.begin("x", "wf", lease_owner="A", ttl_ms=60_000) == 1
    store.delete("x", 0)
    leased = msgspec.structs.replace(
        request("x", None), lease=Lease(owner="A", epoch=1)
    )
    with pytest.raises(errors.ConflictError, match="no saved revision"):
        store.save(leased)
    assert store.load("x") is None
    with pytest.raises(
        errors.ConflictError, match="cannot delete workflow instance 'x'"
    ):
        store.delete("x", 0)


def test_store_identities_are_never_reused() -> None:
    # Before: the identity was id(store), reused by the next store once the first was
    # gone, and a quarantine of the old store's instances reached the new one.
    seen = set()
    for _ in range(100):
        store = MemoryStore()
        seen.add(store.identity)
        del store
    assert len(seen) == 100


def test_a_save_keeps_the_workflow_of_its_row(store: Store) -> None:
    # Before: MemoryStore gave the row the saving request's workflow (the SQL stores
    # keep the row's; a request's name only fills a row that has none).
    store.run(MarkOp(workflow_instance_id="w", status="failed", create=True))
    saved = msgspec.structs.replace(request("w", None), workflow="other")
    assert store.save(saved) == 1
    assert store.load("w").workflow == "other"  # type: ignore[union-attr]
    assert store.save(request("w", 1)) == 2  # the request names "wf"
    assert store.load("w").workflow == "other"  # type: ignore[union-attr]


def test_a_running_save_keeps_the_cancel_request(store: Store) -> None:
    # Before: MemoryStore dropped it (the SQL stores keep it with the lease), so a
    # cancellation asked for during a segment was lost at its next running save.
    assert store.begin("k", "wf", lease_owner="A", ttl_ms=60_000) == 1
    asked = store.run(RequestCancelOp(workflow_instance_id="k", reason="stop"))
    assert asked == (1, True)
    lease = Lease(owner="A", epoch=1)
    assert store.save(leased("k", None, lease, "running")) == 1
    row = store.load("k")
    assert row is not None
    assert (row.lease_owner, row.cancel_requested) == ("A", "stop")
    renewed = store.run(RenewOp(owner="A", instance_ids=("k",), ttl_ms=60_000))
    assert renewed == {"k": (1, "stop", True)}
    assert store.save(leased("k", 1, lease, "cancelled")) == 2
    row = store.load("k")
    assert row is not None
    assert (row.lease_owner, row.cancel_requested) == (None, None)


def test_a_claim_of_a_new_instance_ignores_the_expected_revision(
    store: Store,
) -> None:
    # Before: MemoryStore refused it when the instance had no row (the SQL stores
    # create it: only_new claims an instance that has no row, whatever was expected).
    only_new = BeginOp(
        workflow_instance_id="n", workflow="wf", expected_revision=1, only_new=True
    )
    assert store.run(only_new) == 1
    row = store.load("n")
    assert row is not None
    assert (row.revision, row.status, row.lease_epoch) == (0, "running", 1)
    assert store.run(only_new) is None  # never an existing one


def test_a_mark_never_recreates_a_row_a_lease_or_revision_is_expected_on(
    store: Store,
) -> None:
    # Before (found by the differential model): SQLite and PostgreSQL inserted a
    # placeholder for MarkOp(create=True) on a missing row even when the mark named a
    # lease or an expected revision (MemoryStore refused): a leased segment's failure
    # mark brought back a row an operator had deleted.
    assert store.begin("gone", "wf", lease_owner="A", ttl_ms=60_000) == 1
    store.delete("gone", 0)
    leased = MarkOp(
        workflow_instance_id="gone",
        status="failed",
        create=True,
        lease=Lease(owner="A", epoch=1),
    )
    assert not store.run(leased)
    later = MarkOp(
        workflow_instance_id="gone", status="failed", create=True, expected_revision=3
    )
    assert not store.run(later)
    assert store.load("gone") is None
    placeholder = MarkOp(workflow_instance_id="gone", status="failed", create=True)
    assert store.run(placeholder)
    assert store.load("gone").revision == 0  # type: ignore[union-attr]


def _posting(
    iid: str, event_id: str, event: str = "approve", payload: bytes = b"1"
) -> storage.Posting:
    return storage.Posting(
        workflow_instance_id=iid, event_id=event_id, event=event, payload=payload
    )


def test_the_inbox_stores_events_in_order_once_each(store: Store) -> None:
    store.save(request("i", None))  # halted at revision 1
    posted = [store.run(storage.PostOp(posting=_posting("i", f"e{n}"))) for n in (1, 2)]
    assert [(p.outcome, p.entry.seq) for p in posted] == [("stored", 1), ("stored", 2)]
    assert posted[0].row.revision == 1
    assert posted[0].row.snapshot is None
    # a repeat of an event id stores nothing and is answered with the first entry
    again = store.run(storage.PostOp(posting=_posting("i", "e1")))
    assert (again.outcome, again.entry) == ("duplicate", posted[0].entry)
    other = store.run(storage.PostOp(posting=_posting("i", "e1", payload=b"2")))
    assert (other.outcome, other.entry) == ("mismatch", posted[0].entry)
    pending = store.run(storage.InboxOp(workflow_instance_id="i"))
    assert [(e.seq, e.event_id, e.status) for e in pending] == [
        (1, "e1", "pending"),
        (2, "e2", "pending"),
    ]
    assert store.run(storage.InboxOp(workflow_instance_id="i", after=1)) == pending[1:]
    found = store.run(storage.EntryOp(workflow_instance_id="i", event_id="e2"))
    assert found == pending[1]
    assert store.run(storage.EntryOp(workflow_instance_id="i", event_id="x")) is None
    # a missing or closed instance stores nothing
    missing = store.run(storage.PostOp(posting=_posting("nobody", "e1")))
    assert (missing.outcome, missing.entry, missing.row) == ("missing", None, None)
    store.save(request("done", None, status="finished"))
    closed = store.run(storage.PostOp(posting=_posting("done", "e1")))
    assert (closed.outcome, closed.row.status) == ("closed", "finished")
    assert store.run(storage.InboxOp(workflow_instance_id="done")) == ()


def test_an_inbox_has_no_gaps_in_its_numbers(store: Store) -> None:
    # A segment knows it saw every entry when the numbers it was offered follow each
    # other: a repeat (which stores nothing) must not use up a number.
    store.save(request("g", None))
    store.run(storage.PostOp(posting=_posting("g", "e1")))
    store.run(storage.PostOp(posting=_posting("g", "e1")))  # a repeat
    store.run(storage.PostOp(posting=_posting("g", "e1", payload=b"2")))  # mismatch
    third = store.run(storage.PostOp(posting=_posting("g", "e2")))
    assert third.entry.seq == 2


def test_a_write_that_consumes_an_entry_twice_is_refused_and_changes_nothing(
    store: Store,
) -> None:
    # The store's own guard of exactly-once: an entry consumed by one write cannot be
    # consumed by the next one (a segment that was offered it twice).
    store.save(request("twice", None))
    store.run(storage.PostOp(posting=_posting("twice", "e1")))
    once = (storage.Consumption(seq=1, status="transitioned"),)
    first = msgspec.structs.replace(request("twice", 1), consumed=once)
    assert store.save(first) == 2
    again = msgspec.structs.replace(request("twice", 2), consumed=once)
    refused = store.save_classified(again)
    assert refused.outcome == "known_failure"
    assert isinstance(refused.error, errors.ConflictError)
    assert "inbox entries [1] are not pending" in str(refused.error)
    assert store.load("twice").revision == 2  # type: ignore[union-attr]
    never = (storage.Consumption(seq=7, status="transitioned"),)
    mark = MarkOp(
        workflow_instance_id="twice",
        status="failed",
        expected_revision=2,
        consumed=never,
    )
    with pytest.raises(errors.ConflictError, match=r"\[7\] are not pending"):
        store.run(mark)
    assert store.load("twice").status == "halted"  # type: ignore[union-attr]


def test_entries_a_closing_write_refuses_name_the_row_s_revision(
    store: Store,
) -> None:
    # Before (found by the differential model): a closing mark without an expected
    # revision recorded revision 0 on the entries it refused, and a recovery that
    # put a restarted instance back as finished left its entries pending for good.
    store.save(request("r", None))
    store.save(request("r", 1))  # revision 2
    store.run(storage.PostOp(posting=_posting("r", "e1")))
    assert store.run(MarkOp(workflow_instance_id="r", status="cancelled"))
    refused = store.run(storage.EntryOp(workflow_instance_id="r", event_id="e1"))
    assert (refused.status, refused.revision) == ("refused", 2)
    assert "cancelled at revision 2" in (refused.detail or "")
    store.save(request("f", None, status="finished"))
    assert store.begin("f", "wf", expected_revision=1, lease_owner="A", ttl_ms=0)
    store.run(storage.PostOp(posting=_posting("f", "e1")))  # while it runs again
    assert store.run(RecoverOp(limit=10, max_takeovers=5)) == [("f", "finished")]
    left = store.run(storage.EntryOp(workflow_instance_id="f", event_id="e1"))
    assert (left.status, left.revision) == ("refused", 1)
    assert store.run(storage.PollOp(owner="A", workflows=("wf",))) == ()


def test_raw_inbox_operations_check_what_they_are_given() -> None:
    with pytest.raises(errors.InvalidInputError, match="another instance"):
        ClaimOp(
            workflow_instance_id="a",
            workflow="wf",
            lease_owner="A",
            ttl_ms=1,
            post=_posting("b", "e1"),
        )
    with pytest.raises(errors.InvalidInputError, match="pending must be >= 0"):
        ClaimOp(
            workflow_instance_id="a",
            workflow="wf",
            lease_owner="A",
            ttl_ms=1,
            pending=-1,
        )
    for bad in (0, -1, True):
        with pytest.raises(errors.InvalidInputError, match="limit"):
            storage.InboxOp(workflow_instance_id="a", limit=bad)
        with pytest.raises(errors.InvalidInputError, match="limit"):
            storage.PollOp(owner="A", limit=bad)


def test_a_save_consumes_its_entries_and_a_closing_save_refuses_the_rest(
    store: Store,
) -> None:
    store.save(request("c", None))
    for n in (1, 2, 3):
        store.run(storage.PostOp(posting=_posting("c", f"e{n}")))
    # a refused save consumes nothing
    refused = msgspec.structs.replace(
        request("c", 5), consumed=(storage.Consumption(seq=1, status="transitioned"),)
    )
    assert store.save_classified(refused).outcome == "known_failure"
    assert len(store.run(storage.InboxOp(workflow_instance_id="c"))) == 3
    consuming = msgspec.structs.replace(
        request("c", 1, status="running"),
        consumed=(
            storage.Consumption(seq=1, status="transitioned"),
            storage.Consumption(seq=2, status="rejected", detail="no"),
        ),
    )
    assert store.save(consuming) == 2
    entries = store.run(storage.InboxOp(workflow_instance_id="c", pending_only=False))
    assert [(e.seq, e.status, e.revision, e.detail) for e in entries] == [
        (3, "pending", None, None),
        (2, "rejected", 2, "no"),
        (1, "transitioned", 2, None),
    ]
    assert all(e.consumed_at_ms for e in entries if e.status != "pending")
    store.save(request("c", 2, status="finished"))
    last = store.run(storage.EntryOp(workflow_instance_id="c", event_id="e3"))
    assert (last.status, last.revision) == ("refused", 3)
    assert "finished at revision 3" in (last.detail or "")
    # deleting the instance deletes its inbox
    store.delete("c", 3)
    assert (
        store.run(storage.InboxOp(workflow_instance_id="c", pending_only=False)) == ()
    )


def test_a_mark_consumes_entries_and_the_inbox_keeps_the_last_few(
    store: Store,
) -> None:
    store.save(request("m", None))
    for n in range(SAVE_LOG_DEPTH + 3):
        store.run(storage.PostOp(posting=_posting("m", f"e{n}")))
    marked = MarkOp(
        workflow_instance_id="m",
        status="halted",
        expected_revision=1,
        consumed=tuple(
            storage.Consumption(seq=n + 1, status="dropped")
            for n in range(SAVE_LOG_DEPTH + 2)
        ),
    )
    assert store.run(marked)
    entries = store.run(
        storage.InboxOp(workflow_instance_id="m", pending_only=False, limit=1000)
    )
    consumed = [e for e in entries if e.status != "pending"]
    assert len(consumed) == SAVE_LOG_DEPTH  # pruned with the save log's depth
    assert [e.seq for e in entries if e.status == "pending"] == [SAVE_LOG_DEPTH + 3]
    assert {e.revision for e in consumed} == {1}


def test_the_poll_sees_pending_entries_of_held_and_free_instances(
    store: Store,
) -> None:
    store.save(msgspec.structs.replace(request("unserved", None), workflow="other"))
    for iid in ("free", "mine", "theirs", "failed", "unserved"):
        if iid != "unserved":
            store.save(request(iid, None))
        store.run(storage.PostOp(posting=_posting(iid, "e")))
    assert store.begin(
        "mine", "wf", expected_revision=1, lease_owner="A", ttl_ms=60_000
    )
    assert store.begin(
        "theirs", "wf", expected_revision=1, lease_owner="B", ttl_ms=60_000
    )
    assert store.run(
        MarkOp(workflow_instance_id="failed", status="failed", expected_revision=1)
    )
    polled = store.run(storage.PollOp(owner="A", workflows=("wf",)))
    assert [
        (e.workflow_instance_id, status, owner) for e, status, _, owner in polled
    ] == [
        ("free", "halted", None),
        ("mine", "running", "A"),
    ]
    # a workflow the runtime does not serve: its free instances are left alone
    mine_only = store.run(storage.PollOp(owner="A"))
    assert [e.workflow_instance_id for e, *_ in mine_only] == ["mine"]
    other = store.run(storage.PollOp(owner="A", workflows=("other", "wf")))
    assert [e.workflow_instance_id for e, *_ in other] == ["free", "mine", "unserved"]


def test_a_claim_posts_and_returns_the_pending_entries(store: Store) -> None:
    store.save(request("q", None))
    store.run(storage.PostOp(posting=_posting("q", "first")))
    claimed = store.run(
        ClaimOp(
            workflow_instance_id="q",
            workflow="wf",
            lease_owner="A",
            ttl_ms=60_000,
            statuses=("halted",),
            post=_posting("q", "second"),
            pending=10,
        )
    )
    assert (claimed.epoch, claimed.posted.outcome) == (1, "stored")
    assert [e.event_id for e in claimed.pending] == ["first", "second"]
    # a claim that creates its instance stores its posting too (signal with start)
    created = store.run(
        ClaimOp(
            workflow_instance_id="new",
            workflow="wf",
            lease_owner="A",
            ttl_ms=60_000,
            create=True,
            post=_posting("new", "hello"),
            pending=10,
        )
    )
    assert (created.row, created.epoch, created.posted.outcome) == (None, 1, "stored")
    assert [e.seq for e in created.pending] == [1]
    # refused (held by A), the posting is stored all the same
    busy = store.run(
        ClaimOp(
            workflow_instance_id="new",
            workflow="wf",
            lease_owner="B",
            ttl_ms=60_000,
            statuses=("running",),
            post=_posting("new", "again"),
        )
    )
    assert (busy.epoch, busy.posted.outcome) == (None, "stored")


def test_posts_take_their_instance_s_place_in_a_batch_s_row_order() -> None:
    # Before (found by the differential model): a PostOp names its instance through
    # its posting, which row_order did not look at, so posts ran after every other
    # operation of the batch (and two batches could lock rows in opposite orders).
    from phronomy.storage._base import row_order

    ops: list[storage.StoreOp] = [
        storage.PostOp(posting=_posting("b", "e1")),
        storage.RecoverOp(limit=1, max_takeovers=5),
        storage.PostOp(posting=_posting("a", "e1")),
        storage.SaveOp(request=request("a", 1, status="finished")),
    ]
    assert row_order(ops) == [2, 3, 0, 1]
