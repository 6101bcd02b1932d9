"""The snapshot codec: msgspec JSON with a type tag and a format version.

A stored snapshot is one JSON object::

    {"type": "phronomy.workflow_state", "format": 1,
     "workflow_instance_id": "order-1", "revision": 2, "workflow": "orders",
     "phase": "awaiting_approval", "fields": {...}}

Format 1 is the format of this release; every later release must still decode it
(``tests/fixtures/snapshots`` holds committed blobs). Values outside the JSON domain
(arbitrary objects, NaN, infinities) are refused with a :class:`SerializationError`
naming the field path, before anything is written.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import math
import threading
import uuid
from typing import Any, Generic, TypeVar, cast

import msgspec

from phronomy.errors import CorruptRecordError, PayloadTooLargeError, SerializationError

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


class _Envelope(msgspec.Struct, Generic[T], frozen=True, kw_only=True):
    type: str
    format: int
    workflow_instance_id: str
    revision: int
    workflow: str
    phase: str | None
    fields: T


class DecodedSnapshot(msgspec.Struct, Generic[T], frozen=True, kw_only=True):
    """A decoded snapshot.

    Attributes:
        fields: the state (typed) or a ``dict`` (builtins decode).
        phase: the phase the snapshot was taken at.
        workflow: the workflow name recorded with it.
    """

    fields: T
    phase: str | None
    workflow: str


_ENCODER = msgspec.json.Encoder()
_HEADER_DECODER = msgspec.json.Decoder(_Header)
_BUILTINS_DECODER = msgspec.json.Decoder(_Envelope[dict[str, Any]])
_typed_decoders: dict[type[Any], msgspec.json.Decoder[Any]] = {}
_decoders_lock = threading.Lock()


def check_json_domain(value: Any, path: str = "$") -> None:
    """Raise :class:`SerializationError` naming the first value that cannot be stored.

    Args:
        value: a state or any nested value.
        path: the path of *value* used in the message.

    Raises:
        SerializationError: an unsupported object, a non-finite float, or a mapping
            key that is not text, a number or an enum.
    """
    if isinstance(value, _LEAVES):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise SerializationError(
                f"{path} is {value!r}, which JSON cannot represent"
            )
        return
    if isinstance(value, msgspec.Struct):
        for name in value.__struct_fields__:
            check_json_domain(getattr(value, name), f"{path}.{name}")
        return
    if isinstance(value, (list, tuple, set, frozenset)):
        for index, item in enumerate(value):
            check_json_domain(item, f"{path}[{index}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, (str, int, enum.Enum)) or isinstance(key, bool):
                raise SerializationError(
                    f"{path} has a key of type {type(key).__name__} ({key!r}); keys must be text"
                )
            check_json_domain(item, f"{path}[{key!r}]")
        return
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            check_json_domain(getattr(value, field.name), f"{path}.{field.name}")
        return
    raise SerializationError(
        f"{path} holds a {type(value).__module__}.{type(value).__qualname__}, "
        "which is outside the JSON domain and cannot be stored"
    )


def encode_snapshot(
    fields: Any,
    *,
    workflow_instance_id: str,
    revision: int,
    phase: str | None,
    workflow: str = "",
    max_bytes: int = DEFAULT_MAX_SNAPSHOT_BYTES,
) -> bytes:
    """Encode a snapshot for storage.

    Args:
        fields: the state (a msgspec Struct) or a mapping of field values.
        workflow_instance_id: the instance the snapshot belongs to.
        revision: the revision the snapshot will have once saved.
        phase: the wait state's name, or ``"__end__"``.
        workflow: the workflow name.
        max_bytes: the size limit.

    Returns:
        The encoded snapshot.

    Raises:
        SerializationError: a value outside the JSON domain (the message names it).
        PayloadTooLargeError: the encoded snapshot exceeds *max_bytes*.
    """
    check_json_domain(fields, "$.fields")
    envelope = _Envelope(
        type=RECORD_TYPE,
        format=SNAPSHOT_FORMAT,
        workflow_instance_id=workflow_instance_id,
        revision=revision,
        workflow=workflow,
        phase=phase,
        fields=fields,
    )
    try:
        blob = _ENCODER.encode(envelope)
    except (TypeError, ValueError, OverflowError) as exc:
        raise SerializationError(
            f"snapshot of workflow instance {workflow_instance_id!r} cannot be encoded: {exc}"
        ) from exc
    if len(blob) > max_bytes:
        raise PayloadTooLargeError(
            f"snapshot of workflow instance {workflow_instance_id!r} is {len(blob)} bytes; "
            f"the limit is {max_bytes} bytes (max_snapshot_bytes)"
        )
    return blob


def _check_header(blob: bytes, workflow_instance_id: str, revision: int) -> None:
    where = f"workflow instance {workflow_instance_id!r} revision {revision}"
    try:
        header = _HEADER_DECODER.decode(blob)
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
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise CorruptRecordError(
            f"stored snapshot of workflow instance {workflow_instance_id!r} revision "
            f"{revision} does not fit {state_type.__name__}: {exc}",
            instance_id=workflow_instance_id,
            revision=revision,
        ) from exc
    return DecodedSnapshot(
        fields=envelope.fields, phase=envelope.phase, workflow=envelope.workflow
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
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise CorruptRecordError(
            f"stored snapshot of workflow instance {workflow_instance_id!r} revision "
            f"{revision} does not decode: {exc}",
            instance_id=workflow_instance_id,
            revision=revision,
        ) from exc
    return DecodedSnapshot(
        fields=envelope.fields, phase=envelope.phase, workflow=envelope.workflow
    )


def normalize(value: Any) -> Any:
    """Return *value* as the JSON values it is stored as (keys and enums become text)."""
    return msgspec.json.decode(_ENCODER.encode(value))
