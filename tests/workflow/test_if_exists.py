"""Starting an id the store holds: the if_exists policy, every status x every policy."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

import phronomy
from phronomy.storage import (
    BeginOp,
    InstanceStatus,
    MarkOp,
    SaveRequest,
    encode_snapshot,
)

from .helpers import Value, approval_flow, runtime_on

if TYPE_CHECKING:
    from collections.abc import Callable

    from phronomy.workflow import IfExists

FLOW = approval_flow()  # prepare -> awaiting (wait) -approve-> confirm -> FINISH


def _save(
    store: Any, iid: str, rev: int | None, phase: str, status: InstanceStatus
) -> None:
    revision = (rev or 0) + 1
    state = Value(value=f"stored-{revision}", steps=["stored"])
    blob = encode_snapshot(
        state,
        workflow_instance_id=iid,
        revision=revision,
        phase=phase,
        workflow=FLOW.name,
    )
    store.save(
        SaveRequest(
            workflow_instance_id=iid,
            expected_revision=rev,
            snapshot=blob,
            write_id=f"{iid}-{revision}",
            status=status,
            phase=phase,
            workflow=FLOW.name,
            definition_version=FLOW.version,
        )
    )


def _prepare(store: Any, iid: str, status: str) -> None:
    """Put *iid* in the store with *status* (``none``: absent)."""
    match status:
        case "none":
            pass
        case "halted" | "cancelled":
            _save(store, iid, None, "awaiting", status)
        case "finished":
            _save(store, iid, None, "__end__", "finished")
        case "running":
            _save(store, iid, None, "awaiting", "halted")
            store.run(
                BeginOp(
                    workflow_instance_id=iid, workflow=FLOW.name, expected_revision=1
                )
            )
        case "running-unsaved":
            store.run(
                BeginOp(
                    workflow_instance_id=iid, workflow=FLOW.name, expected_revision=None
                )
            )
        case "failed" | "recovery_required":
            _save(store, iid, None, "awaiting", "halted")
            store.run(
                MarkOp(
                    workflow_instance_id=iid,
                    status=status,
                    detail="x",
                    expected_revision=1,
                    workflow=FLOW.name,
                )
            )
        case "failed-unsaved":
            store.run(
                MarkOp(
                    workflow_instance_id=iid,
                    status="failed",
                    detail="x",
                    expected_revision=None,
                    workflow=FLOW.name,
                    create=True,
                )
            )


RAN, RETURNED, EXISTS, RECOVERY = "ran", "returned", "exists", "recovery"
MATRIX = {
    # status:              refuse,   return,   restart
    "none": (RAN, RAN, RAN),
    "halted": (EXISTS, RETURNED, RAN),
    "running": (EXISTS, RETURNED, RAN),
    "running-unsaved": (EXISTS, EXISTS, RAN),
    "finished": (EXISTS, RETURNED, RAN),
    "failed": (EXISTS, RETURNED, RAN),
    "failed-unsaved": (RAN, RAN, RAN),  # nothing durable: it never saved
    "cancelled": (EXISTS, RETURNED, RAN),
    "recovery_required": (RECOVERY, RECOVERY, RECOVERY),
}
POLICIES: tuple[IfExists, ...] = ("refuse", "return", "restart")


@pytest.mark.parametrize("status", sorted(MATRIX))
async def test_every_status_under_every_policy(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]], status: str
) -> None:
    store = make_store()
    for policy, expected in zip(POLICIES, MATRIX[status], strict=True):
        iid = f"{status}-{policy}"
        _prepare(store, iid, status)
        before = store.load(iid)  # None: status "none"
        async with runtime_on(store) as rt:
            call = rt.workflows.invoke(
                FLOW, {"value": "input"}, workflow_instance_id=iid, if_exists=policy
            )
            if expected == EXISTS:
                assert before is not None  # only a stored instance exists
                with pytest.raises(phronomy.InstanceExistsError) as caught:
                    await call
                error = caught.value
                assert (error.instance_id, error.status) == (
                    iid,
                    before.status,
                )
                assert "if_exists='restart'" in str(error)
                if before.status in ("finished", "cancelled"):
                    assert "accepts no events" in str(error)
                else:
                    assert "send_event" in str(error)
                assert store.load(iid) == before
            elif expected == RECOVERY:
                with pytest.raises(phronomy.RecoveryRequiredError):
                    await call
                assert store.load(iid) == before
            elif expected == RETURNED:
                assert before is not None  # only a stored result is returned
                result = await call
                assert (result.revision, result.status, result.phase) == (
                    before.revision,
                    before.status,
                    before.phase,
                )
                assert result.state.value == f"stored-{before.revision}"
                assert store.load(iid) == before  # nothing ran
            else:
                result = await call
                assert (result.phase, result.status) == ("awaiting", "halted")
                assert result.state.value == "input:prepared"  # the input overrides
                previous = before.revision if before is not None else 0
                assert result.revision == previous + 1
                if before is not None and before.revision:
                    assert result.state.steps == ["stored", "prepare"]  # hydrated


async def test_a_bad_policy_is_refused_before_anything_runs(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    async with runtime_on(make_store()) as rt:
        with pytest.raises(phronomy.InvalidInputError, match="if_exists must be"):
            rt.workflows.start(FLOW, workflow_instance_id="x", if_exists="replace")  # type: ignore[arg-type]
        assert rt.workflows.segment("x") is None


async def test_the_readme_flow_runs_twice(
    make_store: Callable[[], phronomy.storage.BaseStore[Any]],
) -> None:
    # Before: a second invoke of a halted id restarted it silently (revision 3).
    store = make_store()
    for _ in range(2):
        async with runtime_on(store) as rt:
            halted = await rt.workflows.invoke(
                FLOW,
                {"value": "lamp"},
                workflow_instance_id="order-1",
                if_exists="return",
            )
            assert (halted.phase, halted.revision) == ("awaiting", 1)
    async with runtime_on(store) as rt:
        with pytest.raises(phronomy.InstanceExistsError, match="halted at 'awaiting'"):
            await rt.workflows.invoke(FLOW, workflow_instance_id="order-1")
