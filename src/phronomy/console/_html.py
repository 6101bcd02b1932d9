"""The console's HTML building blocks: the stylesheet, the page layout, escaping,
links, tables and the action forms (which carry the session's CSRF token)."""

from __future__ import annotations

import html
import uuid
from typing import TYPE_CHECKING
from urllib.parse import urlencode

from phronomy._cli_output import safe

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

__all__ = [
    "CSS",
    "Forms",
    "badge",
    "clip",
    "field",
    "h",
    "h_block",
    "hidden",
    "layout",
    "link",
    "table",
]

CSS = """
body{font-family:system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#263238;color:#fff;padding:.6em 1.2em;display:flex;gap:1.5em;
align-items:baseline}
header a{color:#cfe3ff;text-decoration:none}header strong{font-size:1.15em}
header .mode{margin-left:auto;font-size:.85em;color:#ffcc80}
main{padding:1em 1.5em}h1{font-size:1.35em}h2{font-size:1.1em;margin-top:1.6em}
table{border-collapse:collapse;background:#fff;font-size:.9em}
th,td{border:1px solid #ddd;padding:.3em .6em;text-align:left;vertical-align:top}
th{background:#eceff1}td.num{text-align:right}
.badge{display:inline-block;padding:0 .5em;border-radius:.8em;background:#e0e0e0}
.running{background:#bbdefb}.halted,.suspended,.pending{background:#fff3cd}.completed{background:#c8e6c9}
.finished{background:#c8e6c9}.failed,.recovery_required{background:#ffcdd2}.cancelled{background:#e0e0e0}
.counts a{margin-right:1em}.note{color:#555}.error{color:#b71c1c}
.flash{background:#e8f5e9;border:1px solid #a5d6a7;padding:.6em}
.diagram{background:#fff;border:1px solid #ddd;display:inline-block;padding:.5em}
pre{background:#fff;border:1px solid #ddd;padding:.6em;overflow:auto}
form.action{background:#fff;border:1px solid #ddd;padding:.6em;margin:.6em 0;
display:flex;gap:.6em;flex-wrap:wrap;align-items:end}
form.action label{display:flex;flex-direction:column;font-size:.85em}
"""


def clip(value: object, most: int = 200) -> str:
    """*value* as text of at most *most* characters (longer: cut, marked by …)."""
    text = str(value)
    return text if len(text) <= most else text[:most] + "…"


def h(value: object) -> str:
    """*value* as HTML text: control characters shown escaped, markup escaped."""
    return html.escape(safe(value), quote=True)


def link(path: str, text: object, **query: str | None) -> str:
    """A link to *path* with *query* (``None`` values left out)."""
    params = {k: v for k, v in query.items() if v is not None}
    href = path + ("?" + urlencode(params) if params else "")
    return f'<a href="{html.escape(href, quote=True)}">{h(text)}</a>'


def badge(status: str) -> str:
    """A status as a coloured badge."""
    return f'<span class="badge {h(status)}">{h(status)}</span>'


def table(header: Sequence[str], rows: Iterable[Sequence[str]], cls: str = "") -> str:
    """A table of *rows* (cells are HTML already)."""
    head = "".join(f"<th>{h(c)}</th>" for c in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows
    )
    thead = f"<thead><tr>{head}</tr></thead>" if any(header) else ""
    return f'<table class="{cls}">{thead}<tbody>{body}</tbody></table>'


def layout(title: str, body: str, *, actions: bool) -> str:
    """A whole page."""
    mode = "actions enabled" if actions else "read-only"
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{h(title)} · phronomy console</title>"
        '<link rel="stylesheet" href="/console.css"></head><body>'
        "<header><strong>phronomy console</strong>"
        '<a href="/instances">Instances</a><a href="/executions">Executions</a>'
        f'<a href="/schedules">Schedules</a><span class="mode">{mode}</span></header>'
        f"<main>{body}</main></body></html>"
    )


class Forms:
    """The hidden fields every action form carries (the session's CSRF token)."""

    def __init__(self, csrf: str | None) -> None:
        self.csrf = csrf

    def form(self, action: str, title: str, fields: str) -> str:
        """An action form posting to *action* (``None`` CSRF: actions are off)."""
        if self.csrf is None:
            return ""
        return (
            f'<form class="action" method="post" action="{h(action)}">'
            f"<strong>{h(title)}</strong>{fields}"
            f'<input type="hidden" name="csrf" value="{h(self.csrf)}">'
            f'<input type="hidden" name="key" value="{uuid.uuid4()}">'
            '<label>token<input type="password" name="token" autocomplete="off">'
            f'</label><button type="submit">{h(title)}</button></form>'
        )


def field(name: str, label: str, value: str = "", kind: str = "text") -> str:
    return (
        f'<label>{h(label)}<input type="{kind}" name="{h(name)}" value="{h(value)}">'
        "</label>"
    )


def hidden(name: str, value: str) -> str:
    return f'<input type="hidden" name="{h(name)}" value="{h(value)}">'


def h_block(text: str) -> str:
    """Multi-line text for a ``<pre>``: escaped, newlines kept."""
    return "\n".join(h(line) for line in text.split("\n"))
