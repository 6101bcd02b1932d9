"""Workflow state: frozen msgspec Structs with reducers declared by ``Annotated`` markers.

Example::

    class Order(phronomy.State):
        item: str = ""
        log: Annotated[list[str], phronomy.APPEND] = []
        meta: Annotated[dict[str, str], phronomy.MERGE] = {}

    order = Order(item="lamp").merge(log=["drafted"])   # a new state

States are values. Their fields cannot be reassigned; nested lists and dicts are
copied by :meth:`State.merge` so a new state never shares them with the old one. Treat
them as read-only.
"""

from __future__ import annotations

import inspect
import threading
from typing import (
    TYPE_CHECKING,
    Any,
    ClassVar,
    Literal,
    Self,
    TypeVar,
    dataclass_transform,
    final,
)

import msgspec
from msgspec import StructMeta

from phronomy.errors import DefinitionError, InvalidInputError

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "APPEND",
    "MERGE",
    "REPLACE",
    "RESERVED_FIELDS",
    "Reducer",
    "State",
    "StateSpec",
    "build_state",
    "copy_value",
    "state_spec",
    "validate_fields",
]

S = TypeVar("S", bound="State")

RESERVED_FIELDS = frozenset({"workflow_instance_id"})
"""Field names a state may not declare: workflow metadata lives on results, not states."""


@final
class Reducer(msgspec.Struct, frozen=True, kw_only=True):
    """How :meth:`State.merge` combines an update with the current value."""

    kind: Literal["replace", "append", "merge"]


REPLACE = Reducer(kind="replace")
"""The default reducer: the update replaces the value."""
APPEND = Reducer(kind="append")
"""List concatenation: ``merge(log=["b"])`` turns ``["a"]`` into ``["a", "b"]``."""
MERGE = Reducer(kind="merge")
"""Dict merge, the update wins per key: ``{"x": 1} + {"x": 2, "y": 3}``."""


@final
class StateSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What phronomy knows about a state class (computed once per class).

    Attributes:
        fields: field names in declaration order.
        reducers: field name → reducer kind.
        types: field name → the field's type (for validating updates).
        field_set: the field names, as a set.
        required: the fields without a default.
    """

    fields: tuple[str, ...]
    reducers: dict[str, Literal["replace", "append", "merge"]]
    types: dict[str, Any]
    field_set: frozenset[str] = frozenset()
    required: frozenset[str] = frozenset()


_specs: dict[type[Any], StateSpec] = {}
_specs_lock = threading.Lock()


class _StateMeta(StructMeta):
    """Makes every subclass frozen and keyword-only unless it says otherwise.

    msgspec does not inherit ``kw_only`` (and type checkers want ``frozen`` repeated):
    this metaclass and the ``dataclass_transform`` below make ``class Order(State):``
    enough at runtime and for mypy.
    """

    def __new__(
        mcls,
        name: str,
        bases: tuple[type, ...],
        namespace: dict[str, Any],
        **kwargs: Any,
    ) -> Any:
        kwargs.setdefault("frozen", True)
        kwargs.setdefault("kw_only", True)
        return super().__new__(mcls, name, bases, namespace, **kwargs)


@dataclass_transform(frozen_default=True, kw_only_default=True)
class State(msgspec.Struct, metaclass=_StateMeta, frozen=True, kw_only=True):
    """Base class of workflow states (a frozen, keyword-only msgspec Struct).

    ``class Order(phronomy.State): ...`` is enough: subclasses are frozen and
    keyword-only by default, at runtime and for type checkers.

    A state may define ``handle_event(self, event)``: it is called for every external
    event before transitions are considered and may return :data:`CONSUME` (drop the
    event), a new state (adopt it), a truthy value (handled: drop the event if no
    transition exists from the current state) or a falsy value (not handled).
    """

    __phronomy_state__: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Reject reserved field names when the class is defined."""
        super().__init_subclass__(**kwargs)
        own = inspect.get_annotations(cls)
        reserved = sorted(RESERVED_FIELDS.intersection(own))
        if reserved:
            raise DefinitionError(
                f"{cls.__name__} declares reserved field(s) {reserved}: workflow_instance_id "
                "is framework metadata (read it from the WorkflowResult)"
            )

    def merge(self, **updates: Any) -> Self:
        """Return a new state with *updates* applied through each field's reducer.

        Args:
            **updates: field values; each is validated against the field's type.

        Returns:
            A new state; this one is unchanged.

        Raises:
            InvalidInputError: an unknown field, or a value of the wrong type (the
                message names the field).
        """
        cls = type(self)
        spec = _known_fields(cls, updates)
        values: dict[str, Any] = {}
        for name in spec.fields:
            current = getattr(self, name)
            if name not in updates:
                if not isinstance(current, _IMMUTABLE):  # immutable values are shared
                    values[name] = _copied(cls, name, current)
                continue
            update = updates[name]
            kind = type(update)
            if kind is spec.types[name] and kind in _PLAIN:  # already what it must be
                values[name] = update  # (a reducer or a constraint annotates the type)
                continue
            match spec.reducers[name]:
                case "append":
                    if update is None:
                        update = []
                    elif not isinstance(update, (list, tuple)):
                        update = [update]
                    combined: Any = [*_copied(type(self), name, current or []), *update]
                case "merge":
                    if not isinstance(update, dict):
                        raise InvalidInputError(
                            f"{type(self).__name__}.{name} merges dicts; got {type(update).__name__}"
                        )
                    combined = {**_copied(type(self), name, current or {}), **update}
                case _:
                    combined = update
            values[name] = _validated(type(self), name, spec.types[name], combined)
        return msgspec.structs.replace(self, **values)


def state_spec(cls: Any) -> StateSpec:
    """Return (and cache) the :class:`StateSpec` of a state class.

    Raises:
        DefinitionError: *cls* is not a :class:`State` subclass, or a reducer is applied
            to a field of the wrong kind.
    """
    spec = _specs.get(cls)
    if spec is not None:
        return spec
    if not (isinstance(cls, type) and issubclass(cls, State)):
        raise DefinitionError(f"{cls!r} is not a phronomy.State subclass")
    reducers: dict[str, Literal["replace", "append", "merge"]] = {}
    types: dict[str, Any] = {}
    names: list[str] = []
    required: set[str] = set()
    for field in msgspec.structs.fields(cls):
        names.append(field.name)
        if field.required:
            required.add(field.name)
        types[field.name] = field.type
        markers = [
            m for m in getattr(field.type, "__metadata__", ()) if isinstance(m, Reducer)
        ]
        if len(markers) > 1:
            raise DefinitionError(
                f"{cls.__name__}.{field.name} has more than one reducer"
            )
        reducers[field.name] = markers[0].kind if markers else "replace"
    spec = StateSpec(
        fields=tuple(names),
        reducers=reducers,
        types=types,
        field_set=frozenset(names),
        required=frozenset(required),
    )
    with _specs_lock:
        _specs[cls] = spec
    return spec


def validate_fields(cls: type[State], values: Mapping[str, Any]) -> dict[str, Any]:
    """Validate a mapping of field values against *cls* (unknown keys, types).

    Returns:
        The converted values (new objects: the caller's lists and dicts are not shared).

    Raises:
        InvalidInputError: unknown keys, or values that do not fit (the message names
            the field).
    """
    spec = _known_fields(cls, values)
    return {
        name: _validated(cls, name, spec.types[name], value)
        for name, value in values.items()
    }


def build_state(cls: type[S], fields: Mapping[str, Any], base: S | None = None) -> S:
    """Build a state from validated *fields*, over *base* (replace semantics) or defaults.

    Raises:
        InvalidInputError: a required field is missing.
    """
    if base is not None:
        return msgspec.structs.replace(base, **fields) if fields else base
    try:
        return cls(**fields)
    except TypeError as exc:
        raise InvalidInputError(f"cannot build {cls.__name__}: {exc}") from exc


def _known_fields(cls: type[State], values: Mapping[str, Any]) -> StateSpec:
    """The spec of *cls*, once every key of *values* is known to be one of its fields."""
    spec = _specs.get(cls) or state_spec(cls)  # (the lookup inline: once per merge)
    if values.keys() <= spec.field_set:
        return spec
    unknown = sorted(set(values) - spec.field_set)
    if unknown:
        raise InvalidInputError(
            f"Unknown {cls.__name__} field(s): {unknown} (fields: {list(spec.fields)})"
        )
    return spec


def _validated(cls: type[Any], name: str, field_type: Any, value: Any) -> Any:
    try:
        return msgspec.convert(value, field_type)
    except msgspec.ValidationError as exc:
        raise InvalidInputError(
            f"invalid value for {cls.__name__}.{name}: {exc}"
        ) from exc


def _copied(cls: type[Any], name: str, value: Any) -> Any:
    try:
        return copy_value(value)
    except RecursionError:
        raise InvalidInputError(
            f"{cls.__name__}.{name} is nested too deeply to be copied (and would be "
            "too deep to store)"
        ) from None


_IMMUTABLE = (str, int, float, bool, bytes, type(None), frozenset)
_PLAIN = frozenset({str, int, float, bool})
"""Types whose values a field of exactly that (unconstrained) type takes as they are."""


def copy_value(value: Any) -> Any:
    """Copy lists, dicts, sets and bytearrays recursively; share everything else.

    Immutable values (and frozen structs) are shared, as are objects phronomy does not
    know how to copy: states are values, so treat nested objects as read-only.
    """
    if isinstance(value, _IMMUTABLE):
        return value
    if isinstance(value, list):
        return [copy_value(item) for item in value]
    if isinstance(value, dict):
        return {key: copy_value(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return tuple(copy_value(item) for item in value)
    if isinstance(value, set):
        return {copy_value(item) for item in value}
    if isinstance(value, bytearray):
        return bytearray(value)
    return value
