"""A Sphinx extension: ``.. workflow-diagram:: examples/NAME.py:build`` draws a
workflow definition's state diagram, at build time, from the definition itself.

The module is imported from its file (relative to the repository root), the callable
(or definition) after the colon gives the :class:`~phronomy.WorkflowDefinition`, and
its :meth:`~phronomy.WorkflowDefinition.to_svg` is written into the HTML page inline:
no network, no image tool. Options: ``:highlight: STATE`` marks a state, ``:caption:``
sets the caption (default: the workflow's name).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any, ClassVar

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.util.docutils import SphinxDirective

ROOT = Path(__file__).parent.parent


def definition(spec: str) -> Any:
    """The definition *spec* (``path/to/module.py:attr``) names."""
    path, _, attr = spec.partition(":")
    file = ROOT / path
    name = f"_docs_diagram_{file.stem}"
    module = sys.modules.get(name)
    if module is None:
        loader = importlib.util.spec_from_file_location(name, file)
        if loader is None or loader.loader is None:
            raise ValueError(f"cannot import {path!r}")
        module = importlib.util.module_from_spec(loader)
        sys.modules[name] = module
        loader.loader.exec_module(module)
    value = getattr(module, attr or "build")
    return value() if callable(value) else value


class WorkflowDiagram(SphinxDirective):
    """``.. workflow-diagram:: examples/tutorial_expenses.py:build``"""

    required_arguments = 1
    option_spec: ClassVar[dict[str, Any]] = {
        "highlight": directives.unchanged,
        "caption": directives.unchanged,
    }

    def run(self) -> list[nodes.Node]:
        spec = self.arguments[0]
        self.env.note_dependency(str(ROOT / spec.partition(":")[0]))
        try:
            flow = definition(spec)
        except Exception as exc:  # noqa: BLE001 - reported as the build's warning
            return [self.state.document.reporter.warning(
                f"workflow-diagram {spec!r}: {exc}", line=self.lineno
            )]  # fmt: skip
        svg = flow.to_svg(highlight=self.options.get("highlight"))
        caption = self.options.get("caption") or f"The workflow {flow.name!r}"
        from html import escape

        html = (
            f'<figure class="workflow-diagram">{svg}'
            f"<figcaption>{escape(caption)}</figcaption></figure>"
        )
        return [nodes.raw("", html, format="html")]


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("workflow-diagram", WorkflowDiagram)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
