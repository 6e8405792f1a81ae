"""The core package's boundaries, read from its source with ast: it never reaches the runtime
or the command line's options, and its modules import each other without a loop, not even
one closed behind ``TYPE_CHECKING`` (an import anywhere in a file counts)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CORE = ROOT / "agent" / "core"


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports, anywhere in it (relative imports resolved)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = _module(path) if path.name == "__init__.py" else _module(path).rpartition(".")[0]
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            out |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return out


def graph(paths: list[Path]) -> dict[str, set[str]]:
    modules = {_module(p): p for p in paths}
    return {name: imported(path) & set(modules) - {name} for name, path in modules.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each module that lies on one (depth-first search)."""
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                found.append([*path[path.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    return found


def test_the_core_reaches_neither_the_runtime_nor_the_command_lines_options() -> None:
    banned = ("agent.config", "agent.runtime", "agent.runtime_config", "agent.cli", "agent.commands")
    found = [f"{p.relative_to(ROOT)} imports {m}" for p in sorted(CORE.rglob("*.py")) for m in imported(p)
             if any(m == b or m.startswith(b + ".") for b in banned)]
    assert found == []


def test_the_core_and_the_protocol_have_no_import_loop() -> None:
    paths = sorted(CORE.rglob("*.py")) + sorted((ROOT / "agent" / "protocol").rglob("*.py"))
    assert len(paths) > 40
    assert cycles(graph(paths)) == []


def test_the_check_finds_a_loop_closed_behind_type_checking(tmp_path: Path) -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    source = tmp_path / "x.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from agent.core import AgentCore\n")
    assert "agent.core.AgentCore" in imported(source)
