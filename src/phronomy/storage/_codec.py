"""The snapshot codec: msgspec JSON with a type tag and a format version.

A stored snapshot is one JSON object::

    {"type": "phronomy.workflow_state", "format": 1,
     "workflow_instance_id": "order-1", "revision": 2, "workflow": "orders",
     "phase": "awaiting_approval", "fields": {...}}

Format 1 is the format of this release; every later release must still decode it
(``tests/fixtures/snapshots`` holds committed blobs). Values outside the JSON domain
(arbitrary objects, NaN, infinities), values whose type a round trip would change
(``bytes`` or a tuple under ``Any``, int keys) and values nested too deeply are refused
with a :class:`~phronomy.SerializationError` naming the field path, before anything is written.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import math
import sys
import threading
import uuid
from typing import Any, Generic, TypeVar, cast, final

import msgspec

from phronomy.errors import CorruptRecordError, SerializationError

__all__ = [
    "DEFAULT_MAX_SNAPSHOT_BYTES",
    "FINISH_PHASE",
    "RECORD_TYPE",
    "SNAPSHOT_FORMAT",
    "DecodedSnapshot",
    "check_json_domain",
    "decode_snapshot",
    "decode_snapshot_builtins",
    "encode_snapshot",
    "normalize",
]

RECORD_TYPE = "phronomy.workflow_state"
FINISH_PHASE = "__end__"
"""The stored phase of a finished instance."""
SNAPSHOT_FORMAT = 1
DEFAULT_MAX_SNAPSHOT_BYTES = 4 * 1024 * 1024

T = TypeVar("T")

_LEAVES = (
    str,
    int,
    bool,
    type(None),
    datetime.datetime,
    datetime.date,
    datetime.time,
    datetime.timedelta,
    uuid.UUID,
    decimal.Decimal,
    enum.Enum,
    bytes,
    bytearray,
)


class _Header(msgspec.Struct, frozen=True, kw_only=True):
    type: str
    format: int
    workflow_instance_id: str
    revision: int


class _Envelope(
    msgspec.Struct, Generic[T], frozen=True, kw_only=True, omit_defaults=True
):
    type: str
    format: int
    workflow_instance_id: str
    revision: int
    workflow: str
    phase: str | None
    fields: T
    trace: str | None = None  # the saving segment's W3C traceparent (telemetry)


@final
class DecodedSnapshot(msgspec.Struct, Generic[T], frozen=True, kw_only=True):
    """A decoded snapshot.

    Attributes:
        fields: the state (typed) or a ``dict`` (builtins decode).
        phase: the phase the snapshot was taken at.
        workflow: the workflow name recorded with it.
        trace: the W3C ``traceparent`` of the segment that saved it (with
            OpenTelemetry on; ``None`` otherwise and in older snapshots).
    """

    fields: T
    phase: str | None
    workflow: str
    trace: str | None = None


_ENCODER = msgspec.json.Encoder()
_HEADER_DECODER = msgspec.json.Decoder(_Header)
_BUILTINS_DECODER = msgspec.json.Decoder(_Envelope[dict[str, Any]])
_typed_decoders: dict[type[Any], msgspec.json.Decoder[Any]] = {}
_decoders_lock = threading.Lock()


def check_json_domain(value: Any, path: str = "$") -> None:
    """Raise :class:`~phronomy.SerializationError` naming the first value JSON cannot hold.

    Walks *value* without recursion (any depth), depth-first in declaration order.

    Args:
        value: a state or any nested value.
        path: the path of *value* used in the message.

    Raises:
        SerializationError: an unsupported object, a non-finite float, or a mapping
            key that is not text, a number or an enum.
    """
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        value, path = stack.pop()
        children: list[tuple[Any, str]]
        if isinstance(value, _LEAVES):
            continue
        if isinstance(value, float):
            if not math.isfinite(value):
                raise SerializationError(
                    f"{path} is {value!r}, which JSON cannot represent"
                )
            continue
        if isinstance(value, msgspec.Struct):
            children = [
                (getattr(value, name), f"{path}.{name}")
                for name in value.__struct_fields__
            ]
        elif isinstance(value, (list, tuple, set, frozenset)):
            children = [(item, f"{path}[{i}]") for i, item in enumerate(value)]
        elif isinstance(value, dict):
            children = []
            for key, item in value.items():
                if not isinstance(key, (str, int, enum.Enum)) or isinstance(key, bool):
                    raise SerializationError(
                        f"{path} has a key of type {type(key).__name__} ({key!r}); "
                        "keys must be text"
                    )
                children.append((item, f"{path}[{key!r}]"))
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            children = [
                (getattr(value, f.name), f"{path}.{f.name}")
                for f in dataclasses.fields(value)
            ]
        else:
            raise SerializationError(
                f"{path} holds a {type(value).__module__}.{type(value).__qualname__}, "
                "which is outside the JSON domain and cannot be stored"
            )
        stack.extend(reversed(children))


def encode_snapshot(
    fields: Any,
    *,
    workflow_instance_id: str,
    revision: int,
    phase: str | None,
    workflow: str = "",
    max_bytes: int = DEFAULT_MAX_SNAPSHOT_BYTES,
    trace: str | None = None,
) -> bytes:
    """Encode a snapshot for storage, refusing values a durable round trip would change.

    The blob is decoded again with the state's own type and compared with *fields*:
    a value whose type does not survive (``bytes``, a tuple, a set or int keys held
    by an ``Any`` field come back as text, lists and text keys) is refused, so what
    a later segment loads is always what was saved. Declared field types (``bytes``,
    ``set[int]``, ``tuple[int, ...]``, datetimes, enums, nested Structs) survive.

    Args:
        fields: the state (a msgspec Struct) or a mapping of field values.
        workflow_instance_id: the instance the snapshot belongs to.
        revision: the revision the snapshot will have once saved.
        phase: the wait state's name, or ``"__end__"``.
        workflow: the workflow name.
        max_bytes: the size limit.
        trace: the saving segment's W3C ``traceparent`` (OpenTelemetry), stored
            beside the fields (omitted when ``None``: the blob is then as before).

    Returns:
        The encoded snapshot.

    Raises:
        SerializationError: a value outside the JSON domain, one whose type would
            change, or nesting deeper than the interpreter can encode (the message
            names the instance, the revision and the field path).
        SerializationError: the encoded snapshot exceeds *max_bytes*.
    """
    envelope = _Envelope(
        type=RECORD_TYPE,
        format=SNAPSHOT_FORMAT,
        workflow_instance_id=workflow_instance_id,
        revision=revision,
        workflow=workflow,
        phase=phase,
        fields=fields,
        trace=trace,
    )
    try:
        blob = _ENCODER.encode(envelope)
    except RecursionError:
        raise _too_deep(_where(workflow_instance_id, revision)) from None
    except (TypeError, ValueError, OverflowError) as exc:
        check_json_domain(fields, "$.fields")  # names the offending value
        raise SerializationError(
            f"the snapshot of {_where(workflow_instance_id, revision)} cannot be "
            f"encoded: {exc}"
        ) from exc
    if len(blob) > max_bytes:
        raise SerializationError(
            f"snapshot of workflow instance {workflow_instance_id!r} is {len(blob)} bytes; "
            f"the limit is {max_bytes} bytes (max_snapshot_bytes)"
        )
    if not _survives(fields):
        _check_round_trip(blob, fields, _where(workflow_instance_id, revision))
    return blob


def _where(workflow_instance_id: str, revision: int) -> str:
    """How an error names the snapshot (made only for an error, or a check)."""
    return f"workflow instance {workflow_instance_id!r} revision {revision}"


_PLAIN = frozenset({str, int, bool})
_INT64, _UINT64 = -(2**63), 2**64
_plain_fields: dict[type[Any], tuple[tuple[str, type[Any]], ...] | None] = {}
"""By state type: its fields and their types when every one is plain, else ``None``."""


def _survives(fields: Any) -> bool:
    """Whether *fields* is a Struct whose every field is declared ``str``, ``int`` or
    ``bool`` and holds a value of exactly that type (a round trip cannot change such
    values: the check by decoding again is skipped)."""
    cls = type(fields)
    try:
        layout = _plain_fields[cls]
    except KeyError:
        layout = _plain_fields[cls] = _plain_layout(fields)  # a race: the same twice
    if layout is None:
        return False
    for name, kind in layout:
        value = getattr(fields, name)
        if type(value) is not kind or (kind is int and not _INT64 <= value < _UINT64):
            return False
    return True


def _plain_layout(fields: Any) -> tuple[tuple[str, type[Any]], ...] | None:
    if not isinstance(fields, msgspec.Struct):
        return None
    declared = tuple((f.name, f.type) for f in msgspec.structs.fields(type(fields)))
    return declared if all(kind in _PLAIN for _, kind in declared) else None


def _too_deep(where: str) -> SerializationError:
    return SerializationError(
        f"the snapshot of {where} is nested too deeply to be stored (deeper than this "
        f"interpreter can encode and decode; the recursion limit is "
        f"{sys.getrecursionlimit()})"
    )


def _check_round_trip(blob: bytes, fields: Any, where: str) -> None:
    """Raise unless *blob* decodes back to a value equal to *fields*."""
    typed = isinstance(fields, msgspec.Struct)
    decoder = _typed_decoder(type(fields)) if typed else _BUILTINS_DECODER
    original = fields if typed else dict(fields)
    try:
        back = decoder.decode(blob).fields
        if back == original:
            return
    except RecursionError:
        raise _too_deep(where) from None
    except msgspec.ValidationError as exc:
        # a declared type refused what was stored (for example NaN, stored as null)
        check_json_domain(fields, "$.fields")
        raise SerializationError(
            f"the snapshot of {where} would not load again: {exc}"
        ) from exc
    path, detail = _first_difference(original, back)
    raise SerializationError(f"{path} {detail} (snapshot of {where})")


def _type_name(value: Any) -> str:
    return type(value).__qualname__


def _first_difference(original: Any, back: Any) -> tuple[str, str]:
    """Where and how a decoded value differs from the original (no recursion)."""
    stack: list[tuple[Any, Any, str]] = [(original, back, "$.fields")]
    while stack:
        a, b, path = stack.pop()
        if isinstance(a, float) and not math.isfinite(a):
            return path, f"is {a!r}, which JSON cannot represent"
        if type(a) is not type(b):
            return path, (
                f"holds a {_type_name(a)} that a durable round trip turns into "
                f"a {_type_name(b)}: declare the field with that type (for example "
                "bytes, set[int] or tuple[int, ...]) or store plain JSON values (str, "
                "int, float, bool, None, lists, and dicts with str keys)"
            )
        children: list[tuple[Any, Any, str]] = []
        if isinstance(a, msgspec.Struct):
            children = [
                (getattr(a, n), getattr(b, n), f"{path}.{n}")
                for n in a.__struct_fields__
            ]
        elif isinstance(a, dict):
            for key in a:
                if key not in b:
                    return path, (
                        f"has a key of type {_type_name(key)} ({key!r}) that a durable "
                        "round trip turns into text: declare the field as a dict with "
                        "that key type, or use str keys"
                    )
                children.append((a[key], b[key], f"{path}[{key!r}]"))
        elif isinstance(a, list) and len(a) == len(b):
            children = [
                (x, y, f"{path}[{i}]")
                for i, (x, y) in enumerate(zip(a, b, strict=True))
            ]
        elif a != b:
            return path, f"holds {a!r}, which a durable round trip turns into {b!r}"
        stack.extend(reversed(children))
    return "$.fields", "does not survive a durable round trip"


def _check_header(blob: bytes, workflow_instance_id: str, revision: int) -> None:
    where = f"workflow instance {workflow_instance_id!r} revision {revision}"
    try:
        header = _HEADER_DECODER.decode(blob)
    except RecursionError:
        raise _nested_record(workflow_instance_id, revision) from None
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise CorruptRecordError(
            f"stored snapshot of {where} does not decode: {exc}",
            instance_id=workflow_instance_id,
            revision=revision,
        ) from exc
    if header.type != RECORD_TYPE:
        raise CorruptRecordError(
            f"stored snapshot of {where} has type {header.type!r}, expected {RECORD_TYPE!r}",
            instance_id=workflow_instance_id,
            revision=revision,
        )
    if header.format != SNAPSHOT_FORMAT:
        raise CorruptRecordError(
            f"stored snapshot of {where} has format {header.format}; "
            f"this release reads format {SNAPSHOT_FORMAT}",
            instance_id=workflow_instance_id,
            revision=revision,
        )
    if (
        header.workflow_instance_id != workflow_instance_id
        or header.revision != revision
    ):
        raise CorruptRecordError(
            f"stored snapshot of {where} names workflow instance "
            f"{header.workflow_instance_id!r} revision {header.revision}",
            instance_id=workflow_instance_id,
            revision=revision,
        )


def _typed_decoder(state_type: type[T]) -> msgspec.json.Decoder[_Envelope[T]]:
    decoder = _typed_decoders.get(state_type)
    if decoder is None:
        with _decoders_lock:
            envelope_type = cast("Any", _Envelope)[state_type]
            decoder = _typed_decoders.setdefault(
                state_type, msgspec.json.Decoder(envelope_type)
            )
    return decoder


def decode_snapshot(
    blob: bytes, *, workflow_instance_id: str, revision: int, state_type: type[T]
) -> DecodedSnapshot[T]:
    """Decode a stored snapshot into *state_type*.

    Raises:
        CorruptRecordError: the blob is malformed or truncated, of another type or
            format, belongs to another instance or revision, or does not fit
            *state_type* (the message names the instance, the revision and the field).
    """
    _check_header(blob, workflow_instance_id, revision)
    try:
        envelope = _typed_decoder(state_type).decode(blob)
    except RecursionError:
        raise _nested_record(workflow_instance_id, revision) from None
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise CorruptRecordError(
            f"stored snapshot of workflow instance {workflow_instance_id!r} revision "
            f"{revision} does not fit {state_type.__name__}: {exc}",
            instance_id=workflow_instance_id,
            revision=revision,
        ) from exc
    return DecodedSnapshot(
        fields=envelope.fields,
        phase=envelope.phase,
        workflow=envelope.workflow,
        trace=envelope.trace,
    )


def decode_snapshot_builtins(
    blob: bytes, *, workflow_instance_id: str, revision: int
) -> DecodedSnapshot[dict[str, Any]]:
    """Decode a stored snapshot into plain JSON values (for comparisons and operators).

    Raises:
        CorruptRecordError: as :func:`decode_snapshot`.
    """
    _check_header(blob, workflow_instance_id, revision)
    try:
        envelope = _BUILTINS_DECODER.decode(blob)
    except RecursionError:
        raise _nested_record(workflow_instance_id, revision) from None
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise CorruptRecordError(
            f"stored snapshot of workflow instance {workflow_instance_id!r} revision "
            f"{revision} does not decode: {exc}",
            instance_id=workflow_instance_id,
            revision=revision,
        ) from exc
    return DecodedSnapshot(
        fields=envelope.fields,
        phase=envelope.phase,
        workflow=envelope.workflow,
        trace=envelope.trace,
    )


def _nested_record(workflow_instance_id: str, revision: int) -> CorruptRecordError:
    return CorruptRecordError(
        f"stored snapshot of workflow instance {workflow_instance_id!r} revision "
        f"{revision} is nested too deeply to decode (phronomy never writes such a "
        "snapshot: it was written by something else)",
        instance_id=workflow_instance_id,
        revision=revision,
    )


def normalize(value: Any) -> Any:
    """Return *value* as the JSON values it is stored as (keys and enums become text).

    Raises:
        SerializationError: *value* is nested too deeply to encode.
    """
    try:
        return msgspec.json.decode(_ENCODER.encode(value))
    except RecursionError:
        raise SerializationError(
            "the value is nested too deeply to be compared with the stored snapshot"
        ) from None
