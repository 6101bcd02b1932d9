"""Effects: what actions start, how results come back, and who owns the work."""

from __future__ import annotations

import functools
import threading
from typing import Annotated, Any

import pytest
import trio
import trio.testing

import phronomy
from phronomy.workflow import FINISH

from .helpers import until


class Log(phronomy.State):
    events: Annotated[list[str], phronomy.APPEND] = []  # noqa: RUF012
    payloads: Annotated[list[Any], phronomy.APPEND] = []  # noqa: RUF012


def _record(s: Log, e: Any) -> Log:
    return s.merge(events=[e.type], payloads=[e.payload])


def _flow(entry: Any, *, events: tuple[str, ...] = ("done",)) -> Any:
    wf = phronomy.Workflow(Log, name="effects").state("working", entry=entry)
    for event in events:
        wf.transition("working", FINISH, on=event, action=_record)
    return wf.build()


async def test_start_soon_runs_an_async_function_and_delivers_its_result(
    runtime: phronomy.Runtime,
) -> None:
    async def fetch(key: str, *, suffix: str) -> str:
        await trio.lowlevel.checkpoint()
        return key + suffix

    def entry(s: Log, e: Any, effects: phronomy.Effects) -> None:
        effects.start_soon(functools.partial(fetch, suffix="!"), "k", on_done="done")

    result = await runtime.workflows.invoke(_flow(entry))
    assert (result.state.events, result.state.payloads) == (["done"], ["k!"])


async def test_schedule_posts_its_event_after_the_delay(
    runtime: phronomy.Runtime, autojump_clock: trio.testing.MockClock
) -> None:
    def entry(s: Log, e: Any, effects: phronomy.Effects) -> None:
        effects.schedule(30, "done", {"late": True})

    started = trio.current_time()
    result = await runtime.workflows.invoke(_flow(entry))
    assert trio.current_time() - started == pytest.approx(30)
    assert result.state.payloads == [{"late": True}]


async def test_a_failed_effect_goes_to_on_error_or_fails_the_segment(
    runtime: phronomy.Runtime,
) -> None:
    def broken() -> None:
        raise OSError("card declined")

    def handled(s: Log, e: Any, effects: phronomy.Effects) -> None:
        effects.offload(broken, on_done="done", on_error="failed")

    result = await runtime.workflows.invoke(_flow(handled, events=("done", "failed")))
    assert result.state.events == ["failed"]
    assert isinstance(result.state.payloads[0], OSError)

    def unhandled(s: Log, e: Any, effects: phronomy.Effects) -> None:
        effects.offload(broken, on_done="done")

    with pytest.raises(OSError, match="card declined"):
        await runtime.workflows.invoke(_flow(unhandled))


async def test_an_action_that_raises_after_a_request_starts_nothing(
    runtime: phronomy.Runtime,
) -> None:
    ran = threading.Event()

    def entry(s: Log, e: Any, effects: phronomy.Effects) -> None:
        effects.offload(ran.set, on_done="done")
        raise ValueError("changed my mind")

    with pytest.raises(ValueError, match="changed my mind"):
        await runtime.workflows.invoke(_flow(entry))
    await runtime.engine.default_pool.wait_idle()
    assert not ran.is_set()
    assert runtime.engine.default_pool.statistics().submitted_total == 0


async def test_bad_requests_name_what_is_wrong(runtime: phronomy.Runtime) -> None:
    kept: list[phronomy.Effects] = []

    def undeclared(s: Log, e: Any, effects: phronomy.Effects) -> None:
        effects.offload(print, on_done="dnoe")

    with pytest.raises(phronomy.InvalidInputError, match="declares no event 'dnoe'"):
        await runtime.workflows.invoke(_flow(undeclared))

    def negative(s: Log, e: Any, effects: phronomy.Effects) -> None:
        effects.schedule(-1, "done")

    with pytest.raises(phronomy.InvalidInputError, match="from 0 seconds to 100 years"):
        await runtime.workflows.invoke(_flow(negative))

    def not_callable(s: Log, e: Any, effects: phronomy.Effects) -> None:
        effects.start_soon("fetch", on_done="done")  # type: ignore[arg-type]

    with pytest.raises(phronomy.InvalidInputError, match="need a callable, not str"):
        await runtime.workflows.invoke(_flow(not_callable))

    def keep(s: Log, e: Any, effects: phronomy.Effects) -> None:
        kept.append(effects)
        effects.schedule(0, "done")

    await runtime.workflows.invoke(_flow(keep))
    with pytest.raises(phronomy.InstanceStateError, match="while the action"):
        kept[0].schedule(0, "done")


async def test_work_is_owned_by_its_segment(runtime: phronomy.Runtime) -> None:
    # The segment fails while its effects run: trio work is cancelled, a thread's
    # late result is dropped and never reaches the next segment of the instance.
    cancelled = trio.Event()
    release = threading.Event()

    async def forever() -> None:
        try:
            await trio.sleep_forever()
        finally:
            cancelled.set()

    segments: list[str] = []

    def entry(s: Log, e: Any, effects: phronomy.Effects) -> None:
        segments.append(e.target_id)
        if len(segments) == 1:  # only the first segment starts work
            effects.start_soon(forever, on_done="done")
            effects.offload(release.wait, on_done="done")

    wf = phronomy.Workflow(Log, name="owned").state("working", entry=entry)
    wf.transition("working", FINISH, on="done", action=_record)
    wf.transition("working", FINISH, on="stop", action=lambda s: None)
    flow = wf.build()
    first = runtime.workflows.start(flow, workflow_instance_id="owned")
    await until(lambda: runtime.workflows.signal(flow, "owned", "stop"))
    await first.result()
    with trio.fail_after(5):
        await cancelled.wait()
    second = runtime.workflows.start(flow, workflow_instance_id="owned")
    await until(lambda: runtime.statistics().sessions == 1)
    release.set()  # the first segment's thread returns now
    await runtime.engine.default_pool.wait_idle()
    assert not second.done  # its result did not reach the second segment
    assert runtime.workflows.signal(flow, "owned", "stop")
    assert (await second.result()).state.events == []
    assert len(set(segments)) == 2
