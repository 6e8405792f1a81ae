"""No room in the device package outgrows one head: classes under 500 lines, functions under 60."""

from __future__ import annotations

import ast
from pathlib import Path

AGENT = Path(__file__).resolve().parents[2] / "agent"
MAX_CLASS_LINES = 500
MAX_FUNCTION_LINES = 60


def oversized(source: str, name: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        lines = (node.end_lineno or node.lineno) - node.lineno + 1 if hasattr(node, "lineno") else 0
        if isinstance(node, ast.ClassDef) and lines > MAX_CLASS_LINES:
            found.append(f"{name}: class {node.name} has {lines} lines")
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and lines > MAX_FUNCTION_LINES:
            found.append(f"{name}: function {node.name} has {lines} lines")
    return found


def test_no_class_or_function_in_agent_is_oversized() -> None:
    found = [f for path in sorted(AGENT.rglob("*.py")) for f in oversized(path.read_text(), str(path))]
    assert not found, "\n".join(found)


def test_the_check_finds_an_oversized_function_and_class() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    assert oversized(f"def long():\n{body}\n", "f") == [f"f: function long has {MAX_FUNCTION_LINES + 1} lines"]
    methods = "\n".join(f"    def m{i}(self):\n        return {i}\n" for i in range(MAX_CLASS_LINES // 2))
    assert oversized(f"class Big:\n{methods}", "c")[0].startswith("c: class Big has")
    assert oversized("def short():\n    return 1\n", "s") == []
