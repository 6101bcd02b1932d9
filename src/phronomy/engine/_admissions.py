"""The admission table: at most one live holder per key, with owner tokens (pure).

Workflows key it by ``workflow_instance_id`` (the holder is a session), supervised
executions by agent id (the holder is an execution). The table is plain data: it
imports no trio, never checks which task calls it, and raises only for what the caller
asked wrongly. Its owner (a feature's coordinator, on the dispatcher) adds the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, final

import msgspec

from phronomy.errors import (
    BackpressureError,
    BusyError,
    InvalidInputError,
    PhronomyInternalError,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

__all__ = ["Admission", "AdmissionTable"]

ADMITTING = "admitting"
EXECUTING = "executing"
RECOVERY_REQUIRED = "recovery_required"


@final
class Admission(msgspec.Struct, frozen=True, kw_only=True):
    """One key's admission (replaced, never mutated).

    Attributes:
        key: the identity admitted (an instance id, an agent id).
        owner: the opaque owner token, compared with ``is`` (never persisted).
        state: where the holder is (``admitting``, ``executing``, ...,
            ``recovery_required``).
        holder: the bound session or execution id, once bound.
        label: what the key runs (the workflow's name), for reports.
        caller: the caller's handle, kept for recovery resolution.
        error: why the admission requires recovery.
    """

    key: str
    owner: object
    state: str
    holder: str | None = None
    label: str = ""
    caller: Any = None
    error: BaseException | None = None


@final
class AdmissionTable:
    """Keys, their owner tokens and states; busy states counted for idleness.

    Per key::

        (absent) --admit(owner)--> admitting --bind(owner, holder)--> executing
        bound --mark(state, by owner or holder)--> any markable state
        any --retire(holder)--> recovery_required --resolve--> (absent)
        any --release(by owner or holder)--> (absent)

    A stale or competing owner can never bind, mark or release the current holder.
    """

    __slots__ = (
        "_busy",
        "_busy_error",
        "_by_holder",
        "_capacity",
        "_markable",
        "_noun",
        "_records",
        "busy_states",
    )

    def __init__(
        self,
        *,
        noun: str,
        busy_states: frozenset[str],
        markable: frozenset[str],
        busy_error: Callable[[Admission], BusyError],
        capacity: int | None = None,
    ) -> None:
        """Create an empty table.

        Args:
            noun: how messages name a key (``"workflow instance"``, ``"agent"``).
            busy_states: states that keep the runtime busy (counted).
            markable: states :meth:`mark` accepts.
            busy_error: the error for admitting a key that has an admission.
            capacity: at most this many busy admissions (``None``: unbounded).
        """
        self._noun = noun
        self.busy_states = busy_states
        self._markable = markable
        self._busy_error = busy_error
        self._capacity = capacity
        self._records: dict[str, Admission] = {}
        self._by_holder: dict[str, str] = {}
        self._busy = 0

    # --- reads --------------------------------------------------------------------------

    def __len__(self) -> int:
        """Keys with an admission."""
        return len(self._records)

    def __iter__(self) -> Iterator[Admission]:
        """Every admission (a snapshot)."""
        return iter(list(self._records.values()))

    def __contains__(self, key: object) -> bool:
        """Whether *key* has an admission in any state."""
        return key in self._records

    def get(self, key: str) -> Admission | None:
        """The admission of *key*, or ``None``."""
        return self._records.get(key)

    def state(self, key: str) -> str | None:
        """The admission state of *key*, or ``None``."""
        record = self._records.get(key)
        return None if record is None else record.state

    def held_by(self, holder: str) -> Admission | None:
        """The admission bound to *holder*, or ``None``."""
        key = self._by_holder.get(holder)
        return None if key is None else self._records.get(key)

    def in_state(self, state: str) -> list[Admission]:
        """Admissions in *state*, in admission order."""
        return [r for r in self._records.values() if r.state == state]

    @property
    def busy(self) -> int:
        """How many admissions are in a busy state."""
        return self._busy

    # --- changes ------------------------------------------------------------------------

    def admit(self, key: str, owner: object, *, label: str = "") -> Admission:
        """Admit *key* for *owner* (state ``admitting``).

        Raises:
            InvalidInputError: an empty key or no owner token.
            BusyError: the key has an admission in any state (recovery included).
            BackpressureError: *capacity* admissions are already busy.
        """
        if not key:
            raise InvalidInputError(f"the {self._noun} id must not be empty")
        if owner is None:
            raise InvalidInputError("an owner token is required")
        current = self._records.get(key)
        if current is not None:
            raise self._busy_error(current)
        if self._capacity is not None and self._busy >= self._capacity:
            raise BackpressureError(
                f"{self._busy} {self._noun}s are starting or running, the capacity "
                f"of this runtime; {self._noun} {key!r} was not started, start it "
                "again later"
            )
        return self._put(Admission(key=key, owner=owner, state=ADMITTING, label=label))

    def bind(
        self, key: str, owner: object, holder: str, *, caller: Any = None
    ) -> Admission:
        """Bind the admission to *holder* (state ``executing``).

        Raises:
            InvalidInputError: an empty holder id.
            PhronomyInternalError: no admission, another owner, or already bound.
        """
        if not holder:
            raise InvalidInputError("the holder id must not be empty")
        record = self._expect(key, owner=owner, holder=None, what="bind")
        if record.holder is not None:
            raise self._stale(key, "bind")
        self._by_holder[holder] = key
        return self._put(
            msgspec.structs.replace(
                record, holder=holder, state=EXECUTING, caller=caller
            )
        )

    def mark(
        self,
        key: str,
        state: str,
        *,
        owner: object | None = None,
        holder: str | None = None,
    ) -> Admission:
        """Move the admission of *key* to *state*, on the authority of *owner* or
        *holder* (exactly one).

        Raises:
            ValueError: *state* cannot be marked.
            PhronomyInternalError: no admission, or the authority does not match.
        """
        if state not in self._markable:
            raise ValueError(f"unsupported {self._noun} admission state: {state!r}")
        record = self._expect(key, owner=owner, holder=holder, what="update")
        return self._put(msgspec.structs.replace(record, state=state))

    def release(
        self, key: str, *, owner: object | None = None, holder: str | None = None
    ) -> bool:
        """Remove the admission if *owner* (or *holder*) holds it; ``False`` otherwise."""
        record = self._records.get(key)
        if record is None or not _authorised(record, owner, holder):
            return False
        self._remove(record)
        return True

    def retire(self, holder: str, error: BaseException | None) -> Admission | None:
        """The holder's outcome is unknown: its admission requires recovery.

        Returns:
            The new admission, or ``None`` when *holder* holds none.
        """
        key = self._by_holder.pop(holder, None)
        record = self._records.get(key) if key is not None else None
        if record is None:
            return None
        return self._put(
            msgspec.structs.replace(
                record, state=RECOVERY_REQUIRED, holder=None, error=error
            )
        )

    def resolve(self, key: str) -> Admission | None:
        """Remove a recovery-required admission (an operator resolved it); return it."""
        record = self._records.get(key)
        if record is None or record.state != RECOVERY_REQUIRED:
            return None
        self._remove(record)
        return record

    def clear(self) -> list[Admission]:
        """Remove every admission; return what was there."""
        records = list(self._records.values())
        self._records.clear()
        self._by_holder.clear()
        self._busy = 0
        return records

    # --- internals --------------------------------------------------------------------------

    def _expect(
        self, key: str, *, owner: object | None, holder: str | None, what: str
    ) -> Admission:
        record = self._records.get(key)
        if record is None:
            raise PhronomyInternalError(
                f"{self._noun} {key!r} has no admission in this runtime ({what})"
            )
        if not _authorised(record, owner, holder):
            raise self._stale(key, what)
        return record

    def _stale(self, key: str, what: str) -> PhronomyInternalError:
        return PhronomyInternalError(f"stale {self._noun} admission {what} for {key!r}")

    def _put(self, record: Admission) -> Admission:
        previous = self._records.get(record.key)
        if previous is not None and previous.state in self.busy_states:
            self._busy -= 1
        self._records[record.key] = record
        if record.state in self.busy_states:
            self._busy += 1
        return record

    def _remove(self, record: Admission) -> None:
        del self._records[record.key]
        if record.state in self.busy_states:
            self._busy -= 1
        if record.holder is not None:
            self._by_holder.pop(record.holder, None)


def _authorised(record: Admission, owner: object | None, holder: str | None) -> bool:
    if owner is not None:
        return record.owner is owner
    return holder is not None and record.holder == holder
