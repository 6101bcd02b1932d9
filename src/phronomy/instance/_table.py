"""The instance protocol's rules, as a literal table (h11's ``_state.py`` style).

One instance key in one runtime goes through these states (``ABSENT`` and the two
ends are not kept in the registry)::

    absent ─Admit─▶ admitting ─Load─▶ loading ─Claim─▶ claimed ─Run─▶ executing
    admitting ─Run─▶ executing                              (an ephemeral segment)
    executing ─Persist─▶ persisting_terminal ─End─▶ released
    executing ─End─▶ released          (failed, cut off, cancelled, lease lost)
    executing | persisting_terminal ─Retire─▶ recovery_required ─Resolve─▶ released
    admitting | loading | claimed ─Refuse─▶ released        (a claim made is given back)
    loading ─Answer─▶ released ; loading | claimed ─Withdraw─▶ released
    absent ─AdmitCancel─▶ cancelling ⇄ remote_cancel ; cancelling ─CancelDone─▶ released
    any admitted state ─Shutdown─▶ closed        (loading: closed_loading)
    closed_loading ─Claim─▶ closed_loading ─Refuse─▶ closed
                                     (a load answered late: its claim is given back)

A pair missing from :data:`TRANSITIONS` is a bug in the driver: the protocol raises
:class:`~phronomy.errors.PhronomyInternalError` naming the instance, its state and the
event.
"""

from __future__ import annotations

from typing import Final

from ._events import (
    Admit,
    AdmitCancel,
    Answer,
    Buffer,
    Cancel,
    CancelAsked,
    CancelAwait,
    CancelDone,
    CancelReload,
    Claim,
    End,
    LeaseLost,
    Load,
    Persist,
    Refuse,
    Resolve,
    Retire,
    Run,
    Shutdown,
    Withdraw,
)

__all__ = [
    "ABSENT",
    "ADMITTED",
    "ADMITTING",
    "BUSY",
    "CANCELLING",
    "CLAIMED",
    "CLOSED",
    "CLOSED_LOADING",
    "EXECUTING",
    "LOADING",
    "PERSISTING",
    "RECOVERY_REQUIRED",
    "RELEASED",
    "REMOTE_CANCEL",
    "STATUS",
    "TRANSITIONS",
]

ABSENT: Final = "absent"
ADMITTING: Final = "admitting"
LOADING: Final = "loading"
CLAIMED: Final = "claimed"
EXECUTING: Final = "executing"
PERSISTING: Final = "persisting_terminal"
RECOVERY_REQUIRED: Final = "recovery_required"
CANCELLING: Final = "cancelling"
REMOTE_CANCEL: Final = "remote_cancel"
RELEASED: Final = "released"
CLOSED: Final = "closed"
CLOSED_LOADING: Final = "closed_loading"
"""Closed by the runtime's shutdown while its load was in flight: the load's answer
may still come, and a claim it made is given back."""

ADMITTED = frozenset(
    {
        ADMITTING,
        LOADING,
        CLAIMED,
        EXECUTING,
        PERSISTING,
        RECOVERY_REQUIRED,
        CANCELLING,
        REMOTE_CANCEL,
    }
)
"""States that hold the key's admission (kept in the registry)."""

BUSY = ADMITTED - {RECOVERY_REQUIRED}
"""States that keep the runtime busy (an instance waiting for an operator does not)."""

STATUS: Final = {
    ADMITTING: "admitting",
    LOADING: "admitting",
    CLAIMED: "admitting",
    CANCELLING: "admitting",
    REMOTE_CANCEL: "admitting",
    EXECUTING: "executing",
    PERSISTING: "persisting_terminal",
    RECOVERY_REQUIRED: "recovery_required",
}
"""The segment status each admitted state reports (``LiveSegment.status``)."""

# (state, event) -> next state. Read a row as: "in <state>, <event> moves to <next>".
TRANSITIONS: dict[tuple[str, type], str] = {
    # admission
    (ABSENT, Admit): ADMITTING,
    (ABSENT, AdmitCancel): CANCELLING,
    # a durable start or resume: load and claim, then run or give the claim back
    (ADMITTING, Load): LOADING,
    (LOADING, Claim): CLAIMED,
    (ADMITTING, Run): EXECUTING,
    (CLAIMED, Run): EXECUTING,
    (ADMITTING, Refuse): RELEASED,
    (LOADING, Refuse): RELEASED,
    (CLAIMED, Refuse): RELEASED,
    (LOADING, Answer): RELEASED,
    (LOADING, Withdraw): RELEASED,
    (CLAIMED, Withdraw): RELEASED,
    # the live segment and its terminal barrier
    (EXECUTING, Persist): PERSISTING,
    (EXECUTING, End): RELEASED,
    (PERSISTING, End): RELEASED,
    (EXECUTING, Retire): RECOVERY_REQUIRED,
    (PERSISTING, Retire): RECOVERY_REQUIRED,
    (EXECUTING, LeaseLost): EXECUTING,
    (PERSISTING, LeaseLost): PERSISTING,  # its save is fenced: the store decides
    (RECOVERY_REQUIRED, LeaseLost): RECOVERY_REQUIRED,  # late: nothing runs
    (RELEASED, LeaseLost): RELEASED,  # late: the segment ended
    (CLOSED, LeaseLost): CLOSED,
    # cancels of this runtime: the live segment at once, else once it is done
    (ADMITTING, Cancel): ADMITTING,
    (LOADING, Cancel): LOADING,
    (CLAIMED, Cancel): CLAIMED,
    (EXECUTING, Cancel): EXECUTING,
    (PERSISTING, Cancel): PERSISTING,
    (CANCELLING, Cancel): CANCELLING,
    (REMOTE_CANCEL, Cancel): REMOTE_CANCEL,
    (RECOVERY_REQUIRED, Cancel): RECOVERY_REQUIRED,  # refused: resolve it first
    # a cancel asked by another runtime, through the row
    (EXECUTING, CancelAsked): EXECUTING,
    (PERSISTING, CancelAsked): PERSISTING,
    (RECOVERY_REQUIRED, CancelAsked): RECOVERY_REQUIRED,  # late
    (RELEASED, CancelAsked): RELEASED,  # late
    (CLOSED, CancelAsked): CLOSED,
    # cancelling an instance no segment runs here: its row
    (CANCELLING, CancelAwait): REMOTE_CANCEL,
    (REMOTE_CANCEL, CancelReload): CANCELLING,
    (CLOSED, CancelReload): CLOSED,  # the runtime shut down while it waited
    (CANCELLING, CancelDone): RELEASED,
    # an operator's resolution (a no-op unless the instance requires recovery)
    (RECOVERY_REQUIRED, Resolve): RELEASED,
    (ADMITTING, Resolve): ADMITTING,
    (LOADING, Resolve): LOADING,
    (CLAIMED, Resolve): CLAIMED,
    (EXECUTING, Resolve): EXECUTING,
    (PERSISTING, Resolve): PERSISTING,
    (CANCELLING, Resolve): CANCELLING,
    (REMOTE_CANCEL, Resolve): REMOTE_CANCEL,
    # entries stored while the segment is not running: it takes them when it runs
    (ADMITTING, Buffer): ADMITTING,
    (LOADING, Buffer): LOADING,
    (CLAIMED, Buffer): CLAIMED,
    (EXECUTING, Buffer): EXECUTING,
    (PERSISTING, Buffer): PERSISTING,
    (RECOVERY_REQUIRED, Buffer): RECOVERY_REQUIRED,
    (CANCELLING, Buffer): CANCELLING,
    (REMOTE_CANCEL, Buffer): REMOTE_CANCEL,
    # the runtime's end: every admission closes; a session cut off still ends
    (ADMITTING, Shutdown): CLOSED,
    (LOADING, Shutdown): CLOSED_LOADING,
    (CLAIMED, Shutdown): CLOSED,
    (EXECUTING, Shutdown): CLOSED,
    (PERSISTING, Shutdown): CLOSED,
    (RECOVERY_REQUIRED, Shutdown): CLOSED,
    (CANCELLING, Shutdown): CLOSED,
    (REMOTE_CANCEL, Shutdown): CLOSED,
    (CLOSED, End): CLOSED,
    (CLOSED, Retire): CLOSED,
    # a load answered once the runtime shut down: the claim it made is given back
    (CLOSED_LOADING, Claim): CLOSED_LOADING,
    (CLOSED_LOADING, Refuse): CLOSED,
}
"""The whole lifecycle of one instance in one runtime."""
