"""The driver's stand-in for a segment's result handle (``agent._segment``)."""

from __future__ import annotations

import logging
from typing import Any, cast

import pytest
import trio

import phronomy
from phronomy.agent._segment import SegmentCaller
from phronomy.engine import ResultHandle, tracked


class _Driver:
    def __init__(self, *, raises: bool = False) -> None:
        self.ends: list[tuple[Any, BaseException | None]] = []
        self._raises = raises

    def segment_done(self, result: Any, error: BaseException | None) -> None:
        self.ends.append((result, error))
        if self._raises:
            raise RuntimeError("driver broke")


def _caller(driver: _Driver) -> SegmentCaller:
    return SegmentCaller(driver)


def test_the_first_settlement_wins_and_reaches_the_driver() -> None:
    driver = _Driver()
    caller = _caller(driver)
    pending = caller.done
    assert caller.complete(cast("Any", "result"))
    assert (pending, caller.done) == (False, True)
    assert not caller.fail(ValueError("late"))
    assert not caller.cancel()
    assert driver.ends == [("result", None)]


def test_a_cancel_without_an_error_gives_the_driver_one() -> None:
    driver = _Driver()
    assert _caller(driver).cancel()
    [(result, error)] = driver.ends
    assert result is None
    assert isinstance(error, phronomy.CancellationError)


def test_it_settles_like_a_settled_handle() -> None:
    done: ResultHandle[Any] = ResultHandle.completed("value")
    failed: ResultHandle[Any] = ResultHandle.failed(KeyError("k"))
    driver = _Driver()
    _caller(driver).settle_like(done)
    _caller(driver).settle_like(failed)
    assert driver.ends[0] == ("value", None)
    assert driver.ends[1][0] is None
    assert isinstance(driver.ends[1][1], KeyError)


def test_an_error_of_the_driver_is_logged_not_raised_to_the_settler(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR)
    caller = _caller(_Driver(raises=True))
    assert caller.fail(ValueError("segment failed"))
    assert caller.done
    assert "driver failed at a segment's end" in caplog.text
    assert "driver broke" in caplog.text


def test_the_engine_tracks_handles_and_leaves_stand_ins_to_their_owner() -> None:
    handle: ResultHandle[Any] = ResultHandle()
    assert tracked(handle) is handle
    assert tracked(_caller(_Driver())) is None


async def test_a_start_the_runtime_refuses_settles_the_execution() -> None:
    async with phronomy.open_runtime() as rt:
        pass
    # the engine refuses the segment's start: the stand-in fails, the driver settles
    execution = rt.executions.start("late", [int], "1")
    with trio.fail_after(5), pytest.raises(phronomy.RuntimeShutdownError):
        await execution.result()
    assert rt.executions.owner(execution.execution_id) is None
