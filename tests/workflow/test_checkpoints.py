"""Checkpoint wait states (``wait_state(name, checkpoint=event)``) in plain workflows:
one mid-segment save under the lease, then the event in the same segment."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

import phronomy
from phronomy.storage import HistoryOp

if TYPE_CHECKING:
    from pathlib import Path


class Count(phronomy.State):
    n: int = 0


def _flow() -> phronomy.WorkflowDefinition[Count]:
    wf = phronomy.Workflow(Count, name="checkpointed")
    wf.state("a", entry=lambda s: s.merge(n=s.n + 1))
    wf.wait_state("saved", checkpoint="go")
    wf.state("b", entry=lambda s: s.merge(n=s.n + 10))
    wf.transition("a", "saved").transition("saved", "b", on="go")
    wf.transition("b", phronomy.FINISH)
    return wf.build()


async def test_a_checkpoint_saves_and_goes_on_in_the_same_segment(
    tmp_path: Path,
) -> None:
    store = phronomy.SQLiteStore(tmp_path / "c.db")
    async with phronomy.open_runtime(store=store) as runtime:
        result = await runtime.workflows.invoke(_flow(), workflow_instance_id="c-1")
    assert (result.phase, result.state.n, result.halted) == (phronomy.FINISH, 11, False)
    store.open()
    try:
        saves = store.run(HistoryOp(workflow_instance_id="c-1"))
    finally:
        store.close()
    assert [(s.revision, s.status, s.phase) for s in reversed(saves)] == [
        (1, "running", "saved"),  # the checkpoint: the row kept its lease
        (2, "finished", phronomy.FINISH),
    ]


async def test_without_a_store_a_checkpoint_halts_as_a_wait_state() -> None:
    flow = _flow()
    async with phronomy.open_runtime() as runtime:
        halted = await runtime.workflows.invoke(flow)
        assert (halted.phase, halted.state.n, halted.halted) == ("saved", 1, True)
        done = await runtime.workflows.send_event(flow, "go", halted=halted)
    assert (done.phase, done.state.n) == (phronomy.FINISH, 11)


def test_a_checkpoint_must_fire_an_event_its_state_declares() -> None:
    wf = phronomy.Workflow(Count, name="bad")
    wf.state("a")
    wf.wait_state("saved", checkpoint="go")
    wf.transition("a", "saved").transition("saved", phronomy.FINISH, on="other")
    with pytest.raises(
        phronomy.DefinitionError,
        match="checkpoint 'saved' fires 'go', which it does not declare",
    ):
        wf.build()


def test_a_refused_checkpoint_declaration_leaves_no_checkpoint() -> None:
    wf = phronomy.Workflow(Count, name="refused")
    wf.state("a")
    with pytest.raises(phronomy.DefinitionError, match="already declared"):
        wf.wait_state("a", checkpoint="go")
    wf.state("b")
    wf.transition("a", "b").transition("b", phronomy.FINISH)
    assert not wf.build().checkpoints  # the refused call recorded nothing
