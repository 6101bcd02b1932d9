"""The snapshot codec: round trips, the JSON domain, limits and corrupt blobs."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import enum
import math
import uuid
from pathlib import Path
from typing import Annotated, Any

import msgspec
import pytest
from hypothesis import given, settings, strategies as st

import phronomy
from phronomy import errors
from phronomy.storage import (
    SNAPSHOT_FORMAT,
    check_json_domain,
    decode_snapshot,
    decode_snapshot_builtins,
    encode_snapshot,
    normalize,
)

FIXTURES = Path(__file__).parent.parent / "fixtures" / "snapshots"


class Color(enum.Enum):
    RED = "red"


class Line(msgspec.Struct, frozen=True):
    sku: str
    qty: int


class Order(phronomy.State):
    item: str = ""
    approved: bool = False
    log: Annotated[list[str], phronomy.APPEND] = []  # noqa: RUF012
    lines: list[Line] = []  # noqa: RUF012
    meta: Annotated[dict[str, Any], phronomy.MERGE] = {}  # noqa: RUF012
    due: datetime.date | None = None
    color: Color | None = None
    ref: uuid.UUID | None = None
    amount: float = 0.0


def _encode(state: Any, **kw: Any) -> bytes:
    return encode_snapshot(
        state,
        workflow_instance_id="order-1",
        revision=2,
        phase="p",
        workflow="orders",
        **kw,
    )


def test_release_1_fixture_still_decodes() -> None:
    # Blobs written by this release are committed; later releases must keep reading them.
    blob = (FIXTURES / "order_v1_rev2.json").read_bytes().strip()
    decoded = decode_snapshot(
        blob, workflow_instance_id="order-1", revision=2, state_type=Order
    )
    assert decoded.phase == "awaiting_approval"
    assert decoded.workflow == "orders"
    state = decoded.fields
    assert state.item == "lamp"
    assert state.lines == [Line(sku="L-1", qty=2)]
    assert state.meta["nested"] == {"a": [1, 2]}
    assert state.due == datetime.date(2026, 11, 29)
    assert state.color is Color.RED
    assert state.ref == uuid.UUID("12345678-1234-5678-1234-567812345678")
    plain = decode_snapshot_builtins(blob, workflow_instance_id="order-1", revision=2)
    assert plain.fields["color"] == "red"


def test_round_trip_of_rich_states() -> None:
    state = Order(
        item="x", lines=[Line(sku="a", qty=1)], meta={"k": [1, {"z": None}]}, amount=1.5
    )
    decoded = decode_snapshot(
        _encode(state), workflow_instance_id="order-1", revision=2, state_type=Order
    )
    assert decoded.fields == state


@pytest.mark.parametrize(
    ("value", "path"),
    [
        (object(), r"\$\.fields\.meta\['k'\]"),
        (math.nan, r"\$\.fields\.meta\['k'\] is nan"),
        (math.inf, r"is inf"),
        ({1.5: "x"}, r"key of type float"),
        ([1, {"deep": {1, object()}}], r"\$\.fields\.meta\['k'\]\[1\]\['deep'\]"),
    ],
    ids=["object", "nan", "inf", "float-key", "deep"],
)
def test_values_outside_the_json_domain_name_their_path(value: Any, path: str) -> None:
    # scenario 129 (codec part)
    with pytest.raises(errors.SerializationError, match=path):
        _encode(Order(meta={"k": value}))


def test_dataclasses_and_structs_are_walked() -> None:
    @dataclasses.dataclass
    class Box:
        thing: Any

    check_json_domain({"box": Box(thing=1)})
    with pytest.raises(errors.SerializationError, match=r"\$\['box'\]\.thing"):
        check_json_domain({"box": Box(thing=object())})


def test_size_limit() -> None:
    state = Order(item="x" * 2000)
    assert _encode(state, max_bytes=10_000)
    with pytest.raises(
        errors.SerializationError,
        match=r"'order-1' is \d+ bytes; the limit is 1000 bytes",
    ):
        _encode(state, max_bytes=1000)


@pytest.mark.parametrize(
    ("blob", "message"),
    [
        (b"", "does not decode"),
        (
            b'{"type": "phronomy.workflow_state", "format": 1, "workflow_inst',
            "does not decode",
        ),
        (b"[1, 2, 3]", "does not decode"),
        (
            b'{"type": "other", "format": 1, "workflow_instance_id": "order-1", "revision": 2}',
            "has type 'other'",
        ),
        (
            b'{"type": "phronomy.workflow_state", "format": 99, "workflow_instance_id": "order-1", "revision": 2}',
            "format 99; this release reads format 1",
        ),
        (
            b'{"type": "phronomy.workflow_state", "format": 1, "workflow_instance_id": "order-9", "revision": 2}',
            "names workflow instance 'order-9' revision 2",
        ),
        (
            b'{"type": "phronomy.workflow_state", "format": 1, "workflow_instance_id": "order-1", "revision": 5}',
            "revision 5",
        ),
        (
            b'{"type": "phronomy.workflow_state", "format": 1, "workflow_instance_id": "order-1", "revision": 2,'
            b' "workflow": "orders", "phase": "p", "fields": {"item": 42}}',
            r"does not fit Order: Expected `str`, got `int` - at `\$\.fields\.item`",
        ),
    ],
    ids=[
        "empty",
        "truncated",
        "not-an-object",
        "wrong-type",
        "future-format",
        "other-instance",
        "other-revision",
        "bad-field",
    ],
)
def test_corrupt_blobs_name_the_instance_and_revision(
    blob: bytes, message: str
) -> None:
    with pytest.raises(errors.CorruptRecordError, match=message) as caught:
        decode_snapshot(
            blob, workflow_instance_id="order-1", revision=2, state_type=Order
        )
    assert caught.value.instance_id == "order-1"
    assert caught.value.revision == 2
    assert "'order-1' revision 2" in str(caught.value)


def test_format_constant_is_pinned() -> None:
    assert SNAPSHOT_FORMAT == 1


def test_normalize_turns_values_into_stored_json() -> None:
    assert normalize({"a": (1, 2), "b": Color.RED, 3: "x"}) == {
        "a": [1, 2],
        "b": "red",
        "3": "x",
    }


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=300))
def test_arbitrary_bytes_never_escape_as_untyped_errors(data: bytes) -> None:
    # RELIABILITY.md T10: bad blobs map to typed errors only
    with contextlib.suppress(errors.CorruptRecordError):
        decode_snapshot(
            data, workflow_instance_id="order-1", revision=2, state_type=Order
        )


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(
    meta=st.dictionaries(st.text(max_size=5), json_values, max_size=5), item=st.text()
)
def test_json_domain_values_round_trip(meta: dict[str, Any], item: str) -> None:
    state = Order(item=item, meta=meta)
    decoded = decode_snapshot(
        _encode(state), workflow_instance_id="order-1", revision=2, state_type=Order
    )
    assert normalize(decoded.fields) == normalize(state)


def _nested_list(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def test_values_nested_too_deeply_are_serialization_errors() -> None:
    # Before: RecursionError escaped from the encoder.
    with pytest.raises(
        errors.SerializationError, match="'order-1' revision 2 is nested too deeply"
    ):
        _encode(Order(meta={"k": _nested_list(100_000)}))
    with pytest.raises(errors.SerializationError, match="nested too deeply"):
        normalize(_nested_list(100_000))


def test_a_stored_blob_nested_too_deeply_is_a_corrupt_record() -> None:
    # Before: RecursionError escaped from the decoder.
    depth = 100_000
    blob = (
        b'{"type": "phronomy.workflow_state", "format": 1, "workflow_instance_id": '
        b'"order-1", "revision": 2, "workflow": "orders", "phase": "p", "fields": '
        b'{"meta": {"k": ' + b"[" * depth + b"]" * depth + b"}}}"
    )
    for decode in (
        lambda: decode_snapshot(
            blob, workflow_instance_id="order-1", revision=2, state_type=Order
        ),
        lambda: decode_snapshot_builtins(
            blob, workflow_instance_id="order-1", revision=2
        ),
    ):
        with pytest.raises(
            errors.CorruptRecordError, match="nested too deeply"
        ) as caught:
            decode()
        assert (caught.value.instance_id, caught.value.revision) == ("order-1", 2)


class Loose(phronomy.State):
    anything: Any = None
    items: list[Any] = []  # noqa: RUF012


@pytest.mark.parametrize(
    ("state", "path", "detail"),
    [
        (Loose(anything=b"\x00\x01"), r"\$\.fields\.anything", "bytes .* into a str"),
        (Loose(anything=(1, 2)), r"\$\.fields\.anything", "tuple .* into a list"),
        (Loose(anything={1, 2}), r"\$\.fields\.anything", "set .* into a list"),
        (Loose(anything={1: "a"}), r"\$\.fields\.anything", "key of type int"),
        (Loose(anything=Color.RED), r"\$\.fields\.anything", "Color .* into a str"),
        (Loose(items=[1, (2, 3)]), r"\$\.fields\.items\[1\]", "tuple .* into a list"),
        (
            Loose(anything={"when": datetime.date(2026, 1, 1)}),
            r"\$\.fields\.anything\['when'\]",
            "date .* into a str",
        ),
    ],
    ids=["bytes", "tuple", "set", "int-keys", "enum", "nested-tuple", "date"],
)
def test_any_typed_values_that_would_change_type_are_refused(
    state: Loose, path: str, detail: str
) -> None:
    # Before: they were saved and came back as another type.
    with pytest.raises(
        errors.SerializationError,
        match=f"{path} holds .*{detail}|{path} has a {detail}",
    ) as caught:
        _encode(state)
    assert "'order-1' revision 2" in str(caught.value)


class Typed(phronomy.State):
    raw: bytes = b""
    tags: set[int] = set()  # noqa: RUF012
    pair: tuple[int, str] = (0, "")
    by_id: dict[int, str] = {}  # noqa: RUF012
    color: Color = Color.RED
    when: datetime.datetime | None = None


def test_declared_types_survive_the_round_trip() -> None:
    state = Typed(
        raw=b"\x00\xff",
        tags={3, 1},
        pair=(7, "x"),
        by_id={1: "a", 2: "b"},
        when=datetime.datetime(2026, 11, 30, 12, tzinfo=datetime.UTC),
    )
    decoded = decode_snapshot(
        _encode(state), workflow_instance_id="order-1", revision=2, state_type=Typed
    )
    assert decoded.fields == state
    assert isinstance(decoded.fields.raw, bytes)
    assert isinstance(decoded.fields.tags, set)
    assert isinstance(decoded.fields.pair, tuple)


class Plain(phronomy.State):
    n: int = 0
    name: str = ""
    done: bool = False


@given(
    n=st.one_of(st.integers(), st.booleans(), st.text(max_size=3), st.none()),
    name=st.one_of(st.text(max_size=5), st.integers(), st.none()),
    done=st.one_of(st.booleans(), st.integers(0, 1)),
)
@settings(max_examples=200, deadline=None)
def test_plain_states_load_again_as_saved(n: Any, name: Any, done: Any) -> None:
    # A state of plain fields skips the decode-again check only when its values are
    # exactly the declared types; any other value is still checked (and refused, or
    # stored as what loads again): the blob always decodes to the state saved.
    state = Plain(n=n, name=name, done=done)  # a Struct does not check its own values
    try:
        blob = encode_snapshot(state, workflow_instance_id="p", revision=1, phase=None)
    except errors.SerializationError:
        plain = type(n) is int and -(2**63) <= n < 2**64
        assert not (plain and type(name) is str and type(done) is bool)
        return
    decoded = decode_snapshot(
        blob, workflow_instance_id="p", revision=1, state_type=Plain
    )
    assert decoded.fields == state
