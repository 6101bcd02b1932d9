"""The console's HTML: small server-rendered pages, every value escaped.

No JavaScript and no external resource: one stylesheet from the console itself, and
state diagrams inline as SVG (:meth:`~phronomy.WorkflowDefinition.to_svg`).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from phronomy._cli_commands import event_name
from phronomy._cli_output import iso
from phronomy.storage import (
    InboxEntry,
    InstanceStatus,
    StoredTimer,
    Takeover,
    fired_timer,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from phronomy.agent import ExecutionPage
    from phronomy.storage import SaveLogEntry, ScheduleRecord
    from phronomy.workflow import WorkflowDefinition

    from ._reads import ExecutionView, InstancesPage, InstanceView

from ._html import Forms, badge, field, h, h_block, hidden, link, table

__all__ = [
    "error_page",
    "every",
    "execution_page",
    "executions_page",
    "instance_page",
    "instances_page",
    "message_page",
    "schedules_page",
]


def instances_page(
    page: InstancesPage,
    *,
    status: str | None,
    workflow: str | None,
    limit: int,
    statuses: Sequence[InstanceStatus],
) -> str:
    """The instances list: filters, counts, one page of rows and the next link."""
    counts = page.counts
    by_status = " ".join(
        link("/instances", f"{name}: {n}", status=name, workflow=workflow)
        for name, n in sorted(counts.by_status.items())
    )
    by_workflow = " ".join(
        link("/instances", f"{name or '(none)'}: {n}", workflow=name, status=status)
        for name, n in sorted(counts.by_workflow.items())
    )
    partial = " (the first rows only)" if counts.partial else ""
    options = "".join(
        f'<option value="{h(s)}"{" selected" if s == status else ""}>{h(s)}</option>'
        for s in ("", *statuses)
    )
    rows = [
        (
            link("/instance", r.workflow_instance_id, id=r.workflow_instance_id),
            h(r.workflow),
            badge(r.status),
            str(r.revision),
            h(r.phase or ""),
            h(iso(r.updated_at_ms) or ""),
            h(_lease_cell(r.lease_owner, r.lease_expires_at_ms, page.lease_now_ms)),
        )
        for r in page.records
    ]
    more = ""
    if page.next_after is not None:
        more = (
            "<p>"
            + link(
                "/instances",
                "next page →",
                status=status,
                workflow=workflow,
                after=page.next_after,
                limit=str(limit),
            )
            + "</p>"
        )
    return (
        "<h1>Workflow instances</h1>"
        f'<p class="counts">total {counts.total}{partial} · by status: '
        f"{by_status or '-'}</p>"
        f'<p class="counts">by workflow: {by_workflow or "-"}</p>'
        '<form method="get" action="/instances"><label>status '
        f'<select name="status">{options}</select></label> '
        f'<label>workflow <input name="workflow" value="{h(workflow or "")}"></label> '
        '<button type="submit">Filter</button></form>'
        + (
            table(
                ("ID", "WORKFLOW", "STATUS", "REV", "PHASE", "UPDATED", "LEASE"),
                rows,
                "instances",
            )
            if rows
            else "<p>No instances.</p>"
        )
        + more
    )


def _lease_cell(owner: str | None, expires: int | None, now: int | None) -> str:
    if owner is None:
        return "-"
    live = now is not None and (expires or 0) > now
    return f"{'live' if live else 'expired'} ({owner})"


def instance_page(
    view: InstanceView,
    definition: WorkflowDefinition[Any] | None,
    forms: Forms,
    *,
    flash: str | None = None,
) -> str:
    """One instance: its row, diagram, state, lease, pending work and timeline."""
    r = view.record
    iid = r.workflow_instance_id
    facts = [
        ("workflow", h(r.workflow)),
        ("status", badge(r.status)),
        ("phase", h(r.phase or "")),
        ("revision", str(r.revision)),
        ("definition version", h(r.definition_version or "-")),
        ("updated", h(iso(r.updated_at_ms) or "")),
        ("lease", h(view.lease)),
        ("takeovers in a row", str(r.takeovers)),
    ]
    if r.detail:
        facts.append(("detail", h(r.detail)))
    if r.cancel_requested is not None:
        facts.append(("cancel requested", h(r.cancel_requested or "(no reason)")))
    body = [
        f"<h1>Instance <code>{h(iid)}</code></h1>",
        f'<p class="flash">{h(flash)}</p>' if flash else "",
        table(("", ""), facts, "facts"),
        "<h2>State diagram</h2>",
        _diagram(r.workflow, r.phase, r.definition_version, definition),
        "<h2>State</h2>",
    ]
    if view.snapshot_error:
        body.append(f'<p class="error">{h(view.snapshot_error)}</p>')
    body.append(
        "<p>nothing saved yet</p>"
        if view.fields is None
        else f'<pre class="fields">{h_block(json.dumps(view.fields, indent=2, sort_keys=True))}</pre>'
    )
    body.append(_pending(view.pending) + _timers(view.timers))
    body.append("<h2>History</h2>" + _timeline(view.timeline))
    events = definition.external_events_from(r.phase) if definition and r.phase else ()
    body.append(
        forms.form(
            "/instance/send",
            "Send event",
            hidden("id", iid)
            + field("event", "event", events[0] if events else "")
            + field("payload", "payload (JSON)")
            + field("event_id", "event id (optional)"),
        )
        + (
            forms.form("/instance/retry", "Retry", hidden("id", iid))
            if r.status == "failed" and r.revision > 0  # as instances retry accepts
            else ""
        )
        + forms.form(
            "/instance/cancel",
            "Cancel",
            hidden("id", iid) + field("reason", "reason"),
        )
    )
    return "".join(body)


def _diagram(
    workflow: str,
    phase: str | None,
    version: str,
    definition: WorkflowDefinition[Any] | None,
) -> str:
    if definition is None:
        return (
            f'<p class="note">The definition of workflow {h(workflow)!s} is not '
            "loaded in this console (start it with <code>--app module:attr</code>): "
            "the saved phase and the history below tell where it is.</p>"
        )
    note = ""
    if version and definition.version and version != definition.version:
        note = (
            f'<p class="note">Saved by definition version {h(version)}; the diagram '
            f"is of version {h(definition.version)}.</p>"
        )
    return f'{note}<div class="diagram">{definition.to_svg(highlight=phase)}</div>'


def _pending(pending: dict[str, Any]) -> str:
    entries: list[InboxEntry] = pending["entries"]
    if not entries:
        return "<h2>Pending events</h2><p>none</p>"
    rows = [
        (
            str(e.seq),
            h(event_name(e.event, None)),
            h(e.event_id),
            h(iso(e.stored_at_ms)),
        )
        for e in entries
    ]
    return (
        "<h2>Pending events</h2>"
        + table(("SEQ", "EVENT", "EVENT ID", "STORED"), rows, "pending")
        + f'<p class="note">{h(pending["note"] or "")}</p>'
    )


def _timers(timers: list[dict[str, Any]]) -> str:
    if not timers:
        return "<h2>Timers</h2><p>none armed</p>"
    rows = [
        (
            h(t["name"]),
            h(t["timer_kind"]),
            h(t["event"]),
            h(t["due_at"]),
            str(t["armed_revision"]),
        )
        for t in timers
    ]
    return "<h2>Timers</h2>" + table(
        ("NAME", "KIND", "EVENT", "DUE", "ARMED AT REV"), rows, "timers"
    )


def _timeline(
    items: Sequence[SaveLogEntry | InboxEntry | StoredTimer | Takeover],
) -> str:
    if not items:
        return "<p>none</p>"
    rows: list[tuple[str, ...]] = []
    for item in items:
        if isinstance(item, Takeover):
            rows.append((
                str(item.revision), "takeover", badge(item.status),
                h(f"epoch {item.epoch}"), h(iso(item.taken_at_ms)), h(item.detail or ""),
            ))  # fmt: skip
        elif isinstance(item, StoredTimer):
            rows.append((
                str(item.armed_revision), "timer armed", "armed",
                h(event_name(item.event, item.state)), h(f"due {iso(item.due_at_ms)}"),
                h(item.name),
            ))  # fmt: skip
        elif isinstance(item, InboxEntry):
            kind = "event" if fired_timer(item.event_id) is None else "timer fired"
            rows.append((
                "" if item.revision is None else str(item.revision), f"{kind} {item.seq}",
                badge(item.status), h(event_name(item.event, None)),
                h(iso(item.consumed_at_ms or item.stored_at_ms)), h(item.detail or ""),
            ))  # fmt: skip
        else:
            rows.append((
                str(item.revision), "save", badge(item.status), h(item.phase or ""),
                h(iso(item.committed_at_ms)), h(item.detail or item.definition_version),
            ))  # fmt: skip
    return table(
        ("REV", "KIND", "STATUS", "PHASE/EVENT", "AT", "DETAIL"), rows, "timeline"
    )


def executions_page(page: ExecutionPage, *, status: str | None, limit: int) -> str:
    """The executions list."""
    rows = [
        (
            link("/execution", r.agent_id, agent=r.agent_id),
            badge(r.status),
            "" if r.step is None else str(r.step),
            str(r.steps_completed),
            h(r.plan),
            h(iso(r.updated_at_ms)),
        )
        for r in page.records
    ]
    more = ""
    if page.next_after is not None:
        more = (
            "<p>"
            + link(
                "/executions",
                "next page →",
                status=status,
                after=page.next_after,
                limit=str(limit),
            )
            + "</p>"
        )
    return (
        "<h1>Supervised executions</h1>"
        + (
            table(
                ("AGENT", "STATUS", "STEP", "DONE", "PLAN", "UPDATED"),
                rows,
                "executions",
            )
            if rows
            else "<p>No executions.</p>"
        )
        + more
    )


def execution_page(
    view: ExecutionView, forms: Forms, *, flash: str | None = None
) -> str:
    """One execution: its record, approval, lease and pending answers."""
    r = view.record
    facts = [
        ("execution", h(r.execution_id)),
        ("status", badge(r.status)),
        ("plan", h(r.plan)),
        ("step", h("-" if r.step is None else r.step)),
        ("steps completed", str(r.steps_completed)),
        ("updated", h(iso(r.updated_at_ms))),
        ("lease", h(view.lease)),
        ("error", h(r.error or "-")),
        ("value", f"<pre>{h_block(json.dumps(r.value, indent=2, default=str))}</pre>"),
    ]
    approval = ""
    if r.pending_approval is not None:
        approval = (
            "<h2>Pending approval</h2><pre>"
            + h_block(json.dumps(_builtins(r.pending_approval), indent=2, default=str))
            + "</pre>"
        )
        fields = hidden("agent", r.agent_id) + field("response", "response (JSON)")
        approval += forms.form("/execution/approve", "Approve", fields)
        approval += forms.form("/execution/reject", "Reject", fields)
    return (
        f"<h1>Execution of agent <code>{h(r.agent_id)}</code></h1>"
        + (f'<p class="flash">{h(flash)}</p>' if flash else "")
        + table(("", ""), facts, "facts")
        + approval
        + _pending(view.pending)
        + _timers(view.timers)
    )


def _builtins(value: Any) -> Any:
    import msgspec

    return msgspec.to_builtins(value)


def schedules_page(
    records: list[ScheduleRecord], next_after: str | None, limit: int
) -> str:
    """The schedules list."""
    rows = [
        (
            h(r.schedule_id),
            h(r.workflow),
            h(r.cron or every(r.every_ms)),
            h(r.timezone),
            h(iso(r.next_tick_ms)),
            h(r.overlap),
            "paused" + (f" ({h(r.note)})" if r.note else "") if r.paused else "active",
            str(r.started),
            str(r.skipped),
            link("/instances", "instances", workflow=r.workflow),
        )
        for r in records
    ]
    more = ""
    if next_after is not None:
        more = (
            "<p>"
            + link("/schedules", "next page →", after=next_after, limit=str(limit))
            + "</p>"
        )
    return (
        "<h1>Schedules</h1>"
        + (
            table(
                (
                    "ID",
                    "WORKFLOW",
                    "WHEN",
                    "ZONE",
                    "NEXT",
                    "OVERLAP",
                    "STATE",
                    "STARTED",
                    "SKIPPED",
                    "",
                ),
                rows,
                "schedules",
            )
            if rows
            else "<p>No schedules.</p>"
        )
        + more
    )


def every(ms: int | None) -> str:
    """An interval in words: ``every 1 h``, ``every 1 h 30 min``, ``every 250 ms``."""
    if ms is None:
        return "-"
    parts: list[str] = []
    rest = ms
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000)):
        if rest >= size:
            parts.append(f"{rest // size} {unit}")
            rest %= size
    if rest:
        parts.append(f"{rest / 1000:g} s" if rest >= 1000 else f"{rest} ms")
    return "every " + " ".join(parts or ["0 ms"])


def error_page(status: int, message: str) -> str:
    """The body of an error response."""
    return f'<h1>{status}</h1><p class="error">{h(message)}</p>'


def message_page(title: str, message: str, back: str) -> str:
    """The body of an action's answer."""
    return f'<h1>{h(title)}</h1><p class="flash">{h(message)}</p>{back}'
