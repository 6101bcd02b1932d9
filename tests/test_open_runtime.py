"""What open_runtime accepts as its store."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

import phronomy

if TYPE_CHECKING:
    from pathlib import Path


def _flow() -> phronomy.WorkflowDefinition[phronomy.State]:
    return phronomy.Workflow(phronomy.State, name="one").state("s").build()


async def test_a_path_opens_a_sqlite_store(tmp_path: Path) -> None:
    # Before: AttributeError: 'str' object has no attribute 'max_concurrency' (and a
    # second one during cleanup).
    for given in (str(tmp_path / "orders.db"), tmp_path / "orders.db"):
        async with phronomy.open_runtime(store=given) as rt:
            assert isinstance(rt.store, phronomy.SQLiteStore)
            done = await rt.workflows.invoke(
                _flow(), workflow_instance_id="o-1", if_exists="return"
            )
            assert done.revision == 1
    assert (tmp_path / "orders.db").exists()


async def test_a_postgresql_uri_opens_a_postgres_store(postgres_dsn: str) -> None:
    async with phronomy.open_runtime(store=postgres_dsn) as rt:
        assert isinstance(rt.store, phronomy.PostgresStore)
        assert rt.durable


@pytest.mark.parametrize("bad", [42, b"orders.db", "", object()])
async def test_anything_else_is_refused_naming_what_is_accepted(bad: object) -> None:
    with pytest.raises(phronomy.InvalidInputError, match="a SQLite file path, or a"):
        async with phronomy.open_runtime(store=bad):  # type: ignore[arg-type]
            pytest.fail("the body must not run")
