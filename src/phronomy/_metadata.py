"""Make public objects report the module users import them from (as trio does).

Tracebacks, reprs, pickles and the API docs then say ``phronomy.ConflictError`` or
``phronomy.storage.StoredRecord`` instead of ``phronomy.errors.ConflictError`` or
``phronomy.storage._records.StoredRecord``.
"""

from __future__ import annotations

import inspect
import typing
from typing import Any

import msgspec

__all__ = ["fixup_module_metadata"]


def fixup_module_metadata(module_name: str, namespace: dict[str, Any]) -> None:
    """Set ``__module__`` of every class and function named in ``namespace["__all__"]``.

    A msgspec Struct's string annotations are resolved first, in the module that
    defines it: msgspec resolves them (lazily, also for each generic
    parametrization such as ``WorkflowResult[Order]``) in the namespace of the
    class's ``__module__``, which the public module does not reproduce.
    """
    for name in namespace.get("__all__", ()):
        obj = namespace[name]
        if not (isinstance(obj, type) or callable(obj)):
            continue
        current = getattr(obj, "__module__", "") or ""
        private = any(part.startswith("_") for part in current.split("."))
        if not current.startswith("phronomy") or (
            not private and len(current) < len(module_name)
        ):
            continue  # not ours, or already a more specific public module
        if isinstance(obj, type) and issubclass(obj, msgspec.Struct):
            own = inspect.get_annotations(obj)  # its own fields, unevaluated
            hints = typing.get_type_hints(obj, include_extras=True)
            obj.__annotations__ = {field: hints[field] for field in own}
        try:
            obj.__module__ = module_name
        except (AttributeError, TypeError):  # builtins and slotted callables
            continue
