"""A model-based test of the store contract on a real SQLite file (RELIABILITY.md §2.6).

Invariants checked after every step, against the file itself (a separate connection):

* S2: each instance's committed revisions form a gapless chain 1..n, each with a
  unique ``write_id`` (the save log keeps the last ``SAVE_LOG_DEPTH`` of them);
* S3: an acknowledged revision never changes its ``write_id``;
* S4: every acknowledged save is present, also after the store is closed and reopened;
* S5: every save with an unknown outcome is classified as what really happened.
"""

from __future__ import annotations

import itertools
import shutil
import sqlite3
import tempfile
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

from phronomy import errors
from phronomy.storage import SAVE_LOG_DEPTH, SaveOp, SaveRequest, SQLiteStore, StoreOp

_write_ids = itertools.count()


class StoreModel(RuleBasedStateMachine):
    store_class: ClassVar[type[SQLiteStore]] = SQLiteStore

    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="phronomy-model-"))
        self.path = self.directory / "model.db"
        self.armed: str | None = None
        self.store = self.store_class(self.path, fault_hook=self._hook)
        self.store.load("init")  # create the schema before the first invariant check
        self.acked: dict[
            str, list[str]
        ] = {}  # instance -> write_id per revision (index = revision - 1)

    def _hook(self, point: str) -> None:
        if point == self.armed:
            self.armed = None
            raise OSError(f"injected uncertainty at {point}")

    def _request(self, iid: str, expected: int | None) -> SaveRequest:
        return SaveRequest(
            workflow_instance_id=iid,
            expected_revision=expected,
            snapshot=b'{"fields":{}}',
            write_id=f"w{next(_write_ids)}",
            status="halted",
            phase="p",
        )

    def _current(self, iid: str) -> int:
        return len(self.acked.get(iid, []))

    @rule(iid=st.sampled_from(["a", "b"]))
    def save(self, iid: str) -> None:
        current = self._current(iid)
        request = self._request(iid, current or None)
        assert self.store.save(request) == current + 1
        self.acked.setdefault(iid, []).append(request.write_id)

    @rule(iid=st.sampled_from(["a", "b"]), delta=st.sampled_from([-1, 1, 2]))
    def stale_save(self, iid: str, delta: int) -> None:
        current = self._current(iid)
        wrong = current + delta
        expected = None if wrong <= 0 else wrong
        if (expected or 0) == current:
            return
        try:
            self.store.save(self._request(iid, expected))
        except errors.ConflictError:
            return
        raise AssertionError(
            f"a save expecting revision {expected} was accepted at revision {current}"
        )

    @rule(
        iid=st.sampled_from(["a", "b"]),
        point=st.sampled_from(["save.applied", "commit.before", "commit.after"]),
    )
    def uncertain_save(self, iid: str, point: str) -> None:
        current = self._current(iid)
        request = self._request(iid, current or None)
        self.armed = point
        outcome = self.store.save_classified(request)
        if point == "commit.after":  # ground truth: it committed
            assert (outcome.outcome, outcome.revision) == ("success", current + 1)
            self.acked.setdefault(iid, []).append(request.write_id)
        else:  # ground truth: it never committed
            assert outcome.outcome == "known_failure"
            assert isinstance(outcome.error, OSError)

    @rule()
    def reopen(self) -> None:
        self.store.close()

    @rule(iid=st.sampled_from(["a", "b"]))
    def delete(self, iid: str) -> None:
        current = self._current(iid)
        if current == 0:
            return
        self.store.delete(iid, current)
        del self.acked[iid]

    @invariant()
    def durable_history_matches(self) -> None:
        raw = sqlite3.connect(self.path)
        try:
            for iid in ("a", "b"):
                log = raw.execute(
                    "SELECT revision, write_id FROM phronomy_save_log WHERE instance_id = ? ORDER BY revision",
                    (iid,),
                ).fetchall()
                row = raw.execute(
                    "SELECT revision, last_write_id FROM phronomy_workflow_instances WHERE instance_id = ?",
                    (iid,),
                ).fetchone()
                acked = self.acked.get(iid, [])
                kept = min(len(acked), SAVE_LOG_DEPTH)  # older entries are pruned
                assert [r for r, _ in log] == list(
                    range(len(acked) - kept + 1, len(acked) + 1)
                )  # S2: gapless
                assert len({w for _, w in log}) == len(log)  # S2: unique write ids
                assert [w for _, w in log] == acked[
                    len(acked) - kept :
                ]  # S3 + S4: exactly the acknowledged saves
                if acked:
                    assert row == (len(acked), acked[-1])
                else:
                    assert row is None
        finally:
            raw.close()

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.directory, ignore_errors=True)


TestStoreModel = StoreModel.TestCase
TestStoreModel.settings = settings(
    max_examples=150, stateful_step_count=30, deadline=None
)


class NoRevisionCheck(SQLiteStore):  # type: ignore[misc]  # a deliberate mutant
    """A deliberately broken store: it saves whatever revision the caller expected."""

    def apply(self, conn: sqlite3.Connection, op: StoreOp) -> Any:
        if isinstance(op, SaveOp):
            row = conn.execute(
                "SELECT revision FROM phronomy_workflow_instances"
                " WHERE instance_id = ?",
                (op.request.workflow_instance_id,),
            ).fetchone()
            current = row[0] if row else 0
            request = msgspec.structs.replace(
                op.request, expected_revision=current or None
            )
            op = SaveOp(request=request)
        return super().apply(conn, op)


def test_the_model_catches_a_store_without_revision_checks() -> None:
    class BrokenModel(StoreModel):
        store_class = NoRevisionCheck  # type: ignore[mutable-override]

    with pytest.raises(AssertionError, match="was accepted"):
        run_state_machine_as_test(
            BrokenModel,
            settings=settings(
                max_examples=200, stateful_step_count=20, deadline=None, database=None
            ),
        )
