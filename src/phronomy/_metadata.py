"""Make public objects report the module users import them from (as trio does).

Tracebacks, reprs, pickles and the API docs then say ``phronomy.ConflictError`` instead
of ``phronomy.errors.ConflictError`` or ``phronomy.engine._handle.ResultHandle``.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["fixup_module_metadata"]


def fixup_module_metadata(module_name: str, namespace: dict[str, Any]) -> None:
    """Set ``__module__`` of every class and function named in ``namespace["__all__"]``.

    msgspec Structs keep their defining module: msgspec resolves their (string)
    annotations in that module's namespace.
    """
    for name in namespace.get("__all__", ()):
        obj = namespace[name]
        if isinstance(obj, type) and issubclass(obj, msgspec.Struct):
            continue
        if isinstance(obj, type) or callable(obj):
            current = getattr(obj, "__module__", "") or ""
            if current.startswith("phronomy") and len(current) >= len(module_name):
                try:
                    obj.__module__ = module_name
                except (AttributeError, TypeError):  # builtins and slotted callables
                    continue
