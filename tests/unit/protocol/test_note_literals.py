"""Note kinds are spelled once, in ``agent.protocol.notes.NoteKind``: no Python source of the
shipped packages spells one as a string where a kind is compared, looked up or made.

A string equal to a ``NoteKind`` value counts when it stands in a kind position:
- compared with a kind (``kind == "silent"``, ``e["kind"] in ("timeout", "nack")``,
  ``e.get("kind") != ...``, or ``e.kind in SYMPTOMS`` with SYMPTOMS a module-level collection
  of strings);
- a key of a module-level mapping looked up by a kind (``ALIASES.get(kind)``, ``NAMES[e.kind]``);
- the value of a ``"kind"`` key in a dict display, of a ``kind=`` keyword, or the first
  argument of ``Note(...)``, ``Draft(...)`` or ``Observation(...)``.
The same word elsewhere (a telemetry field ``"degraded"``, a link state ``"suspected"``, a
bench named ``"silent"``) is not a note kind and is left alone.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.protocol.notes import NoteKind
from dashboard.kinds import EventKind, IncidentKind

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("agent", "dashboard", "edgegrove", "simulate", "scripts")
THE_ENUM = "agent/protocol/notes.py"
NOTE_KINDS = frozenset(k.value for k in NoteKind)
# The dashboard's own kinds, spelled once in dashboard/kinds.py (the simulator's fault kinds,
# the same words as IncidentKind's, are its scenario's: not held here).
DASHBOARD_ENUM = "dashboard/kinds.py"
DASHBOARD_KINDS = frozenset(k.value for enum in (EventKind, IncidentKind) for k in enum)
KIND_MAKERS = {"Note", "Draft", "Observation"}


def _is_kind(node: ast.expr) -> bool:
    """``kind``, ``note_kind``, ``x.kind``, ``x["kind"]``, ``x.get("kind")``."""
    if isinstance(node, ast.Name):
        return node.id == "kind" or node.id.endswith("_kind")
    if isinstance(node, ast.Attribute):
        return node.attr == "kind"
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "kind"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        first = node.args[0] if node.args else None
        return isinstance(first, ast.Constant) and first.value == "kind"
    return False


def _strings(node: ast.AST | None) -> Iterator[ast.Constant]:
    """The string constants of a literal: itself, or the elements (keys) of a collection."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node
    elif isinstance(node, ast.Tuple | ast.List | ast.Set):
        for element in node.elts:
            yield from _strings(element)
    elif isinstance(node, ast.Dict):
        for key in node.keys:
            yield from _strings(key)
    elif isinstance(node, ast.Call) and node.args:  # frozenset({...}), dict(...), tuple([...])
        yield from _strings(node.args[0])


def _module_collections(tree: ast.Module) -> dict[str, ast.expr]:
    found: dict[str, ast.expr] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            found[stmt.targets[0].id] = stmt.value
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value:
            found[stmt.target.id] = stmt.value
    return found


def _literal_or_named(node: ast.expr, named: dict[str, ast.expr]) -> Iterator[ast.Constant]:
    if isinstance(node, ast.Name) and node.id in named:
        yield from _strings(named[node.id])
    else:
        yield from _strings(node)


def _kind_positions(tree: ast.Module) -> Iterator[ast.Constant]:
    named = _module_collections(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_kind(side) for side in sides):
                for side in sides:
                    yield from _literal_or_named(side, named)
        elif isinstance(node, ast.Subscript) and _is_kind(node.slice):
            yield from _literal_or_named(node.value, named)
        elif isinstance(node, ast.Call):
            func = node.func
            if (isinstance(func, ast.Attribute) and func.attr == "get" and node.args
                    and _is_kind(node.args[0])):
                yield from _literal_or_named(func.value, named)
            if isinstance(func, ast.Name) and func.id in KIND_MAKERS and node.args:
                yield from _strings(node.args[0])
            for keyword in node.keywords:
                if keyword.arg == "kind":
                    yield from _strings(keyword.value)
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "kind":
                    yield from _strings(value)


def spelled_note_kinds(source: str, path: str = "<source>", kinds: frozenset[str] = NOTE_KINDS) -> list[str]:
    """``path:line: 'kind'`` for every one of ``kinds`` spelled as a string in a kind position."""
    tree = ast.parse(source, path)
    hits = {(c.lineno, c.value) for c in _kind_positions(tree) if c.value in kinds}
    return [f"{path}:{line}: {value!r}" for line, value in sorted(hits)]


def test_no_shipped_source_spells_a_note_kind() -> None:
    files = [f for package in PACKAGES for f in sorted((ROOT / package).rglob("*.py"))]
    assert len(files) > 50
    hits = []
    for file in files:
        path = file.relative_to(ROOT).as_posix()
        if path != THE_ENUM:
            hits += spelled_note_kinds(file.read_text(), path)
    assert hits == [], "use agent.protocol.notes.NoteKind:\n" + "\n".join(hits)


def test_no_dashboard_source_spells_its_own_kinds() -> None:
    files = sorted((ROOT / "dashboard").rglob("*.py"))
    hits = []
    for file in files:
        path = file.relative_to(ROOT).as_posix()
        if path != DASHBOARD_ENUM:
            hits += spelled_note_kinds(file.read_text(), path, DASHBOARD_KINDS)
    assert hits == [], "use dashboard.kinds.EventKind or IncidentKind:\n" + "\n".join(hits)


def test_a_planted_dashboard_kind_literal_is_found() -> None:
    assert spelled_note_kinds('drafts.append(Draft("view_change", 0, None, 3, ""))\n', kinds=DASHBOARD_KINDS)
    assert spelled_note_kinds('if incident.kind == "link":\n    pass\n', kinds=DASHBOARD_KINDS)


# ---------------------------------------------------------------- the check can say no


@pytest.mark.parametrize("source", [
    'if note.kind == "silent":\n    pass\n',
    'stale = [n for n in notes if n.kind in ("timeout", "nack")]\n',
    'hits = sum(1 for e in events if e["kind"] == "reroute")\n',
    'bad = event.get("kind") != "degraded"\n',
    'SYMPTOMS = frozenset({"timeout", "crash"})\ndef f(e):\n    return e.kind in SYMPTOMS\n',
    'ALIASES = {"fault_injected": "control_applied"}\ndef f(kind):\n    return ALIASES.get(kind, kind)\n',
    'NAMES: dict[str, str] = {"pull": "a pull"}\ndef f(e):\n    return NAMES[e.kind]\n',
    'events.append({"kind": "timeout", "peer": 3})\n',
    'record(kind="link_dead", peer=2)\n',
    'drafts.append(Draft("rejoin", node, None, 3, ""))\n',
    'notes.append(Note("escalate", 4, "up"))\n',
])
def test_a_planted_note_kind_literal_is_found(source: str) -> None:
    assert spelled_note_kinds(source) != []


@pytest.mark.parametrize("source", [
    'if note.kind == NoteKind.SILENT:\n    pass\n',
    'degraded = [t for t in tels if t.get("degraded")]\n',  # a telemetry field
    'BAD = frozenset({"failed", "suspected"})\ndef f(link):\n    return link.state in BAD\n',
    'doc = document("silent", rounds=3)\n',  # a bench's name
    'if fault.kind in ("link", "crash"):\n    pass\n',  # fault kinds are not note kinds
    'events.append({"kind": "view_change"})\n',  # a dashboard event of its own
    'row = {"timeout": 0.5, "nodes": 7}\n',
])
def test_the_same_words_elsewhere_pass(source: str) -> None:
    assert spelled_note_kinds(source) == []
