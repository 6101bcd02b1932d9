"""What an operation the store's rules let go ahead does to the row (see
:mod:`phronomy.storage._rules`): its lease columns, its status, a sweep's status."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    from ._records import InstanceStatus, StoredRecord
    from ._rules import Rule

__all__ = ["LeaseFields", "lease_after", "status_after", "swept"]


class LeaseFields(TypedDict):
    """A row's lease columns."""

    lease_owner: str | None
    lease_epoch: int
    lease_expires_at_ms: int | None
    cancel_requested: str | None


def lease_after(
    rule: Rule,
    row: StoredRecord,
    *,
    written: InstanceStatus | None = None,
    owner: str | None = None,
    expires: int | None = None,
    reason: str | None = None,
) -> LeaseFields:
    """The lease columns of *row* once an operation under *rule* went ahead.

    Args:
        rule: its rule.
        row: the row before it.
        written: the status it writes (saves and marks).
        owner: the claimer (claims).
        expires: the new expiry on the lease clock (claims with an owner, renewals).
        reason: the cancel request (``cancel requested``).

    Returns:
        ``lease_owner``, ``lease_epoch``, ``lease_expires_at_ms`` and
        ``cancel_requested``.
    """
    effect = rule.lease
    kept = (
        effect in ("kept", "renewed", "cancel requested")
        or (effect == "kept if running" and written == "running")
        or (
            effect == "kept if running or recovery_required"
            and written in ("running", "recovery_required")
        )
    )
    fields: LeaseFields = {
        "lease_owner": row.lease_owner if kept else None,
        "lease_epoch": row.lease_epoch,
        "lease_expires_at_ms": row.lease_expires_at_ms if kept else None,
        "cancel_requested": row.cancel_requested if kept else None,
    }
    if effect == "claimed":
        fields["lease_owner"] = owner
        fields["lease_expires_at_ms"] = None if owner is None else expires
    if effect in ("claimed", "taken over"):
        fields["lease_epoch"] = row.lease_epoch + 1
    if effect == "renewed":
        fields["lease_expires_at_ms"] = expires
    if effect == "cancel requested":
        fields["cancel_requested"] = reason or ""
    return fields


def status_after(
    rule: Rule, row: StoredRecord, written: InstanceStatus | None = None
) -> InstanceStatus:
    """The status of *row* once an operation under *rule* (writing *written*) went
    ahead (a sweep's: see :func:`swept`).

    Args:
        rule: its rule.
        row: the row before it.
        written: the status it writes.

    Returns:
        The status.
    """
    if rule.status == "running":
        return "running"
    if rule.status == "written" and written is not None:
        return written
    return row.status


def swept(
    revision: int,
    takeovers: int,
    max_takeovers: int,
    saved: InstanceStatus | None,
    cancel_requested: str | None = None,
) -> tuple[InstanceStatus, str]:
    """The status (and detail) a sweep puts a row it takes over back at.

    Args:
        revision: the row's revision.
        takeovers: how often it was taken over since its last save.
        max_takeovers: the sweep's limit.
        saved: the status its revision was saved with (``None``: not logged).
        cancel_requested: the cancellation asked of its runtime, if any (its reason;
            ``""``: none given).

    Returns:
        ``cancelled`` for a row whose cancellation was asked (its runtime stopped
        before it cancelled: the request is not lost with it), ``failed`` for a row
        that never saved, ``recovery_required`` once *max_takeovers* takeovers in a
        row were reached, else the saved status (``halted`` if unknown, and for a
        revision a checkpoint saved ``running``: halted at its wait state, whose
        timers resume it); and why.
    """
    if cancel_requested is not None:
        return "cancelled", (
            f"cancelled ({cancel_requested or 'no reason given'}) by the recovery "
            f"sweep at revision {revision}: its runtime stopped before it cancelled "
            "(lease expired)"
        )
    if revision == 0:
        return "failed", (
            "the runtime that started it stopped before its first save "
            "(its lease expired)"
        )
    if takeovers + 1 >= max_takeovers:
        return "recovery_required", (
            f"its runtime stopped {takeovers + 1} times in a row while running it "
            "(lease expired)"
        )
    return "halted" if saved in (None, "running") else saved, (
        f"its runtime stopped while running it (lease expired); back at revision "
        f"{revision}"
    )
