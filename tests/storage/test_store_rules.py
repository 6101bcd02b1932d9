"""The store's rules table (phronomy.storage._rules): complete, read by MemoryStore,
and enforced on the SQL stores by the differential model."""

from __future__ import annotations

from typing import TYPE_CHECKING, get_args

import pytest
from hypothesis import Phase

from phronomy.storage import (
    MemoryStore,
    Posting,
    PostOp,
    SaveOp,
    SaveRequest,
    SQLiteStore,
    WorkflowStore,
)
from phronomy.storage._rules import (
    CLAIM,
    NO_ROW,
    NO_SWEEP,
    NO_TERMINATE,
    POST,
    RULES,
    Holder,
    Operation,
    RowStatus,
    Rule,
)

from .test_store_differential import DEPTH, run_model

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

_ACTORS = {"begin", "begin_new", "save_fenced", "mark_fenced", "renew", "fire", "poll"}
"""The operations made for a runtime (the only ones that see a lease as ``mine``)."""


def test_the_table_has_one_rule_for_each_state_of_each_operation() -> None:
    expected = set()
    for operation in get_args(Operation):
        holders: tuple[Holder, ...] = get_args(Holder)
        if operation not in _ACTORS:
            holders = tuple(h for h in holders if h != "mine")
        for status in get_args(RowStatus):
            leased = status in ("running", "recovery_required")  # no other holds one
            for lease in holders if leased else ("free",):
                expected.add((operation, status, lease))
    assert set(RULES) == expected
    assert len(RULES) == 168


def _save(iid: str, status: str) -> SaveOp:
    return SaveOp(
        request=SaveRequest(
            workflow_instance_id=iid,
            expected_revision=None,
            snapshot=b'{"fields":{}}',
            write_id=f"w-{iid}",
            status=status,  # type: ignore[arg-type]
            phase="__end__",
        )
    )


def test_memory_store_reads_its_rules_from_the_table(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    posting = Posting(workflow_instance_id="a", event_id="e", event="go", payload=b"1")
    with MemoryStore() as store:
        store.execute([_save("a", "finished")])[0].unwrap()
        closed = store.execute([PostOp(posting=posting)])[0].unwrap()
        assert closed.outcome == "closed"
        monkeypatch.setitem(RULES, ("post", "finished", "free"), POST)
        stored = store.execute([PostOp(posting=posting)])[0].unwrap()
        assert stored.outcome == "stored"


MUTATIONS: list[tuple[tuple[Operation, RowStatus, Holder], Rule]] = [
    (("post", "finished", "free"), POST),  # an event stored for a finished instance
    (("begin", "running", "live"), CLAIM),  # another runtime's live lease claimed
    (("save_fenced", "running", "free"), NO_ROW),  # a conflict, not a lost lease
    (("recover", "running", "expired"), NO_SWEEP),  # a dead runtime's row left running
    (
        ("terminate", "running", "live"),
        NO_TERMINATE,
    ),  # a forced stop that stops nothing
]


def _mutated_model_fails(
    store: WorkflowStore,
    name: str,
    key: tuple[Operation, RowStatus, Holder],
    rule: Rule,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(RULES, key, rule)
    cell = "/".join(key)
    with pytest.raises(AssertionError, match=f"{name} does not follow the rule {cell}"):
        run_model(
            {name: store},
            memory=False,  # the SQL store alone, held to the (mutated) table
            max_examples=300,
            database=None,
            derandomize=True,
            phases=[Phase.generate],  # no shrinking: finding it is enough
        )


@pytest.mark.parametrize(("key", "rule"), MUTATIONS, ids=lambda v: str(v))
def test_the_model_finds_sqlite_breaking_a_mutated_table(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    key: tuple[Operation, RowStatus, Holder],
    rule: Rule,
) -> None:
    with SQLiteStore(tmp_path / "model.db", save_log_depth=DEPTH) as sqlite:
        _mutated_model_fails(sqlite, "sqlite", key, rule, monkeypatch)


def test_the_model_finds_postgres_breaking_a_mutated_table(
    open_postgres: Callable[..., WorkflowStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    postgres = open_postgres(save_log_depth=DEPTH)
    key, rule = MUTATIONS[1]
    _mutated_model_fails(postgres, "postgres", key, rule, monkeypatch)
