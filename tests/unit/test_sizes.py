"""No room of any package outgrows one head: classes under 500 lines, functions under 50.

Every package is held to it (agent, dashboard, simulate, the command line, scripts); the tests
are not (a scenario test reads top to bottom). A function's lines are its whole definition,
nested functions included: a function that defines eight routes is as long to read as eight.
50 lines is a screen: a function that does not fit on one cannot be checked at a glance.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agent", "dashboard", "simulate", "edgegrove", "scripts")
MAX_CLASS_LINES = 500
MAX_FUNCTION_LINES = 50

# Functions over the limit when the check came to every package, with their length then: they
# may only shrink (longer fails; under the limit or gone fails as stale: delete the entry).
KNOWN_LONG: Mapping[str, int] = {
    "scripts/container_fleet_watch.py: function main": 92,
    "simulate/bench/agent.py: function run": 71,
    "simulate/evaluation.py: function render_links": 60,
    "agent/commands/model_export.py: function _module": 56,
    "agent/transport/mqtt.py: function __init__": 52,
}


def sizes(source: str, name: str) -> dict[str, int]:
    """Every class over MAX_CLASS_LINES and function over MAX_FUNCTION_LINES in ``source``:
    "name: kind qualified name" -> lines."""
    found = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        lines = (node.end_lineno or node.lineno) - node.lineno + 1
        if isinstance(node, ast.ClassDef) and lines > MAX_CLASS_LINES:
            found[f"{name}: class {node.name}"] = lines
        if not isinstance(node, ast.ClassDef) and lines > MAX_FUNCTION_LINES:
            found[f"{name}: function {node.name}"] = lines
    return found


def oversized(source: str, name: str) -> list[str]:
    return [f"{where} has {lines} lines" for where, lines in sizes(source, name).items()]


def package_sizes() -> dict[str, int]:
    found: dict[str, int] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found.update(sizes(path.read_text(), path.relative_to(ROOT).as_posix()))
    return found


def _limit(where: str) -> int:
    return MAX_CLASS_LINES if where.split(": ")[1].startswith("class") else MAX_FUNCTION_LINES


def test_no_class_or_function_in_any_package_is_oversized() -> None:
    found = package_sizes()
    grown = [f"{where} has {lines} lines (limit {KNOWN_LONG.get(where, MAX_FUNCTION_LINES)})"
             for where, lines in found.items() if lines > KNOWN_LONG.get(where, _limit(where))]
    assert grown == [], "\n".join(grown)
    stale = sorted(set(KNOWN_LONG) - set(found))
    assert not stale, f"now within {MAX_FUNCTION_LINES} lines or gone, delete from KNOWN_LONG: {stale}"


def test_the_check_finds_an_oversized_function_and_class() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    assert oversized(f"def long():\n{body}\n", "f") == [f"f: function long has {MAX_FUNCTION_LINES + 1} lines"]
    methods = "\n".join(f"    def m{i}(self):\n        return {i}\n" for i in range(MAX_CLASS_LINES // 2))
    assert oversized(f"class Big:\n{methods}", "c")[0].startswith("c: class Big has")
    assert oversized("def short():\n    return 1\n", "s") == []
    nested = "\n".join(f"    def route{i}():\n        return {i}\n" for i in range(MAX_FUNCTION_LINES // 3 + 1))
    assert oversized(f"def routes():\n{nested}", "n")[0].startswith("n: function routes has")
