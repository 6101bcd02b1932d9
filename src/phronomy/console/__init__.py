"""The web console: an ASGI app over a store, served on trio by hypercorn.

``python -m phronomy console --db PATH_OR_DSN`` (the ``phronomy[console]`` extra
installs hypercorn). Read-only unless started with ``--allow-actions`` and a token
(``--token-file``, ``PHRONOMY_CONSOLE_TOKEN`` or ``--token``).
"""

from ._app import ConsoleApp as ConsoleApp
from ._serve import (
    load_definitions as load_definitions,
    open_console_store as open_console_store,
    serve_console as serve_console,
)

__all__ = ["ConsoleApp", "load_definitions", "open_console_store", "serve_console"]

from phronomy._metadata import fixup_module_metadata

fixup_module_metadata(__name__, globals())
del fixup_module_metadata
