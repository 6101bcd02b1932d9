"""The attribute names of phronomy's spans and metrics (the ``phronomy.`` namespace)."""

from __future__ import annotations

from typing import Final

__all__ = ["EPOCH", "INSTANCE", "NS", "REVISION", "STATE", "STATUS", "WORKFLOW"]

NS: Final = "phronomy."
WORKFLOW: Final = "phronomy.workflow"
INSTANCE: Final = "phronomy.instance_id"
STATE: Final = "phronomy.state"
REVISION: Final = "phronomy.revision"
EPOCH: Final = "phronomy.lease.epoch"
STATUS: Final = "phronomy.status"
