"""Definition versions: saved with every save, checked when another version loads."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

import phronomy
from phronomy.workflow import FINISH
from records import loaded

from .helpers import runtime_on

if TYPE_CHECKING:
    from collections.abc import Callable


class OrderV1(phronomy.State):
    item: str = ""
    qty: int = 1


class OrderV2(phronomy.State):  # an added optional field: compatible
    item: str = ""
    qty: int = 1
    note: str = ""


class OrderV3(phronomy.State):  # qty removed, a required field added
    item: str = ""
    owner: str


def v1() -> phronomy.WorkflowDefinition[OrderV1]:
    wf = phronomy.Workflow(OrderV1, name="orders")
    wf.state("draft").wait_state("awaiting")
    wf.transition("draft", "awaiting")
    wf.transition("awaiting", FINISH, on="approve")
    return wf.build()


def v2() -> phronomy.WorkflowDefinition[OrderV2]:
    wf = phronomy.Workflow(OrderV2, name="orders")
    wf.state("draft").wait_state("awaiting").state("review")  # an added state
    wf.transition("draft", "awaiting")
    wf.transition("awaiting", "review", on="approve")
    wf.transition("review", FINISH, action=lambda s: s.merge(note="reviewed"))
    return wf.build()


def v3() -> phronomy.WorkflowDefinition[OrderV3]:
    wf = phronomy.Workflow(OrderV3, name="orders", version="2026-12")
    wf.state("draft").wait_state("pending")  # "awaiting" renamed
    wf.transition("draft", "pending")
    wf.transition("pending", FINISH, on="approve")
    return wf.build()


def test_versions_are_fingerprints_of_the_shape_unless_given() -> None:
    assert v1().version.startswith("fp-")
    assert v1().version == v1().version  # deterministic
    assert len({v1().version, v2().version, v3().version}) == 3
    assert v3().version == "2026-12"
    wf = phronomy.Workflow(OrderV1, name="orders")
    wf.state("draft", entry=lambda s: s).wait_state("awaiting")  # code changes only
    wf.transition("draft", "awaiting")
    wf.transition("awaiting", FINISH, on="approve", guard=lambda s: True)
    assert wf.build().version == v1().version
    with pytest.raises(phronomy.DefinitionError, match="version must be"):
        phronomy.Workflow(OrderV1, version="")


async def test_three_versions_of_one_workflow(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    store = make_store()
    async with runtime_on(store) as rt:
        first = await rt.workflows.invoke(
            v1(), {"item": "lamp", "qty": 2}, workflow_instance_id="o-1"
        )
        second = await rt.workflows.invoke(
            v1(), {"item": "desk"}, workflow_instance_id="o-2"
        )
        assert first.revision == second.revision == 1
        row = loaded(store, "o-1")
        assert row.definition_version == v1().version
        # version 2 resumes an instance version 1 saved: it only adds things
        done = await rt.workflows.send_event(
            v2(), "approve", workflow_instance_id="o-1"
        )
        assert (done.state.qty, done.state.note, done.phase) == (2, "reviewed", FINISH)
        assert loaded(store, "o-1").definition_version == v2().version
        # version 3 lacks the halted state and a field, and needs a new one
        with pytest.raises(phronomy.errors.DefinitionMismatchError) as caught:
            await rt.workflows.send_event(v3(), "approve", workflow_instance_id="o-2")
        error = caught.value
        assert (error.stored_version, error.version) == (v1().version, "2026-12")
        assert error.missing == (
            "state 'awaiting'",
            "field 'qty'",
            "a value for the new required field 'owner'",
        )
        assert v1().version in str(error)
        assert "2026-12" in str(error)
        row = loaded(store, "o-2")
        assert (row.revision, row.status) == (1, "halted")  # nothing changed
        # the version that saved it still runs it
        assert (
            await rt.workflows.send_event(v1(), "approve", workflow_instance_id="o-2")
        ).revision == 2
