"""A stateful model of agent admission (spec §6.2): admit, bind, mark, release, recovery."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

import phronomy
from phronomy.agent._registry import AgentRegistry

KEYS = st.sampled_from(["k1", "k2"])
STATES = st.sampled_from(
    [
        "executing",
        "suspended",
        "resuming",
        "cancelling",
        "terminalizing",
        "recovery_required",
    ]
)
BUSY = {"admitting", "executing", "resuming", "cancelling", "terminalizing"}


class _Engine:
    def assert_dispatcher(self) -> None:
        pass

    def admit(self, receiver: object) -> None:
        pass


class AdmissionModel(RuleBasedStateMachine):
    tokens = Bundle("tokens")
    executions = Bundle("executions")

    def __init__(self) -> None:
        super().__init__()
        self.registry = AgentRegistry(_Engine(), lambda message: None, capacity=10**9)  # type: ignore[arg-type]
        self.model: dict[str, dict[str, Any]] = {}
        self.count = 0

    @rule(target=tokens)
    def token(self) -> object:
        return object()

    @rule(target=executions)
    def execution(self) -> str:
        self.count += 1
        return f"e{self.count}"

    @rule(key=KEYS, token=tokens)
    def admit(self, key: str, token: object) -> None:
        if key in self.model:
            with pytest.raises(
                phronomy.BusyError,
                match="already has a nonterminal top-level execution",
            ):
                self.registry.admit_agent_execution(key, token)
            return
        self.registry.admit_agent_execution(key, token)
        self.model[key] = {"owner": token, "execution": None, "state": "admitting"}

    @rule(key=KEYS, token=tokens, execution=executions)
    def bind(self, key: str, token: object, execution: str) -> None:
        record = self.model.get(key)
        if (
            record is None
            or record["owner"] is not token
            or record["execution"] is not None
        ):
            with pytest.raises(phronomy.PhronomyInternalError):
                self.registry.bind_agent_execution_admission(key, token, execution)
            return
        self.registry.bind_agent_execution_admission(key, token, execution)
        record.update(execution=execution, state="executing")

    @rule(key=KEYS, execution=executions, state=STATES)
    def mark(self, key: str, execution: str, state: str) -> None:
        record = self.model.get(key)
        if record is None or record["execution"] != execution:
            with pytest.raises(phronomy.PhronomyInternalError):
                self.registry.mark_agent_execution_admission(key, execution, state)  # type: ignore[arg-type]
            return
        self.registry.mark_agent_execution_admission(key, execution, state)  # type: ignore[arg-type]
        record["state"] = state

    @rule(key=KEYS, token=tokens)
    def recovery_by_token(self, key: str, token: object) -> None:
        record = self.model.get(key)
        if record is None or record["owner"] is not token:
            with pytest.raises(phronomy.PhronomyInternalError):
                self.registry.mark_agent_admission_recovery_required(key, token)
            return
        self.registry.mark_agent_admission_recovery_required(key, token)
        record["state"] = "recovery_required"

    @rule(key=KEYS, token=tokens)
    def release_by_token(self, key: str, token: object) -> None:
        record = self.model.get(key)
        expected = record is not None and record["owner"] is token
        assert (
            self.registry.release_agent_execution_admission(key, owner=token)
            == expected
        )
        if expected:
            del self.model[key]

    @rule(key=KEYS, execution=executions)
    def release_by_execution(self, key: str, execution: str) -> None:
        record = self.model.get(key)
        expected = record is not None and record["execution"] == execution
        assert (
            self.registry.release_agent_execution_admission(key, execution_id=execution)
            == expected
        )
        if expected:
            del self.model[key]

    @rule(key=KEYS)
    def release_without_authority(self, key: str) -> None:
        assert not self.registry.release_agent_execution_admission(key)

    @invariant()
    def matches(self) -> None:
        for key in ("k1", "k2"):
            record = self.model.get(key)
            actual = self.registry.admission(key)
            assert self.registry.agent_execution_admitted(key) == (record is not None)
            if record is None:
                assert actual is None
                continue
            assert actual is not None
            assert actual.owner is record["owner"]
            assert actual.execution_id == record["execution"]
            assert actual.state == record["state"]
        assert self.registry.idle() == (
            not any(r["state"] in BUSY for r in self.model.values())
        )


TestAdmissionModel = AdmissionModel.TestCase
TestAdmissionModel.settings = settings(
    max_examples=200, stateful_step_count=30, deadline=None
)
