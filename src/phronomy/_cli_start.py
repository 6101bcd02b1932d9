"""``python -m phronomy instances start``: start an instance of a workflow defined in
the user's code.

phronomy has no durable start request: an instance's first state comes from its
definition (the state class, the entry point, the actions), which lives in the
application's code, not in the store. So the command imports the definition
(``module:attribute``, as ``python -c "import module"`` would from the current
directory), opens a short-lived runtime on the store (no recovery sweep, no inbox
poll: it serves nobody else's instances) and runs the first segment here, exactly as
``runtime.workflows.invoke(definition, input, workflow_instance_id=ID)`` would; it
returns once the instance halted or finished. Its actions and effects run in this
process.
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import TYPE_CHECKING, Any

import trio

from phronomy._cli_output import iso, row_table, safe
from phronomy.errors import InvalidInputError
from phronomy.storage import validate_instance_id
from phronomy.workflow._definition import WorkflowDefinition

if TYPE_CHECKING:
    import argparse

    from phronomy._cli_store import CliStore
    from phronomy.storage import StoredRecord

__all__ = ["load_definition", "start"]


def load_definition(spec: str) -> WorkflowDefinition[Any]:
    """The workflow definition *spec* (``package.module:attribute``) names.

    Raises:
        InvalidInputError: *spec* is malformed, its module cannot be imported, or the
            attribute is missing or not a compiled workflow definition.
    """
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name or not attribute:
        raise InvalidInputError(
            f"WORKFLOW {spec!r} must name a definition in your code as "
            "module:attribute (orders.flows:order_flow)"
        )
    if "" not in sys.path:  # like `python -c`: modules of the current directory
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - whatever the import raised, said in one line
        raise InvalidInputError(
            f"cannot import module {module_name!r} of WORKFLOW {spec!r}: "
            f"{type(exc).__name__}: {exc}"
        ) from None
    found: object = module
    for part in attribute.split("."):
        found = getattr(found, part, None)
    if not isinstance(found, WorkflowDefinition):
        raise InvalidInputError(
            f"{spec!r} is not a compiled workflow definition (got "
            f"{type(found).__name__}); name the result of Workflow(...).build()"
        )
    return found


def start(store: CliStore, args: argparse.Namespace) -> int:
    """``instances start``: run the first segment of a new instance here."""
    definition = load_definition(args.workflow)
    iid = validate_instance_id(args.id, workflow=definition.name)
    try:
        given = {} if args.input is None else json.loads(args.input)
    except json.JSONDecodeError as exc:
        raise InvalidInputError(f"--input is not JSON: {exc}") from None
    if not isinstance(given, dict):
        raise InvalidInputError(
            f"--input must be a JSON object of the state's fields, got "
            f"{type(given).__name__}"
        )
    result, row = trio.run(_invoke, store, definition, iid, given)
    if args.json:
        print(
            json.dumps(
                {
                    "id": iid,
                    "workflow": definition.name,
                    "status": result.status,
                    "phase": result.phase,
                    "revision": result.revision,
                    "updated_at": None if row is None else iso(row.updated_at_ms),
                },
                sort_keys=True,
            )
        )
        return 0
    row_table(row)
    print(
        f"{safe(iid)}: started ({result.status} at revision {result.revision}, phase "
        f"{safe(result.phase)})"
    )
    return 0


async def _invoke(
    store: CliStore,
    definition: WorkflowDefinition[Any],
    iid: str,
    given: dict[str, Any],
) -> tuple[Any, StoredRecord | None]:
    from phronomy.runtime import open_runtime  # the runtime only when starting

    async with open_runtime(
        store=store, sweep_interval=0, inbox_poll_interval=0
    ) as runtime:
        result = await runtime.workflows.invoke(
            definition, given, workflow_instance_id=iid
        )
        # read before the runtime closes the store (a reopened one would migrate)
        return result, await trio.to_thread.run_sync(store.load, iid)
