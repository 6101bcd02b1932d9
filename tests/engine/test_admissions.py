"""The admission table: pure, so it is tested as plain data against a model."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

import phronomy
from phronomy.engine import Admission, AdmissionTable

BUSY = frozenset({"admitting", "executing", "saving"})
MARKABLE = frozenset({"executing", "saving", "suspended", "recovery_required"})


def _table(capacity: int | None = None) -> AdmissionTable:
    return AdmissionTable(
        noun="thing",
        busy_states=BUSY,
        markable=MARKABLE,
        busy_error=lambda a: phronomy.BusyError(f"{a.key} is {a.state}"),
        capacity=capacity,
    )


def test_owner_tokens_and_holders_are_the_only_authority() -> None:
    table = _table()
    t1, t2 = object(), object()
    table.admit("x", t1, label="flow")
    assert not table.release("x", owner=t2)
    with pytest.raises(
        phronomy.PhronomyInternalError, match="stale thing admission bind"
    ):
        table.bind("x", t2, "s1")
    bound = table.bind("x", t1, "s1", caller="caller")
    assert (bound.state, bound.holder, bound.caller, bound.label) == (
        "executing",
        "s1",
        "caller",
        "flow",
    )
    with pytest.raises(
        phronomy.PhronomyInternalError, match="stale thing admission bind"
    ):
        table.bind("x", t1, "s2")
    with pytest.raises(phronomy.PhronomyInternalError, match="admission update"):
        table.mark("x", "saving", owner=t2)
    with pytest.raises(phronomy.PhronomyInternalError, match="admission update"):
        table.mark("x", "saving", holder="s2")
    with pytest.raises(phronomy.PhronomyInternalError, match="admission update"):
        table.mark("x", "saving")  # no authority at all
    with pytest.raises(ValueError, match="unsupported thing admission state"):
        table.mark("x", "admitting", owner=t1)
    with pytest.raises(phronomy.PhronomyInternalError, match="'y' has no admission"):
        table.mark("y", "executing", owner=t1)
    assert table.mark("x", "saving", holder="s1").state == "saving"
    with pytest.raises(phronomy.BusyError, match="x is saving"):
        table.admit("x", t2)
    assert table.held_by("s1") is table.get("x")
    assert table.release("x", holder="s1")
    assert table.get("x") is None
    assert table.held_by("s1") is None


def test_bad_input_is_named() -> None:
    table = _table()
    with pytest.raises(phronomy.InvalidInputError, match="thing id must not be empty"):
        table.admit("", object())
    with pytest.raises(phronomy.InvalidInputError, match="owner token is required"):
        table.admit("x", None)
    table.admit("x", token := object())
    with pytest.raises(phronomy.InvalidInputError, match="holder id must not be empty"):
        table.bind("x", token, "")
    assert table.state("x") == "admitting"


def test_capacity_counts_busy_admissions_only() -> None:
    table = _table(capacity=2)
    a, b = object(), object()
    table.admit("a", a)
    table.admit("b", b)
    with pytest.raises(phronomy.BackpressureError, match="2 things are starting"):
        table.admit("c", object())
    assert "c" not in table
    table.bind("a", a, "sa")
    table.mark("a", "suspended", owner=a)  # not busy: frees a place
    table.admit("c", object())
    assert table.busy == 2


def test_retire_and_resolve() -> None:
    table = _table()
    table.admit("x", token := object())
    table.bind("x", token, "s1")
    error = OSError("unknown outcome")
    retired = table.retire("s1", error)
    assert retired is not None
    assert (retired.state, retired.holder, retired.error) == (
        "recovery_required",
        None,
        error,
    )
    assert table.retire("s1", error) is None  # the holder no longer holds it
    assert table.busy == 0
    assert table.in_state("recovery_required") == [retired]
    with pytest.raises(phronomy.BusyError):
        table.admit("x", object())
    assert table.resolve("x") == retired
    assert table.resolve("x") is None
    assert len(table) == 0


class TableModel(RuleBasedStateMachine):
    """admit / bind / mark / release / retire / resolve with fresh and stale tokens."""

    keys = st.sampled_from(["a", "b", "c"])
    tokens = Bundle("tokens")
    holders = Bundle("holders")

    def __init__(self) -> None:
        super().__init__()
        self.table = _table(capacity=2)
        self.model: dict[str, dict[str, Any]] = {}
        self.counter = 0

    def busy(self) -> int:
        return sum(r["state"] in BUSY for r in self.model.values())

    @rule(target=tokens)
    def new_token(self) -> object:
        return object()

    @rule(target=holders)
    def new_holder(self) -> str:
        self.counter += 1
        return f"h{self.counter}"

    @rule(key=keys, token=tokens)
    def admit(self, key: str, token: object) -> None:
        if key in self.model:
            with pytest.raises(phronomy.BusyError):
                self.table.admit(key, token)
        elif self.busy() >= 2:
            with pytest.raises(phronomy.BackpressureError):
                self.table.admit(key, token)
        else:
            self.table.admit(key, token)
            self.model[key] = {"owner": token, "holder": None, "state": "admitting"}

    @rule(key=keys, token=tokens, holder=holders)
    def bind(self, key: str, token: object, holder: str) -> None:
        record = self.model.get(key)
        taken = any(r["holder"] == holder for r in self.model.values())
        if record is None or record["owner"] is not token or record["holder"] or taken:
            if not taken:
                with pytest.raises(phronomy.PhronomyInternalError):
                    self.table.bind(key, token, holder)
            return
        self.table.bind(key, token, holder)
        record.update(holder=holder, state="executing")

    @rule(key=keys, token=tokens, state=st.sampled_from(sorted(MARKABLE)))
    def mark_by_owner(self, key: str, token: object, state: str) -> None:
        record = self.model.get(key)
        if record is None or record["owner"] is not token:
            with pytest.raises(phronomy.PhronomyInternalError):
                self.table.mark(key, state, owner=token)
            return
        self.table.mark(key, state, owner=token)
        record["state"] = state

    @rule(key=keys, holder=holders)
    def release_by_holder(self, key: str, holder: str) -> None:
        record = self.model.get(key)
        expected = record is not None and record["holder"] == holder
        assert self.table.release(key, holder=holder) == expected
        if expected:
            del self.model[key]

    @rule(key=keys, token=tokens)
    def release_by_owner(self, key: str, token: object) -> None:
        record = self.model.get(key)
        expected = record is not None and record["owner"] is token
        assert self.table.release(key, owner=token) == expected
        if expected:
            del self.model[key]

    @rule(holder=holders)
    def retire(self, holder: str) -> None:
        found = [k for k, r in self.model.items() if r["holder"] == holder]
        retired = self.table.retire(holder, None)
        assert (retired is not None) == bool(found)
        for key in found:
            self.model[key].update(holder=None, state="recovery_required")

    @rule(key=keys)
    def resolve(self, key: str) -> None:
        record = self.model.get(key)
        expected = record is not None and record["state"] == "recovery_required"
        assert (self.table.resolve(key) is not None) == expected
        if expected:
            del self.model[key]

    @invariant()
    def matches(self) -> None:
        for key in ("a", "b", "c"):
            record = self.model.get(key)
            actual: Admission | None = self.table.get(key)
            if record is None:
                assert actual is None
                continue
            assert actual is not None
            assert actual.owner is record["owner"]
            assert actual.holder == record["holder"]
            assert actual.state == record["state"]
        assert self.table.busy == self.busy()


TestTableModel = TableModel.TestCase
TestTableModel.settings = settings(
    max_examples=200, stateful_step_count=30, deadline=None
)
