"""``Engine.run_session``: a session registered without a handle; a callback learns
how it ended (its result or error, a cut-off or a start that never came), and a
retired one goes to its receiver."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from phronomy import errors
from phronomy.engine import (
    Engine,
    Event,
    SessionEnded,
    TerminalDecision,
    TerminalType,
    open_engine,
)

from .helpers import CountingSession, Recorder


def _collect() -> tuple[list[SessionEnded], trio.Event, Any]:
    ends: list[SessionEnded] = []
    done = trio.Event()

    def on_end(ended: SessionEnded) -> None:
        ends.append(ended)
        done.set()

    return ends, done, on_end


async def test_on_end_gets_the_result_or_the_error(engine: Engine) -> None:
    ends, done, on_end = _collect()
    finishing = CountingSession(engine, 1)
    engine.run_session(finishing, on_end=on_end)
    assert engine.post_nowait(Event(type="go", target_id=finishing.id))
    with trio.fail_after(5):
        await done.wait()
    (ended,) = ends
    assert (ended.session_id, ended.outcome, ended.result) == (
        finishing.id,
        "finished",
        ["go"],
    )
    assert ended.error is None

    ends, done, on_end = _collect()
    failing = CountingSession(engine, 1)
    engine.run_session(failing, on_end=on_end)
    assert engine.post_nowait(Event(type="boom", target_id=failing.id))
    with trio.fail_after(5):
        await done.wait()
    assert [(e.outcome, str(e.error)) for e in ends] == [("error", "deliberate error")]


class _Unknown:
    """A terminal policy whose outcome is unknown: the session retires."""

    def start(self, *, terminal_type: TerminalType, value: Any, sink: Any) -> None:
        sink.post("outcome")

    def handles(self, event: Event) -> bool:
        return event.type == "outcome"

    def decision_for(self, event: Event) -> TerminalDecision:
        return TerminalDecision(action="retire", error=OSError("lost"))


async def test_a_retired_session_goes_to_its_receiver_without_a_handle(
    engine: Engine,
) -> None:
    retired: list[tuple[str, Any, BaseException | None]] = []

    class Owner(Recorder):
        def session_retired(
            self, session_id: str, *, waiter: Any, error: BaseException | None
        ) -> None:
            retired.append((session_id, waiter, error))

    owner = engine.receiver(Owner, Owner)
    ends, _, on_end = _collect()
    session = CountingSession(engine, 1, policy=_Unknown())
    engine.run_session(session, on_end=on_end, receiver=owner)
    assert engine.post_nowait(Event(type="go", target_id=session.id))
    with trio.fail_after(5):
        while not retired:  # noqa: ASYNC110 - set by the dispatcher
            await trio.sleep(0.002)
    assert [(sid, waiter, repr(e)) for sid, waiter, e in retired] == [
        (session.id, None, "OSError('lost')")
    ]
    assert ends == []  # the receiver took it over


async def test_a_session_cut_off_or_never_started_ends_with_an_error() -> None:
    ends: list[SessionEnded] = []
    async with open_engine(shutdown_timeout=0.05) as engine:
        live = CountingSession(engine, 5)
        engine.run_session(live, on_end=ends.append)
        await trio.sleep(0.01)  # it started; it waits for events
    assert [(e.session_id, e.outcome) for e in ends] == [(live.id, "error")]
    assert isinstance(ends[0].error, errors.RuntimeShutdownError)

    ends.clear()
    started: list[str] = []

    async def fails_before_it_starts() -> None:
        async with open_engine(shutdown_timeout=0.05) as engine:
            never = CountingSession(engine, 1)
            started.append(never.id)
            engine.run_session(never, on_end=ends.append)  # started in FIFO order
            raise KeyError("the block fails before it starts")

    with pytest.raises(KeyError):
        await fails_before_it_starts()
    assert [(e.session_id, e.outcome) for e in ends] == [(started[0], "error")]
    assert isinstance(ends[0].error, errors.RuntimeShutdownError)
