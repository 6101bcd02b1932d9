"""Generate the API reference pages from the public modules' ``__all__``.

Run by ``conf.py`` on every build; the pages are committed, and
``tests/test_exports.py`` checks that they document exactly what the modules export.
Each object is documented once: a name the facade (``phronomy``) re-exports is
documented as ``phronomy.<name>``, on the page of the module it belongs to.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

PAGES = [
    ("runtime", "The runtime and workflows", "phronomy", "non-errors"),
    ("errors", "Errors", "phronomy.errors", "all"),
    ("workflow", "phronomy.workflow", "phronomy.workflow", "rest"),
    ("agent", "phronomy.agent", "phronomy.agent", "rest"),
    ("storage", "phronomy.storage", "phronomy.storage", "rest"),
    ("testing", "phronomy.testing", "phronomy.testing", "rest"),
    ("lowlevel", "phronomy.lowlevel", "phronomy.lowlevel", "rest"),
    ("console", "phronomy.console", "phronomy.console", "rest"),
]


def _has_private_mixin(value: object) -> bool:
    """A class built from a private mixin (its members belong on its page)."""
    bases = getattr(value, "__mro__", ())[1:]
    return any(
        b.__module__.startswith("phronomy")
        and not hasattr(
            importlib.import_module(b.__module__.rsplit("._", 1)[0]), b.__name__
        )
        for b in bases
    )


def _directive(module: object, name: str) -> str:
    value = getattr(module, name)
    if inspect.isclass(value):
        return "autoexception" if issubclass(value, BaseException) else "autoclass"
    if inspect.isfunction(value) or inspect.isbuiltin(value):
        return "autofunction"
    return "autodata"


def render(page: str, title: str, module_name: str, which: str) -> str:
    """The text of one reference page."""
    facade = importlib.import_module("phronomy")
    module = importlib.import_module(module_name)
    lines = [title, "=" * len(title), ""]
    if module_name != "phronomy":
        lines += [f".. automodule:: {module_name}", "   :no-members:", ""]
    names = [n for n in module.__all__ if n != "__version__"]
    if which == "non-errors":  # the error tree (and its warning) has its own page
        errors = importlib.import_module("phronomy.errors")
        names = [n for n in names if n not in errors.__all__]
    for name in sorted(names, key=lambda n: (n.isupper(), n)):
        owner = (
            "phronomy" if which != "rest" and name in facade.__all__ else module_name
        )
        if which == "rest" and name in facade.__all__:
            continue  # documented as phronomy.<name>
        directive = _directive(module, name)
        if directive == "autoclass" and _has_private_mixin(getattr(module, name)):
            lines += [f".. {directive}:: {owner}.{name}", "   :inherited-members:", ""]
        elif name == "open_runtime":
            lines += [f".. {directive}:: {owner}.{name}", "   :async-with: runtime", ""]
        else:
            lines += [f".. {directive}:: {owner}.{name}", ""]
    return "\n".join(lines).rstrip() + "\n"


def generate(directory: Path) -> None:
    """Write every page (only when its text changed)."""
    directory.mkdir(exist_ok=True)
    for page, title, module_name, which in PAGES:
        path = directory / f"{page}.rst"
        text = render(page, title, module_name, which)
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    generate(Path(__file__).parent / "reference")
