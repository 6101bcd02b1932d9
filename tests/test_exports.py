"""The public surface: what each public module exports, and how its classes may be used.

In the spirit of trio's ``test_exports.py``: every name in ``__all__`` resolves, the
facade stays small, every public class is either final or meant for subclassing, and
the API reference documents exactly what the modules export.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

import phronomy

PUBLIC_MODULES = [
    "phronomy",
    "phronomy.workflow",
    "phronomy.agent",
    "phronomy.storage",
    "phronomy.errors",
    "phronomy.testing",
    "phronomy.lowlevel",
]

MEANT_FOR_SUBCLASSING = {
    "State",  # users declare their state classes
    "ExecutionReceiver",  # features' coordinators
    "GatedSession",  # features' sessions
    "BaseStore",  # store backends
    "WorkflowStore",  # the store protocol
    "Host",
    "Receiver",
    "Session",
    "TerminalPolicy",  # protocols
}

DOCS = Path(__file__).parent.parent / "docs" / "reference"


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_every_exported_name_resolves_and_is_documented_in_code(
    module_name: str,
) -> None:
    module = importlib.import_module(module_name)
    assert len(set(module.__all__)) == len(module.__all__), "duplicates in __all__"
    for name in module.__all__:
        value = getattr(module, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert (value.__doc__ or "").strip(), (
                f"{module_name}.{name} has no docstring"
            )


def test_the_facade_is_small() -> None:
    assert len(phronomy.__all__) <= 45
    errors = [n for n in phronomy.__all__ if n.endswith("Error")]
    assert len(errors) <= 23  # the rest of the tree: phronomy.errors
    from phronomy import errors as errors_module

    # the tree in the errors module's docstring names every error class
    for name in errors_module.__all__:
        assert name in (errors_module.__doc__ or ""), name


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_public_classes_are_final_or_meant_for_subclassing(module_name: str) -> None:
    module = importlib.import_module(module_name)
    for name in module.__all__:
        value = getattr(module, name)
        if not inspect.isclass(value) or issubclass(value, BaseException):
            continue
        if name in MEANT_FOR_SUBCLASSING:
            continue
        assert getattr(value, "__final__", False), (
            f"{module_name}.{name} is neither @final nor meant for subclassing"
        )


def _documented(module_name: str) -> set[str]:
    names: set[str] = set()
    pattern = re.compile(
        r"^\.\. (?:autoclass|autofunction|autodata|autoexception):: "
        + re.escape(module_name)
        + r"\.(\w+)\s*$",
        re.MULTILINE,
    )
    for page in DOCS.glob("*.rst"):
        names.update(pattern.findall(page.read_text(encoding="utf-8")))
    return names


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_the_reference_documents_exactly_the_exports(module_name: str) -> None:
    module = importlib.import_module(module_name)
    exported = set(module.__all__) - {"__version__"}
    if module_name == "phronomy":
        # the facade re-exports: each name is documented where it lives or here
        documented = set()
        for other in PUBLIC_MODULES:
            documented |= _documented(other)
        missing = {
            n
            for n in exported
            if n not in documented and n not in _documented("phronomy")
        }
        assert not missing, f"not in the reference: {sorted(missing)}"
        return
    documented = _documented(module_name)
    assert exported <= documented | _documented("phronomy"), sorted(
        exported - documented - _documented("phronomy")
    )
    assert documented <= exported, sorted(documented - exported)
