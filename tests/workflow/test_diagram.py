"""The offline SVG state diagram: valid XML, every state and label, the highlight,
escaping."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import msgspec
import pytest

import phronomy
from phronomy.workflow import FINISH

SVG = "{http://www.w3.org/2000/svg}"


class Doc(phronomy.State):
    n: int = 0


def _flow() -> phronomy.WorkflowDefinition[Doc]:
    wf = phronomy.Workflow(Doc, name="docs <&> flow")
    wf.state("draft")
    wf.wait_state("review")
    wf.state("publish")
    wf.transition("draft", "review")
    wf.transition("review", "publish", on="approve", guard=lambda d, e: True)
    wf.transition("review", "draft", on="reject")
    wf.transition("review", "review", on="comment")
    wf.transition("review", FINISH, after=2 * 86400)
    wf.transition("publish", FINISH)
    return wf.build()


def _groups(svg: str) -> dict[str, ET.Element]:
    root = ET.fromstring(svg)
    return {
        g.attrib["data-state"]: g
        for g in root.iter(f"{SVG}g")
        if "data-state" in g.attrib
    }


def _texts(svg: str) -> list[str]:
    return [t.text or "" for t in ET.fromstring(svg).iter(f"{SVG}text")]


def test_every_state_and_transition_label_is_drawn() -> None:
    flow = _flow()
    svg = flow.to_svg()
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    states = _groups(svg)
    assert set(states) == {"[*]", "draft", "review", "publish", FINISH}
    texts = _texts(svg)
    for t in flow.transitions:
        if t.label:
            assert t.label in texts, t.label
    assert {"approve [guard]", "reject", "comment", "after 2d"} <= set(texts)
    assert "wait" in states["review"].attrib["class"].split()
    assert "end" in states[FINISH].attrib["class"].split()
    transitions = [g for g in root.iter(f"{SVG}g") if g.get("class") == "transition"]
    # one edge per (source, target) pair, plus the initial one
    assert len(transitions) == len({(t.source, t.target) for t in flow.transitions}) + 1
    assert "http" not in svg.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_the_current_state_is_highlighted() -> None:
    flow = _flow()
    plain = _groups(flow.to_svg())
    assert not any("current" in g.attrib["class"] for g in plain.values())
    marked = _groups(flow.to_svg(highlight="review"))
    current = [n for n, g in marked.items() if "current" in g.attrib["class"].split()]
    assert current == ["review"]
    ended = _groups(flow.to_svg(highlight=FINISH))
    assert "current" in ended[FINISH].attrib["class"]
    unknown = _groups(flow.to_svg(highlight="no such state"))
    assert not any("current" in g.attrib["class"] for g in unknown.values())


def test_hostile_names_are_escaped() -> None:
    # the builder refuses such state names; the renderer escapes whatever it is
    # given all the same (a definition is a plain struct, a phase comes from a row)
    hostile = '<script>alert("x")</script>&\u0001'
    flow = _flow()
    t = flow.transitions[1]
    forged = msgspec.structs.replace(
        flow,
        name=f"{hostile} flow",
        states=(*flow.states, hostile),
        transitions=(
            *flow.transitions,
            msgspec.structs.replace(
                t, source="publish", target=hostile, event='go"<b>'
            ),
        ),
    )
    svg = forged.to_svg(highlight=hostile)
    assert "<script>" not in svg
    assert "<b>" not in svg
    root = ET.fromstring(svg)  # a raw control character would make it unparseable
    names = _groups(svg)
    assert hostile.replace("\u0001", "\ufffd") in names
    assert 'go"<b> [guard]' in _texts(svg)
    title = root.find(f"{SVG}title")
    assert title is not None
    assert title.text == hostile.replace("\u0001", "\ufffd") + " flow"
    assert "<script>" not in flow.to_svg(highlight=hostile)


def test_unreachable_states_are_drawn_below() -> None:
    wf = phronomy.Workflow(Doc, name="islands")
    wf.state("a")
    wf.state("island")
    wf.transition("a", FINISH)
    wf.transition("island", FINISH, on="leave")
    with pytest.warns(phronomy.DefinitionWarning, match="unreachable"):
        flow = wf.build()
    svg = flow.to_svg()
    names = _groups(svg)
    assert {"a", "island", FINISH} <= set(names)


def test_the_renderer_knows_the_reserved_phases() -> None:
    from phronomy.workflow import _definition, _diagram

    assert (_diagram.FINISH, _diagram.SCHEDULED) == (FINISH, _definition.SCHEDULED)
