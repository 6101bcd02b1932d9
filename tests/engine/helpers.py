"""Small sessions and receivers used by the engine tests."""

from __future__ import annotations

from typing import Any, cast

from phronomy.engine import (
    Delivery,
    Engine,
    Event,
    ExecutionReceiver,
    GatedSession,
    ResultHandle,
    TerminalPolicy,
)


class CountingSession(GatedSession):
    """Finishes after *n* events; records what it saw."""

    def __init__(
        self, engine: Engine, n: int = 1, *, policy: TerminalPolicy | None = None
    ) -> None:
        super().__init__(engine, terminal_policy=policy)
        self.n = n
        self.seen: list[Event] = []
        self.started = False
        self.done_hook_calls = 0

    def start(self) -> None:
        self.started = True

    def handle_live(self, event: Event) -> None:
        if event.type == "boom":
            raise RuntimeError("deliberate error")
        self.seen.append(event)
        if event.type == "halt":
            self.request_terminal("halted", notify_stable=False)
        elif len(self.seen) >= self.n:
            self.request_terminal("finished", notify_stable=False)

    def terminal_value(self) -> Any:
        return [e.type for e in self.seen]

    def terminal_result(self, revision: int | None) -> Any:
        return [e.type for e in self.seen]

    def on_done(self) -> None:
        self.done_hook_calls += 1


class Recorder(ExecutionReceiver):
    """Records deliveries; can hold the engine busy and admit on demand."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self.delivered: list[Any] = []
        self.busy = 0
        self.shutdown_calls: list[tuple[BaseException | None, bool]] = []
        self.admitted: list[Any] = []

    def idle(self) -> bool:
        return self.busy == 0

    def deliver(self, message: Any) -> None:
        self.assert_dispatcher()
        self.delivered.append(message)
        match message:
            case ("admit", _):
                self.admit()
                self.admitted.append(message)
                self.busy += 1
            case ("done", _):
                self.busy -= 1
            case ("raise", error):
                raise error
            case _:
                pass

    def shutdown(self, error: BaseException | None) -> None:
        on_dispatcher = cast("Engine", self.engine).is_dispatcher()
        self.shutdown_calls.append((error, on_dispatcher))

    def describe_live(self) -> list[str]:
        return [f"recorder busy={self.busy}"] if self.busy else []


class Other(Recorder):
    pass


def post(
    engine: Engine,
    receiver: ExecutionReceiver,
    message: Any,
    *,
    admission: bool = False,
    caller: ResultHandle[Any] | None = None,
) -> bool:
    return engine.post_nowait(
        Delivery(receiver=receiver, message=message, admission=admission, caller=caller)
    )
