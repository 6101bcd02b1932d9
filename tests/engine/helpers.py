"""Small sessions used by the engine tests."""

from __future__ import annotations

from typing import Any

from phronomy.engine import Engine, Event, GatedSession, TerminalPolicy


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

    def terminal_result(self) -> Any:
        return [e.type for e in self.seen]

    def on_done(self) -> None:
        self.done_hook_calls += 1
