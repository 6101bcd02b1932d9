"""A workflow whose approval fails while ``FAILING["on"]`` (a service that is down):
the retry tests of the command line and the console fail an instance for real."""

from __future__ import annotations

from typing import Any

import phronomy

__all__ = ["FAILING", "FLOW"]

FAILING = {"on": True}
"""Whether the approval's service is down (each test sets it)."""


class _Order(phronomy.State):
    by: str = ""


def _approve(state: _Order, event: Any) -> _Order:
    if FAILING["on"]:
        raise RuntimeError("the approval service is down")
    return state.merge(by=event.payload["by"])


FLOW = (
    phronomy.Workflow(_Order, name="orders")
    .wait_state("awaiting")
    .initial("awaiting")
    .transition("awaiting", phronomy.FINISH, on="approve", action=_approve)
    .build()
)
