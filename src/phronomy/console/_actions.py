"""The console's actions: blocking writes through the command line's write paths.

An event goes into the instance's durable inbox (as ``instances send``), a
cancellation is the cancelled revision of an instance nobody runs (as ``instances
cancel``: :func:`~phronomy._cli_commands.write_cancellation`) or a request to the
runtime that holds it (as ``executions cancel``), an approval's answer goes into the
execution's inbox (as ``executions approve|reject``), and a failed instance is
retried as ``instances retry`` does (:func:`phronomy._cli_operate.retry_failed`).
Each checks its input before it writes anything.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import msgspec

from phronomy._cli_commands import ask_cancel, write_cancellation
from phronomy._cli_operate import retry_failed
from phronomy._cli_output import safe
from phronomy.agent._records import agent_key, answer_posting, execution_record
from phronomy.durability import kind_of
from phronomy.engine import random_uuid
from phronomy.errors import InstanceStateError, InvalidInputError, NotFoundError
from phronomy.storage import (
    MAX_LIMIT,
    InboxOp,
    Posting,
    PostOp,
    lease_now_ms,
    validate_event_id,
)
from phronomy.workflow._inbox import encode_payload

from ._html import clip

if TYPE_CHECKING:
    from collections.abc import Mapping

    from phronomy.storage import BaseStore, StoredRecord
    from phronomy.workflow import WorkflowDefinition

__all__ = ["answer", "cancel", "parse_json", "retry", "send"]


def parse_json(text: str | None, what: str) -> Any:
    """*text* as a JSON value (empty: ``None``).

    Raises:
        InvalidInputError: it is not JSON (the message names *what*).
    """
    if text is None or not text.strip():
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInputError(f"{what} is not JSON: {exc}") from None
    except RecursionError:
        raise InvalidInputError(f"{what} is not JSON: nested too deeply") from None


def _workflow_row(store: BaseStore[Any], iid: str) -> StoredRecord:
    record: StoredRecord | None = store.load(iid)
    if record is None:
        raise NotFoundError(f"workflow instance {clip(iid)!r} does not exist")
    if kind_of(record) == "execution":
        raise InvalidInputError(f"{iid!r} is a supervised execution's record")
    return record


def send(
    store: BaseStore[Any],
    iid: str,
    *,
    event: str,
    payload: str | None,
    event_id: str | None,
    key: str | None = None,
    definitions: Mapping[str, WorkflowDefinition[Any]] | None = None,
) -> str:
    """Store *event* in *iid*'s inbox; returns what happened, in words.

    *key* (the form's idempotency key) is the event id when *event_id* is not given:
    a form submitted twice stores one event. With the definition of *iid*'s workflow
    in *definitions*, an event it does not declare is refused.

    Raises:
        NotFoundError: no such instance.
        InvalidInputError: an empty event name, an event the loaded definition does
            not declare, a payload that is not JSON, a bad or reused event id.
        InstanceStateError: the instance accepts no events.
    """
    record = _workflow_row(store, iid)
    if not event:
        raise InvalidInputError("the event's name must not be empty")
    definition = (definitions or {}).get(record.workflow)
    if definition is not None and not definition.has_event(event):
        raise InvalidInputError(
            f"workflow {record.workflow!r} declares no event {safe(event)[:100]!r} "
            f"(its events: {', '.join(definition.external_events) or 'none'}); "
            "nothing was stored"
        )
    value = parse_json(payload, "the payload")
    key = event_id or key or random_uuid()
    posting = Posting(
        workflow_instance_id=iid,
        event_id=validate_event_id(key),
        event=event,
        payload=encode_payload(value, event=event, instance=iid),
    )
    posted = store.run(PostOp(posting=posting))
    entry = posted.entry
    if posted.outcome == "mismatch":
        raise InvalidInputError(
            f"event id {key[:100]!r} of {iid!r} names another event (an event id "
            "names one event; a form already submitted: reload the page); nothing "
            "was stored"
        )
    if posted.outcome in ("closed", "missing") or entry is None:
        row = posted.row or record
        raise InstanceStateError(
            f"{iid!r} is {row.status} (revision {row.revision}): it accepts no "
            "events; nothing was stored",
            instance_id=iid,
        )
    what = (
        f"already stored ({entry.status})"
        if posted.outcome == "duplicate"
        else "stored"
    )
    unchecked = (
        ""
        if definition is not None
        else f" (not checked: the console has no definition of {record.workflow!r})"
    )
    return (
        f"event {safe(entry.event)!r} {what} as seq {entry.seq} (event id "
        f"{entry.event_id}){unchecked}"
    )


def cancel(store: BaseStore[Any], iid: str, *, reason: str | None) -> str:
    """Cancel *iid*: its cancelled revision if no runtime holds it, else ask the
    runtime holding its lease (it cancels at its next heartbeat).

    Raises:
        NotFoundError: no such instance.
        InstanceStateError: it is finished, or cannot be cancelled as it is.
    """
    record = _workflow_row(store, iid)
    for _ in range(3):  # it may stop running, and be claimed again, meanwhile
        if record.status != "running" or record.lease_owner is None:
            break
        if ask_cancel(store, iid, reason=reason):
            now, expiry = lease_now_ms(store), record.lease_expires_at_ms
            if now is None or (expiry is not None and expiry <= now):
                return (
                    "cancellation requested: its lease has expired (its runtime "
                    "stopped), so the runtime whose sweep takes it over cancels it"
                )
            return "cancellation asked of the runtime that runs it"
        record = _workflow_row(store, iid)
    if not write_cancellation(store, record, reason=reason):  # type: ignore[arg-type]
        return "already cancelled"
    saved = store.load(iid)
    return f"cancelled at revision {saved.revision if saved else '?'}"


def retry(store: BaseStore[Any], iid: str) -> str:
    """Retry the failed *iid* from its last saved revision, as ``instances retry``
    (:func:`~phronomy._cli_operate.retry_failed`).

    Raises:
        NotFoundError: no such instance.
        InvalidInputError: *iid* is a supervised execution's record.
        InstanceStateError: it is not failed, failed before its first save, or
            changed meanwhile (nothing was written).
    """
    record = _workflow_row(store, iid)
    event = retry_failed(store, record, by="an operator (console)")
    what = f"event {safe(event)!r} stored again" if event else "its pending events"
    return (
        f"retried: halted at revision {record.revision}; {what}: a runtime serving "
        f"workflow {safe(record.workflow)!r} applies it"
    )


def answer(
    store: BaseStore[Any],
    agent_id: str,
    *,
    approve: bool,
    response: str | None,
    key: str | None = None,
) -> str:
    """Answer the approval *agent_id*'s execution waits for, through its inbox.

    *key* (the form's idempotency key) is the answer's event id: a form submitted
    twice stores one answer.

    Raises:
        NotFoundError: the agent has no execution.
        InvalidInputError: *response* is not JSON, or *key* is not an event id.
        InstanceStateError: the execution waits for no approval, or an answer to
            it is already pending.
    """
    row: StoredRecord | None = store.load(agent_key(agent_id))
    if row is None:
        raise NotFoundError(f"agent {clip(agent_id)!r} has no execution record")
    record = execution_record(row)
    if record.status != "suspended" or record.pending_approval is None:
        raise InstanceStateError(
            f"agent {agent_id!r}'s execution is {record.status}, not waiting for an "
            "approval; nothing was stored",
            instance_id=agent_key(agent_id),
        )
    value = parse_json(response, "the response")
    posting = answer_posting(
        agent_id, record.execution_id, approve=approve, response=value
    )
    if key:
        posting = msgspec.structs.replace(posting, event_id=validate_event_id(key))
    pending = [
        e
        for e in store.run(
            InboxOp(workflow_instance_id=agent_key(agent_id), limit=MAX_LIMIT)
        )
        if e.event in ("approve", "reject")
    ]
    if any(e.event_id == posting.event_id for e in pending):
        return f"{posting.event} already stored for execution {record.execution_id}"
    if pending:
        raise InstanceStateError(
            f"agent {agent_id!r}'s execution already has an answer pending "
            f"({pending[0].event}); nothing was stored",
            instance_id=agent_key(agent_id),
        )
    posted = store.run(PostOp(posting=posting))
    if posted.outcome != "stored":
        raise InstanceStateError(
            f"agent {agent_id!r}'s execution took no answer ({posted.outcome})"
        )
    return f"{posting.event} stored for execution {record.execution_id}"
