"""The batcher behind group commit: grouping, order, and failures."""

from __future__ import annotations

import functools
import threading
from typing import Any

import outcome
import pytest
import trio

from phronomy import errors
from phronomy.engine import Batcher, Engine


async def test_items_arriving_during_a_batch_form_the_next_one(engine: Engine) -> None:
    gate = threading.Event()
    batches: list[list[int]] = []

    def run(items: list[int]) -> list[outcome.Outcome[int]]:
        if not batches:
            gate.wait(5)
        batches.append(items)
        return [
            outcome.Value(i * 10) if i != 3 else outcome.Error(KeyError(i))
            for i in items
        ]

    batcher: Batcher[int, int] = Batcher(engine.pool("b", size=1), run)
    results: dict[int, Any] = {}
    for i in range(5):
        batcher.submit(i, functools.partial(results.__setitem__, i))
    busy = batcher.idle  # a local: the later check is not narrowed by this one
    assert not busy
    gate.set()
    with trio.fail_after(5):
        await batcher.wait_idle()
    assert len(results) == 5
    assert batches == [[0], [1, 2, 3, 4]]  # order kept; the waiting items went together
    assert [results[i].unwrap() for i in (0, 1, 2, 4)] == [0, 10, 20, 40]
    with pytest.raises(KeyError):
        results[3].unwrap()  # one item's failure does not fail its neighbours
    assert batcher.idle
    assert (batcher.batches, batcher.items) == (2, 5)


async def test_a_failed_or_refused_batch_fails_each_item(engine: Engine) -> None:
    def explode(items: list[int]) -> list[outcome.Outcome[int]]:
        raise RuntimeError("worker crashed")

    got: list[outcome.Outcome[int]] = []
    done = trio.Event()

    def collect(result: outcome.Outcome[int]) -> None:
        got.append(result)
        if len(got) == 2:
            done.set()

    batcher: Batcher[int, int] = Batcher(engine.pool("x", size=1), explode)
    batcher.submit(1, collect)
    batcher.submit(2, collect)
    await done.wait()
    assert all(
        isinstance(r, outcome.Error) and isinstance(r.error, RuntimeError) for r in got
    )

    closed = engine.pool("closed", size=1)
    closed.close()
    refused: list[outcome.Outcome[int]] = []
    Batcher(closed, explode).submit(1, refused.append)
    assert isinstance(refused[0], outcome.Error)
    assert isinstance(refused[0].error, errors.RuntimeShutdownError)


async def test_wrong_result_count_is_an_internal_error(engine: Engine) -> None:
    got: list[outcome.Outcome[int]] = []
    done = trio.Event()

    def short(items: list[int]) -> list[outcome.Outcome[int]]:
        return []

    def collect(result: outcome.Outcome[int]) -> None:
        got.append(result)
        done.set()

    Batcher(engine.pool("s", size=1), short).submit(1, collect)
    await done.wait()
    assert isinstance(got[0], outcome.Error)
    assert isinstance(got[0].error, errors.PhronomyInternalError)
