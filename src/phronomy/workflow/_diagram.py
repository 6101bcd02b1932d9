"""An offline SVG drawing of a workflow definition's state diagram.

Pure Python, no network and no layout engine: the states are put in ranks (rows) by a
breadth-first walk from the initial state, ordered in each rank once by the mean
position of their predecessors, and drawn as rounded boxes; transitions go downwards
as curves, back (to an earlier or the same rank) around the right-hand side, and a
state's transitions to itself as a loop. Wait states are drawn dashed and amber, the
end (:data:`~phronomy.FINISH`) as a ringed dot, the current state (``highlight``)
thick and pink with ``class="current"``. Every name is escaped; characters XML cannot
carry are replaced by U+FFFD.
"""

from __future__ import annotations

import re
from collections import deque
from html import escape
from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:
    from collections.abc import Sequence, Set as AbstractSet

__all__ = ["Drawable", "render_svg"]

START = "[*]"
FINISH = "__end__"  # phronomy.FINISH (this module imports no other: no cycle)
SCHEDULED = "__scheduled__"  # the phase of an instance stored to start later


class _Transition(Protocol):
    @property
    def source(self) -> str: ...
    @property
    def target(self) -> str: ...
    @property
    def label(self) -> str: ...


class Drawable(Protocol):
    """What a diagram is drawn from (a :class:`~phronomy.WorkflowDefinition`)."""

    @property
    def name(self) -> str: ...
    @property
    def entry_point(self) -> str: ...
    @property
    def states(self) -> Sequence[str]: ...
    @property
    def wait_states(self) -> AbstractSet[str]: ...
    @property
    def transitions(self) -> Sequence[_Transition]: ...


_FONT = 13
_LABEL_FONT = 11
_CHAR = 7.4  # an estimate of a character's width at _FONT (sans-serif)
_LABEL_CHAR = 6.4
_BOX_H = 36
_ROW = 96
_GAP = 44
_MARGIN = 24
_LANE = 22
_BOLD = ' font-weight="bold"'
_XML_INVALID = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")

_STYLE = {
    "state": 'fill="#eef3fb" stroke="#3b6ea8" stroke-width="1.5"',
    "wait": 'fill="#fff3cd" stroke="#b58900" stroke-width="1.5" stroke-dasharray="5 3"',
    "current": 'fill="#fbd9e8" stroke="#c2185b" stroke-width="3.5"',
}


def _text(value: str) -> str:
    """*value* escaped for XML text and attributes."""
    return escape(_XML_INVALID.sub("\ufffd", value), quote=True)


class _Node(NamedTuple):
    name: str
    kind: str  # start, end, state, wait
    x: float  # centre
    y: float  # centre
    w: float
    h: float


def _ranks(definition: Drawable) -> dict[str, int]:
    """Each node's rank: the start 0, then breadth-first along transitions; states no
    walk reaches go below, the end last."""
    ranks = {START: 0, definition.entry_point: 1}
    queue = deque([definition.entry_point])
    outgoing: dict[str, list[str]] = {}
    for t in definition.transitions:
        outgoing.setdefault(t.source, []).append(t.target)
    while queue:
        name = queue.popleft()
        for target in outgoing.get(name, ()):
            if target != FINISH and target not in ranks:
                ranks[target] = ranks[name] + 1
                queue.append(target)
    deepest = max(ranks.values())
    for name in (*definition.states, *sorted(definition.wait_states)):
        if name not in ranks:
            deepest += 1
            ranks[name] = deepest
    if any(t.target == FINISH for t in definition.transitions):
        ranks[FINISH] = deepest + 1
    return ranks


def _layout(definition: Drawable) -> dict[str, _Node]:
    ranks = _ranks(definition)
    rows: dict[int, list[str]] = {}
    for name, rank in ranks.items():  # insertion order: breadth-first discovery
        rows.setdefault(rank, []).append(name)
    preds: dict[str, list[str]] = {}
    for t in definition.transitions:
        if ranks.get(t.source, 0) < ranks.get(t.target, 0):
            preds.setdefault(t.target, []).append(t.source)
    preds.setdefault(definition.entry_point, []).append(START)

    def size(name: str) -> tuple[float, float]:
        if name in (START, FINISH):
            return 22.0, 22.0
        return max(84.0, len(name) * _CHAR + 28), float(_BOX_H)

    order: dict[str, float] = {}
    widths: dict[int, float] = {}
    for rank in sorted(rows):
        names = rows[rank]
        if rank > 0:  # one barycentre pass: predecessors' mean position
            names.sort(
                key=lambda n: (
                    sum(order.get(p, 0.0) for p in preds.get(n, [])) / len(preds[n])
                    if preds.get(n)
                    else float("inf")
                )
            )
        x = 0.0
        for name in names:
            w, _ = size(name)
            order[name] = x + w / 2
            x += w + _GAP
        widths[rank] = x - _GAP
    widest = max(widths.values())
    nodes: dict[str, _Node] = {}
    for rank, names in rows.items():
        shift = _MARGIN + (widest - widths[rank]) / 2
        for name in names:
            w, h = size(name)
            kind = "state"
            if name == START:
                kind = "start"
            elif name == FINISH:
                kind = "end"
            elif name in definition.wait_states:
                kind = "wait"
            y = _MARGIN + rank * _ROW + _BOX_H / 2
            nodes[name] = _Node(name, kind, order[name] + shift, y, w, h)
    return nodes


def _label(x: float, y: float, lines: list[str], anchor: str = "middle") -> list[str]:
    """Edge labels stacked at (*x*, *y*), each on a white backing."""
    out: list[str] = []
    top = y - (len(lines) - 1) * (_LABEL_FONT + 2) / 2
    for i, line in enumerate(lines):
        w = len(line) * _LABEL_CHAR + 6
        ly = top + i * (_LABEL_FONT + 2)
        left = {"middle": x - w / 2, "start": x - 3}.get(anchor, x - w + 3)
        out.append(
            f'<rect x="{left:.1f}" y="{ly - _LABEL_FONT + 2:.1f}" width="{w:.1f}" '
            f'height="{_LABEL_FONT + 2}" fill="#ffffff" fill-opacity="0.85"/>'
            f'<text class="label" x="{x:.1f}" y="{ly + 2:.1f}" '
            f'text-anchor="{anchor}" font-size="{_LABEL_FONT}">{_text(line)}</text>'
        )
    return out


def render_svg(
    definition: Drawable,
    *,
    highlight: str | None = None,
    title: str | None = None,
) -> str:
    """The definition's state diagram as a standalone SVG document (text).

    Args:
        definition: the workflow definition to draw.
        highlight: a state to mark as the current one (an instance's phase;
            :data:`~phronomy.FINISH` marks the end, ``__scheduled__`` the start);
            ``None`` or a name the definition does not declare marks nothing.
        title: the SVG's ``<title>`` (default: the workflow's name).

    Returns:
        The SVG text (UTF-8, no external references).
    """
    nodes = _layout(definition)
    if highlight == SCHEDULED:
        highlight = START
    groups: dict[tuple[str, str], list[str]] = {}
    for t in definition.transitions:
        groups.setdefault((t.source, t.target), []).append(t.label or "")
    groups = {(START, definition.entry_point): [], **groups}
    right = max(n.x + n.w / 2 for n in nodes.values())
    bottom = max(n.y + n.h / 2 for n in nodes.values())
    edges: list[str] = []
    extent = right
    lane = 0
    out_ports: dict[str, int] = {}
    in_ports: dict[str, int] = {}
    forward = [(s, t) for s, t in groups if nodes[t].y - nodes[s].y == _ROW]
    fan_out = {s: sum(1 for f, _ in forward if f == s) for s, _ in forward}
    fan_in = {t: sum(1 for _, f in forward if f == t) for _, t in forward}
    for (source, target), labels in groups.items():
        a, b = nodes[source], nodes[target]
        lines = [label for label in labels if label]
        if source == target:  # a loop on the right-hand side
            x0, y0 = a.x + a.w / 2, a.y - 8
            path = (
                f"M{x0:.1f},{y0:.1f} C{x0 + 40:.1f},{y0 - 22:.1f} "
                f"{x0 + 40:.1f},{y0 + 38:.1f} {x0:.1f},{y0 + 16:.1f}"
            )
            lx, ly, anchor = x0 + 42, a.y, "start"
        elif b.y - a.y == _ROW:  # down one rank, spread over the boxes' edges
            i = out_ports.get(source, 0)
            out_ports[source] = i + 1
            j = in_ports.get(target, 0)
            in_ports[target] = j + 1
            sx = a.x + (i + 1 - (fan_out[source] + 1) / 2) * min(18, a.w / 4)
            tx = b.x + (j + 1 - (fan_in[target] + 1) / 2) * min(18, b.w / 4)
            sy, ty = a.y + a.h / 2, b.y - b.h / 2 - 2
            mid = (sy + ty) / 2
            path = f"M{sx:.1f},{sy:.1f} C{sx:.1f},{mid:.1f} {tx:.1f},{mid:.1f} {tx:.1f},{ty:.1f}"
            lx, ly, anchor = (sx + tx) / 2, mid + 4, "middle"
        elif a.y == b.y:  # sideways, in one rank
            step = 1 if b.x > a.x else -1
            sx, tx = a.x + step * a.w / 2, b.x - step * (b.w / 2 + 2)
            path = f"M{sx:.1f},{a.y:.1f} L{tx:.1f},{b.y:.1f}"
            lx, ly, anchor = (sx + tx) / 2, a.y - a.h / 2 - 5, "middle"
        else:  # back, or down several ranks: around the right of everything
            lane += 1
            x = right + lane * _LANE
            sx, tx = a.x + a.w / 2, b.x + b.w / 2 + 2
            path = (
                f"M{sx:.1f},{a.y:.1f} C{x:.1f},{a.y:.1f} {x:.1f},{a.y:.1f} "
                f"{x:.1f},{(a.y + b.y) / 2:.1f} S{x:.1f},{b.y:.1f} {tx:.1f},{b.y:.1f}"
            )
            lx, ly, anchor = x + 4, (a.y + b.y) / 2, "start"
        dashed = (
            ' stroke-dasharray="4 3"'
            if any(label.startswith("after ") for label in labels)
            else ""
        )
        edges.append(
            f'<g class="transition" data-source="{_text(source)}" '
            f'data-target="{_text(target)}"><path d="{path}" fill="none" '
            f'stroke="#555" stroke-width="1.3"{dashed} marker-end="url(#arrow)"/>'
            + "".join(_label(lx, ly, lines, anchor))
            + "</g>"
        )
        if lines and anchor == "start":
            extent = max(extent, lx + max(len(s) for s in lines) * _LABEL_CHAR + 8)
    boxes = [_node(n, current=n.name == highlight) for n in nodes.values()]
    width = extent + _MARGIN + lane * 2
    height = bottom + _MARGIN
    name = _text(title if title is not None else definition.name)
    return (
        '<svg xmlns="http://www.w3.org/2000/svg" '
        f'width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-label="{name}" '
        'font-family="DejaVu Sans, Verdana, sans-serif">'
        f"<title>{name}</title>"
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" '
        'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
        '<path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker></defs>'
        + "".join(edges)
        + "".join(boxes)
        + "</svg>\n"
    )


def _node(n: _Node, *, current: bool) -> str:
    cls = f"state {n.kind}" + (" current" if current else "")
    head = f'<g class="{cls}" data-state="{_text(n.name)}">'
    if current:
        head += "<title>current state</title>"
    if n.kind in ("start", "end"):
        fill = "#c2185b" if current else "#333"
        ring = (
            f'<circle cx="{n.x:.1f}" cy="{n.y:.1f}" r="11" fill="#fff" '
            f'stroke="{fill}" stroke-width="{3 if current else 1.5}"/>'
            if n.kind == "end"
            else ""
        )
        return (
            f'{head}{ring}<circle cx="{n.x:.1f}" cy="{n.y:.1f}" '
            f'r="{6 if n.kind == "end" else 8}" fill="{fill}"/></g>'
        )
    style = _STYLE["current" if current else n.kind]
    return (
        f'{head}<rect x="{n.x - n.w / 2:.1f}" y="{n.y - n.h / 2:.1f}" '
        f'width="{n.w:.1f}" height="{n.h:.1f}" rx="10" ry="10" {style}/>'
        f'<text x="{n.x:.1f}" y="{n.y + 4.5:.1f}" text-anchor="middle" '
        f'font-size="{_FONT}"{_BOLD if current else ""}>'
        f"{_text(n.name)}</text></g>"
    )
