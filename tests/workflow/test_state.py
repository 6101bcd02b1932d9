"""Workflow states and reducers (spec §3.5, scenarios 5-12, adapted to msgspec states)."""

from __future__ import annotations

import datetime
from typing import Annotated, Any

import msgspec
import pytest

import phronomy
from phronomy.workflow._state import (
    build_state,
    copy_value,
    state_spec,
    validate_fields,
)


class Ctx(phronomy.State):
    value: int = 1
    messages: Annotated[list[str], phronomy.APPEND] = msgspec.field(
        default_factory=lambda: ["a"]
    )
    metadata: Annotated[dict[str, int], phronomy.MERGE] = msgspec.field(
        default_factory=lambda: {"x": 1}
    )
    tags: list[dict[str, Any]] = []  # noqa: RUF012
    when: datetime.date | None = None


def test_reducers_replace_append_merge_and_original_unchanged() -> None:
    # scenario 8
    old = Ctx()
    assert old.merge(value=99).value == 99
    assert old.merge(messages=["b", "c"]).messages == ["a", "b", "c"]
    assert old.merge(metadata={"x": 99, "y": 2}).metadata == {"x": 99, "y": 2}
    assert (old.value, old.messages, old.metadata) == (1, ["a"], {"x": 1})


def test_append_coerces_scalars_and_none() -> None:
    ctx = Ctx()
    assert ctx.merge(messages="first").messages == ["a", "first"]
    assert ctx.merge(messages=None).messages == ["a"]
    assert ctx.merge(messages=("t", "u")).messages == ["a", "t", "u"]


def test_merge_reducer_rejects_non_dicts() -> None:
    with pytest.raises(phronomy.InvalidInputError, match="metadata merges dicts"):
        Ctx().merge(metadata=[1])


def test_unknown_field_is_rejected_by_name() -> None:
    # scenario 9
    with pytest.raises(phronomy.InvalidInputError, match="nonexistent"):
        Ctx().merge(nonexistent=1)


def test_merge_validates_types_and_names_the_field() -> None:
    with pytest.raises(phronomy.InvalidInputError, match=r"Ctx\.value"):
        Ctx().merge(value="not an int")
    assert Ctx().merge(when="2024-01-02").when == datetime.date(2024, 1, 2)


def test_merge_deep_copies_untouched_nested_values() -> None:
    # scenario 10
    old = Ctx(tags=[{"name": "a"}])
    new = old.merge(value=2)
    new.tags[0]["name"] = "mutated"
    assert old.tags[0]["name"] == "a"


def test_uncopyable_objects_are_shared() -> None:
    # scenario 12: objects phronomy cannot copy are shared (states are values)
    marker = object()
    assert copy_value(marker) is marker
    assert copy_value({"k": [marker]})["k"][0] is marker
    data = bytearray(b"ab")
    assert copy_value(data) == data
    assert copy_value(data) is not data
    assert copy_value((1, [2])) == (1, [2])
    assert copy_value({1, 2}) == {1, 2}


def test_states_are_frozen() -> None:
    with pytest.raises(AttributeError):
        Ctx().value = 3  # type: ignore[misc]


def test_empty_mutable_defaults_are_distinct_and_non_empty_ones_refused() -> None:
    # scenario 5, as msgspec enforces it
    a, b = Ctx(), Ctx()
    a.tags.append({"x": 1})
    assert b.tags == []
    with pytest.raises(TypeError, match="mutable"):

        class Bad(phronomy.State):
            tags: list[str] = ["shared"]  # noqa: RUF012


def test_workflow_instance_id_is_reserved() -> None:
    # scenario 6
    with pytest.raises(phronomy.DefinitionError, match="workflow_instance_id"):

        class Bad(phronomy.State):
            workflow_instance_id: str = ""


def test_input_validation_names_unknown_and_mistyped_fields() -> None:
    # scenario 7
    with pytest.raises(
        phronomy.InvalidInputError, match=r"Unknown Ctx field\(s\): \['scor'\]"
    ):
        validate_fields(Ctx, {"scor": 10})
    with pytest.raises(phronomy.InvalidInputError, match=r"Ctx\.value"):
        validate_fields(Ctx, {"value": []})
    fields = validate_fields(Ctx, {"value": 5})
    assert build_state(Ctx, fields) == Ctx(value=5)
    assert build_state(Ctx, {}) == Ctx()
    assert build_state(Ctx, {"value": 7}, base=Ctx(value=1, messages=["z"])) == Ctx(
        value=7, messages=["z"]
    )


def test_missing_required_field_is_a_validation_error() -> None:
    class Needs(phronomy.State):
        name: str

    with pytest.raises(phronomy.InvalidInputError, match="name"):
        build_state(Needs, {})


def test_state_spec_collects_reducers_and_rejects_double_markers() -> None:
    spec = state_spec(Ctx)
    assert spec.reducers == {
        "value": "replace",
        "messages": "append",
        "metadata": "merge",
        "tags": "replace",
        "when": "replace",
    }

    class Double(phronomy.State):
        x: Annotated[list[int], phronomy.APPEND, phronomy.MERGE] = []  # noqa: RUF012

    with pytest.raises(phronomy.DefinitionError, match="more than one reducer"):
        state_spec(Double)
    with pytest.raises(phronomy.DefinitionError, match=r"not a phronomy\.State"):
        state_spec(int)


def test_states_round_trip_through_msgspec() -> None:
    ctx = Ctx(value=3, tags=[{"a": 1}], when=datetime.date(2020, 1, 1))
    assert msgspec.json.decode(msgspec.json.encode(ctx), type=Ctx) == ctx
