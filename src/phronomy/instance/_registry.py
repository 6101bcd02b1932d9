"""The instances of one runtime: at most one admission per key (pure).

:class:`Instances` keeps the :class:`~phronomy.instance.Instance` objects that hold an
admission, counts the busy ones and finds one by its session's id. It is the only way
the driver changes an instance, so the registry and the instances cannot disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar, final

from phronomy.errors import BusyError, InvalidInputError

from ._events import Admit, AdmitCancel, Shutdown
from ._instance import Instance
from ._table import ADMITTED, BUSY, CLOSED, RECOVERY_REQUIRED

if TYPE_CHECKING:
    from ._events import InstanceEvent
    from ._outputs import InstanceOutput

__all__ = ["Instances", "Sessions"]

C = TypeVar("C")
S = TypeVar("S")
O = TypeVar("O")  # noqa: E741 - the store operation type
E = TypeVar("E")
Q = TypeVar("Q")
S_co = TypeVar("S_co", covariant=True)


class _Live(Protocol[S_co]):
    @property
    def session(self) -> S_co | None: ...


@final
class Instances(Generic[C, S, O, E, Q]):
    """Every admitted instance of one runtime (used on its dispatcher only)."""

    __slots__ = ("_busy", "_busy_error", "_by_holder", "_noun", "_records", "sessions")

    def __init__(
        self, *, noun: str, busy_error: Callable[[Instance[C, S, O, E, Q]], BusyError]
    ) -> None:
        """An empty registry; *noun* names a key in errors, *busy_error* is the
        refusal of a key that is admitted already."""
        self._noun = noun
        self._busy_error = busy_error
        self._records: dict[str, Instance[C, S, O, E, Q]] = {}
        self._by_holder: dict[str, str] = {}
        self._busy = 0
        self.sessions: Sessions[S] = Sessions(self._records)
        """The live sessions by key (a read-only view)."""

    # --- reads ----------------------------------------------------------------------

    def __len__(self) -> int:
        """Keys with an admission."""
        return len(self._records)

    def __iter__(self) -> Iterator[Instance[C, S, O, E, Q]]:
        """Every admitted instance (a snapshot)."""
        return iter(list(self._records.values()))

    def __contains__(self, key: object) -> bool:
        """Whether *key* has an admission in any state."""
        return key in self._records

    def get(self, key: str) -> Instance[C, S, O, E, Q] | None:
        """The admitted instance of *key*, or ``None``."""
        return self._records.get(key)

    def held_by(self, holder: str) -> Instance[C, S, O, E, Q] | None:
        """The instance whose live session is *holder*, or ``None``."""
        key = self._by_holder.get(holder)
        return None if key is None else self._records.get(key)

    def in_state(self, state: str) -> list[Instance[C, S, O, E, Q]]:
        """Admitted instances in *state*, in admission order."""
        return [r for r in self._records.values() if r.state == state]

    def recovery_required(self) -> list[Instance[C, S, O, E, Q]]:
        """Instances waiting for an operator."""
        return self.in_state(RECOVERY_REQUIRED)

    @property
    def busy(self) -> int:
        """How many admissions are busy (loading, running, saving, cancelling)."""
        return self._busy

    # --- changes --------------------------------------------------------------------

    def admit(
        self, key: str, event: Admit[C] | AdmitCancel[C]
    ) -> tuple[Instance[C, S, O, E, Q], list[InstanceOutput[S, E, C, O, Q]]]:
        """Admit *key* (a new :class:`Instance`).

        Raises:
            InvalidInputError: an empty key or no owner token.
            BusyError: the key is admitted already (recovery included).
        """
        if not key:
            raise InvalidInputError(f"the {self._noun} id must not be empty")
        if event.owner is None:
            raise InvalidInputError("an owner token is required")
        current = self._records.get(key)
        if current is not None:
            raise self._busy_error(current)
        instance: Instance[C, S, O, E, Q] = Instance(key)
        self._records[key] = instance
        return instance, self.handle(instance, event)

    def handle(
        self, instance: Instance[C, S, O, E, Q], event: InstanceEvent[C, S, O, Q, E]
    ) -> list[InstanceOutput[S, E, C, O, Q]]:
        """Apply *event* to *instance* (see :meth:`Instance.handle`), keeping the
        registry in step: a released instance leaves it.

        Raises:
            PhronomyInternalError: the table allows no such event in this state.
        """
        registered = self._records.get(instance.key) is instance
        before, holder = instance.state, instance.holder
        outputs = instance.handle(event)
        if not registered:
            return outputs  # released, or the runtime shut down: nothing to keep
        self._busy += (instance.state in BUSY) - (before in BUSY)
        if holder is not None and holder != instance.holder:
            self._by_holder.pop(holder, None)
        if instance.holder is not None:
            self._by_holder[instance.holder] = instance.key
        if instance.state not in ADMITTED:
            self._forget(instance)
        return outputs

    def shutdown(
        self, error: BaseException | None
    ) -> list[tuple[Instance[C, S, O, E, Q], list[InstanceOutput[S, E, C, O, Q]]]]:
        """Close every admission (``closed``); return each instance with what the
        driver carries out for it."""
        closed = [(i, i.handle(Shutdown(error=error))) for i in self._records.values()]
        self._records.clear()
        self._by_holder.clear()
        self._busy = 0
        return closed

    def _forget(self, instance: Instance[C, S, O, E, Q]) -> None:
        del self._records[instance.key]
        if instance.holder is not None:
            self._by_holder.pop(instance.holder, None)
        assert instance.state not in ADMITTED or instance.state == CLOSED


@final
class Sessions(Mapping[str, S]):
    """The live sessions of a registry by key (a read-only view)."""

    __slots__ = ("_records",)

    def __init__(self, records: Mapping[str, _Live[S]]) -> None:
        """A view of *records*."""
        self._records = records

    def __getitem__(self, key: str) -> S:
        """The live session of *key*.

        Raises:
            KeyError: no session of *key* runs.
        """
        record = self._records.get(key)
        if record is None or record.session is None:
            raise KeyError(key)
        return record.session

    def __iter__(self) -> Iterator[str]:
        """Keys with a live session."""
        return iter([k for k, r in self._records.items() if r.session is not None])

    def __len__(self) -> int:
        """How many sessions are live."""
        return sum(r.session is not None for r in self._records.values())
