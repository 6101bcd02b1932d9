"""The layering of DESIGN.md, the sans-IO core and the public surface, as tests."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import phronomy

SRC = Path(phronomy.__file__).parent


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            prefix = "phronomy." if node.level else ""
            found.add(
                prefix + node.module if node.level < 2 else "phronomy." + node.module
            )
    return found


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("storage", ("trio", "phronomy.engine", "phronomy.workflow", "phronomy.agent")),
        ("engine", ("phronomy.workflow", "phronomy.agent", "phronomy.runtime")),
        ("workflow", ("phronomy.agent", "phronomy.runtime")),
        ("agent", ("phronomy.runtime",)),
    ],
)
def test_layers_only_import_downwards(package: str, forbidden: tuple[str, ...]) -> None:
    for path in (SRC / package).glob("*.py"):
        for name in _imports(path):
            assert not name.startswith(forbidden), f"{path.name} imports {name}"


@pytest.mark.parametrize(
    "module", ["workflow/_machine.py", "workflow/_definition.py", "workflow/_state.py"]
)
def test_the_machine_core_is_sans_io(module: str) -> None:
    names = _imports(SRC / module)
    assert not any(
        n.startswith(("trio", "sqlite3", "phronomy.engine")) for n in names
    ), names


def test_facade_exports_resolve_and_have_docs() -> None:
    for name in phronomy.__all__:
        value = getattr(phronomy, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert (value.__doc__ or "").strip(), f"{name} has no docstring"


def test_no_abandoned_threads_for_writes() -> None:
    for path in SRC.rglob("*.py"):
        assert "abandon_on_cancel=True" not in path.read_text(encoding="utf-8"), path
