"""Supervised executions' records as releases before schema 7 wrote them (for the
scripts that made the fixture databases, and for tests of how such rows read now).

Then an agent had one record, the snapshot of an :class:`ExecutionRecord`, in a row
``agent:<agent_id>`` of the workflow ``phronomy.execution``.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from phronomy.engine import random_hex
from phronomy.storage import SaveRequest, encode_snapshot


class ExecutionRecord(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The record an agent's row held."""

    execution_id: str
    status: Literal[
        "active", "completed", "rejected", "cancelled", "failed", "abandoned"
    ]
    steps_completed: int = 0
    error: str | None = None


def record_request(
    agent_id: str, record: ExecutionRecord, expected_revision: int | None
) -> SaveRequest:
    """The save of *record* for *agent_id*, as those releases made it."""
    key = f"agent:{agent_id}"
    revision = (expected_revision or 0) + 1
    active = record.status == "active"
    phase = "active" if active else "__end__"
    status: Literal["running", "failed", "finished"] = (
        "running"
        if active
        else ("failed" if record.status == "abandoned" else "finished")
    )
    return SaveRequest(
        workflow_instance_id=key,
        expected_revision=expected_revision,
        snapshot=encode_snapshot(
            record,
            workflow_instance_id=key,
            revision=revision,
            phase=phase,
            workflow="phronomy.execution",
        ),
        write_id=random_hex(),
        status=status,
        phase=phase,
        workflow="phronomy.execution",
    )
