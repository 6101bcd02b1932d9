"""Sphinx configuration (built with ``nox -s docs``; warnings are errors)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _reference import generate

generate(Path(__file__).parent / "reference")

project = "phronomy"
copyright = "2026, the phronomy developers"
extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
    "sphinxcontrib_trio",
    "_diagrams",  # .. workflow-diagram:: (SVG state diagrams drawn at build time)
]
html_theme = "furo"
html_title = "phronomy"
html_static_path = ["_static"]
autodoc_typehints = "description"
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
nitpicky = True
# These machines reach only package registries: no intersphinx inventories are fetched,
# so references into other projects' docs are not resolved.
intersphinx_mapping: dict[str, tuple[str, str | None]] = {}
nitpick_ignore_regex = [
    # other projects' objects (no intersphinx inventories here)
    (
        r"py:.*",
        r"(trio|msgspec|outcome|functools|collections|typing|typing_extensions|contextlib|types|threading|sqlite3|psycopg|os|enum|datetime)\..*",
    ),
    (
        r"py:class",
        r"(Callable|Awaitable|Sequence|Mapping|Iterable|AsyncGenerator|AsyncIterator|Iterator|Self|Any|Literal|ClassVar|PathLike|Path|timedelta|datetime)",
    ),
    # type variables and type aliases
    (r"py:(class|obj)", r"(phronomy\.[\w.]+\.)?(S|T|U|R|I|O|C|T_co)"),
    # private helper types that appear in signatures, and public classes reached
    # through their private module (generic bases shown by show-inheritance)
    (r"py:(class|obj)", r"phronomy\.\w+\._\w+\.\w+(\[.*\])?"),
    (r"py:(class|obj)", r"(phronomy\.[\w.]+\.)?_\w+"),
    (
        r"py:(class|obj)",
        r"(phronomy\.[\w.]+\.)?(HandleStatus|InstanceStatus|LifecycleState|DispatcherStatus|TerminalType|SessionLifecycle|SegmentStatus|SessionOutcome|ExecutionStatus|RecordStatus|Plan|StoreOp|OnFull|Step|Decision|Next|Intent|Action|Command|RecordKind)",
    ),
    # runtime-internal classes that appear in signatures
    (
        r"py:class",
        r"(phronomy\.[\w.]+\.)?(WorkflowSession|WorkflowCoordinator|WorkflowInstances?|Instances?|Sessions|DurabilityService|ExecutionTable|Driver|MachineStep|Session|TerminalPolicy|EventSink|Caller|_Controls)",
    ),
]
