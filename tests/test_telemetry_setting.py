"""The telemetry setting: checked before anything opens, the ``phronomy[otel]`` extra
optional, and the snapshot's traceparent (the rest: ``test_telemetry``)."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider

import phronomy
from phronomy import _telemetry
from phronomy.storage import decode_snapshot_builtins


class Parcel(phronomy.State):
    item: str = ""


def test_the_setting_is_checked_and_the_extra_is_optional(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(phronomy.InvalidInputError, match="telemetry must be"):
        _telemetry.resolve("yes")
    assert _telemetry.resolve(False) is None
    assert _telemetry.resolve(None) is None  # no provider is set in the tests
    assert isinstance(_telemetry.resolve(True), _telemetry.Telemetry)
    import opentelemetry.trace

    monkeypatch.setattr(
        opentelemetry.trace, "get_tracer_provider", lambda: TracerProvider()
    )
    assert isinstance(_telemetry.resolve(None), _telemetry.Telemetry)  # SDK: on
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # the extra is missing
    assert _telemetry.resolve(None) is None
    with pytest.raises(phronomy.InvalidInputError, match=r"phronomy\[otel\]"):
        _telemetry.resolve(True)


async def test_a_bad_setting_opens_nothing(tmp_path: Any) -> None:
    path = tmp_path / "never.db"
    with pytest.raises(phronomy.InvalidInputError, match="telemetry must be"):
        async with phronomy.open_runtime(path, telemetry="on"):  # type: ignore[arg-type]
            pass
    assert not path.exists()


def test_the_snapshot_keeps_a_traceparent_and_reads_without_one() -> None:
    from phronomy.storage import decode_snapshot, encode_snapshot

    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    plain = encode_snapshot(
        Parcel(item="lamp"), workflow_instance_id="o-1", revision=1, phase="awaiting"
    )
    traced = encode_snapshot(
        Parcel(item="lamp"),
        workflow_instance_id="o-1",
        revision=1,
        phase="awaiting",
        trace=parent,
    )
    assert b"trace" not in plain  # a runtime without telemetry writes what it wrote
    assert traced.count(parent.encode()) == 1
    for blob, expected in ((plain, None), (traced, parent)):
        typed = decode_snapshot(
            blob, workflow_instance_id="o-1", revision=1, state_type=Parcel
        )
        assert typed.trace == expected
        assert typed.fields == Parcel(item="lamp")
        builtins = decode_snapshot_builtins(
            blob, workflow_instance_id="o-1", revision=1
        )
        assert builtins.trace == expected
