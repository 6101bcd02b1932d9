"""Result handles and a stateful model of them."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from phronomy import errors
from phronomy.engine import ResultHandle


async def test_waiter_timeout_leaves_handle_pending_and_later_completion_is_seen() -> (
    None
):
    handle: ResultHandle[str] = ResultHandle("slow")
    with pytest.raises(trio.TooSlowError):
        with trio.fail_after(0.01):
            await handle.result()
    assert handle.status == "pending"
    handle.complete("late")
    assert await handle.result() == "late"


def test_callbacks_are_isolated_and_value_survives(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # scenario 113
    handle: ResultHandle[int] = ResultHandle("cb")
    ran: list[str] = []

    def bad(_: ResultHandle[int]) -> None:
        ran.append("bad")
        raise RuntimeError("callback exploded")

    handle.on_complete(bad)
    handle.on_complete(lambda h: ran.append(f"second:{h.result_nowait()}"))
    handle.on_complete(lambda h: ran.append("third"))
    assert handle.complete(7)
    assert ran == ["bad", "second:7", "third"]
    assert handle.result_nowait() == 7
    # a late raising callback runs at once and does not raise into the registrant
    handle.on_complete(bad)
    assert ran[-1] == "bad"
    assert "callback exploded" in caplog.text


def test_first_settlement_wins() -> None:
    # scenario 114
    handle: ResultHandle[str] = ResultHandle()
    assert handle.complete("first")
    assert not handle.complete("second")
    assert not handle.fail(ValueError("x"))
    assert not handle.cancel()
    assert handle.result_nowait() == "first"


def test_fail_requires_an_exception() -> None:
    handle: ResultHandle[int] = ResultHandle()
    with pytest.raises(TypeError, match="error is required"):
        handle.fail(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ResultHandle.failed("nope")  # type: ignore[arg-type]
    assert handle.status == "pending"


def test_parent_cancel_cascades() -> None:
    parent: ResultHandle[int] = ResultHandle("parent")
    child: ResultHandle[int] = ResultHandle("child", parent=parent)
    assert parent.cancel()
    assert child.status == "cancelled"
    assert child.error is parent.error
    # a child registered after the parent was cancelled is cancelled at once
    late: ResultHandle[int] = ResultHandle("late", parent=parent)
    assert late.status == "cancelled"


def test_cancel_after_completion_does_not_reach_children() -> None:
    parent: ResultHandle[int] = ResultHandle()
    child: ResultHandle[int] = ResultHandle(parent=parent)
    parent.complete(1)
    assert not parent.cancel()
    assert child.status == "pending"


async def test_result_raises_the_same_error_object() -> None:
    err = OSError("io")
    handle: ResultHandle[int] = ResultHandle.failed(err)
    with pytest.raises(OSError) as first:
        await handle.result()
    with pytest.raises(OSError) as second:
        await handle.result()
    assert first.value is err
    assert second.value is err


async def test_cancel_raises_cancellation_error() -> None:
    handle: ResultHandle[int] = ResultHandle("op")
    handle.cancel()
    with pytest.raises(errors.CancellationError, match="op cancelled"):
        await handle.result()


async def test_wait_always_checkpoints() -> None:
    handle: ResultHandle[int] = ResultHandle.completed(1)
    with trio.testing.assert_checkpoints():
        await handle.wait()
    with trio.testing.assert_checkpoints():
        await handle.wait_physical()


def test_physical_completion_is_separate_for_tracking_handles() -> None:
    handle: ResultHandle[int] = ResultHandle(tracks_physical=True)
    order: list[str] = []
    handle.on_physical_complete(lambda h: order.append("physical"))
    handle.on_complete(lambda h: order.append("logical"))
    handle.cancel()
    assert handle.done
    assert not handle.physically_complete
    handle.mark_physically_complete()
    assert order == ["logical", "physical"]

    plain: ResultHandle[int] = ResultHandle()
    assert not plain.physically_complete
    plain.complete(1)
    assert plain.physically_complete


def test_result_nowait_on_pending_would_block() -> None:
    with pytest.raises(trio.WouldBlock):
        ResultHandle[int]().result_nowait()


class HandleModel(RuleBasedStateMachine):
    """Random settle/cancel/callback sequences against a tiny model."""

    def __init__(self) -> None:
        super().__init__()
        self.handle: ResultHandle[int] = ResultHandle("model")
        self.children: list[ResultHandle[int]] = []
        self.expected_status = "pending"
        self.expected_value: int | None = None
        self.callback_runs = 0
        self.callbacks = 0

    @rule(value=st.integers())
    def complete(self, value: int) -> None:
        changed = self.handle.complete(value)
        assert changed == (self.expected_status == "pending")
        if changed:
            self.expected_status, self.expected_value = "completed", value

    @rule()
    def fail(self) -> None:
        changed = self.handle.fail(ValueError("x"))
        assert changed == (self.expected_status == "pending")
        if changed:
            self.expected_status = "failed"

    @rule()
    def cancel(self) -> None:
        changed = self.handle.cancel()
        assert changed == (self.expected_status == "pending")
        if changed:
            self.expected_status = "cancelled"

    @rule()
    def add_child(self) -> None:
        self.children.append(ResultHandle("child", parent=self.handle))

    @rule(raises=st.booleans())
    def add_callback(self, raises: bool) -> None:
        def callback(_: ResultHandle[int]) -> None:
            self.callback_runs += 1
            if raises:
                raise RuntimeError("cb")

        self.callbacks += 1
        self.handle.on_complete(callback)

    @invariant()
    def matches_model(self) -> None:
        assert self.handle.status == self.expected_status
        if self.expected_status == "completed":
            assert self.handle.result_nowait() == self.expected_value
        # every callback ran exactly once iff settled
        assert self.callback_runs == (self.callbacks if self.handle.done else 0)
        for child in self.children:
            if self.expected_status == "cancelled":
                assert child.status == "cancelled"
            else:
                assert child.status == "pending"


TestHandleModel = HandleModel.TestCase
TestHandleModel.settings = settings(
    max_examples=150, stateful_step_count=25, deadline=None
)


class _Recorder(list[str]):
    """A callable collection: empty, so ``bool(recorder)`` is false."""

    def __call__(self, handle: ResultHandle[int]) -> None:
        self.append(handle.status)


def test_falsy_callbacks_run_once_each_in_order() -> None:
    # A handle keeps a lone callback itself and a list from the second: it must tell
    # them apart by type, not truth (regression: a falsy lone callback never ran, and
    # a second callback replaced a falsy first one).
    lone: ResultHandle[int] = ResultHandle()
    alone = _Recorder()
    lone.on_complete(alone)
    lone.complete(1)
    assert alone == ["completed"]

    handle: ResultHandle[int] = ResultHandle()
    first, second = _Recorder(), _Recorder()
    seen: list[str] = []
    handle.on_complete(first)
    handle.on_complete(second)
    handle.on_complete(first)  # twice: called twice
    handle.on_complete(lambda h: h.on_complete(lambda _: seen.append("late")))
    handle.fail(ValueError("x"))
    handle.on_complete(lambda _: seen.append("after"))
    assert (first, second, seen) == (["failed"] * 2, ["failed"], ["late", "after"])
