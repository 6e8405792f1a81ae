"""The layering rules of the design, held against every Python file of the repository with ast.

Each rule is a "never": files matching ``importer`` never import a module under any of
``forbidden``. An import is an ``import``/``from ... import`` statement anywhere in the file (a
lazy one inside a function too, relative ones resolved) or a module named as a string where
the command line imports it lazily: ``Command("module", ...)`` and ``import_module("module")``.
"""

from __future__ import annotations

import ast
import fnmatch
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SKIPPED_DIRS = {".git", ".venv", "build", "dist", "__pycache__", "node_modules"}


@dataclass(frozen=True)
class Rule:
    name: str
    importers: tuple[str, ...]  # fnmatch patterns of repository-relative paths
    forbidden: tuple[str, ...]  # module names; their submodules are forbidden too
    exempt: tuple[str, ...] = ()  # patterns of paths the rule does not apply to

    def applies_to(self, path: str) -> bool:
        return (any(fnmatch.fnmatch(path, p) for p in self.importers)
                and not any(fnmatch.fnmatch(path, p) for p in self.exempt))

    def forbids(self, module: str) -> bool:
        return any(module == f or module.startswith(f + ".") for f in self.forbidden)


SANS_IO = ("agent.transport", "agent.model", "agent.clock", "paho", "socket", "threading", "time")

RULES = (
    Rule("the device installs neither the simulator nor the dashboard, and knows no command line "
         "above its own", ("agent/*",), ("simulate", "dashboard", "edgegrove")),
    Rule("the core and the protocol are sans-IO", ("agent/core/*", "agent/protocol/*"), SANS_IO),
    Rule("the transport knows neither the runtime nor the clock", ("agent/transport/*",),
         ("agent.runtime", "agent.clock")),
    Rule("the model knows no transport", ("agent/model/*",), ("agent.transport",)),
    Rule("nothing imports the simulator but the simulator, the command line and the tests",
         ("*",), ("simulate",), exempt=("simulate/*", "edgegrove/*", "tests/*")),
)

# Known exceptions to the rules: none.
KNOWN_VIOLATIONS: frozenset[tuple[str, str]] = frozenset()


@dataclass(frozen=True)
class Violation:
    path: str
    line: int
    module: str
    rule: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line} imports {self.module}: {self.rule}"


def _module_of(path: str) -> tuple[str, bool]:
    """``agent/protocol/ft_tree.py`` -> ("agent.protocol.ft_tree", False); a package's
    ``__init__.py`` -> (its package, True)."""
    parts = path.removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _resolve(node: ast.ImportFrom, path: str) -> str:
    if node.level == 0:
        return node.module or ""
    module, is_package = _module_of(path)
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join([*base, node.module] if node.module else base)


_LAZY_CALLS = {"Command", "import_module", "__import__"}


def _called_name(node: ast.Call) -> str | None:
    if isinstance(node.func, ast.Name):
        return node.func.id
    if isinstance(node.func, ast.Attribute):
        return node.func.attr
    return None


def imports(source: str, path: str) -> Iterator[tuple[int, tuple[str, ...]]]:
    """Every import of the file at ``path``: its line and the modules it may import (``from
    agent import clock`` imports agent, or agent.clock if that is a module)."""
    for node in ast.walk(ast.parse(source, path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, (alias.name,)
        elif isinstance(node, ast.ImportFrom):
            module = _resolve(node, path)
            names = tuple(f"{module}.{a.name}" if module else a.name for a in node.names)
            yield node.lineno, (module, *names) if module else names
        elif (isinstance(node, ast.Call) and _called_name(node) in _LAZY_CALLS and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            yield node.lineno, (node.args[0].value,)


def violations(sources: Mapping[str, str]) -> list[Violation]:
    """The rules each file of ``sources`` (repository-relative path -> text) breaks: one
    violation per import and rule, naming the first forbidden module of the import."""
    found = []
    for path, source in sorted(sources.items()):
        rules = [r for r in RULES if r.applies_to(path)]
        for line, candidates in imports(source, path) if rules else ():
            for rule in rules:
                module = next((m for m in candidates if rule.forbids(m)), None)
                if module is not None:
                    found.append(Violation(path, line, module, rule.name))
    return found


def repository_sources() -> dict[str, str]:
    sources = {}
    for file in ROOT.rglob("*.py"):
        relative = file.relative_to(ROOT)
        if not SKIPPED_DIRS & set(relative.parts):
            sources[relative.as_posix()] = file.read_text()
    return sources


# ---------------------------------------------------------------- the repository


def test_the_repository_keeps_the_layering() -> None:
    sources = repository_sources()
    assert {"agent/core/agent_core.py", "agent/protocol/ft_tree.py", "edgegrove/cli.py"} <= set(sources)
    found = violations(sources)
    broken = [str(v) for v in found if (v.path, v.module) not in KNOWN_VIOLATIONS]
    assert broken == [], "\n".join(broken)
    stale = KNOWN_VIOLATIONS - {(v.path, v.module) for v in found}
    assert not stale, f"no longer violated, delete from KNOWN_VIOLATIONS: {sorted(stale)}"


# ---------------------------------------------------------------- the check can say no


@pytest.mark.parametrize(("path", "source", "module"), [
    ("agent/runtime.py", "import simulate.cli\n", "simulate.cli"),
    ("agent/commands/x.py", "def f():\n    from dashboard import app\n", "dashboard"),
    ("agent/cli.py", 'T = {"simulate": Command("simulate.cli", "run a fleet")}\n', "simulate.cli"),
    ("agent/cli.py", "import importlib\nimportlib.import_module('edgegrove.cli')\n", "edgegrove.cli"),
    ("agent/core/agent_core.py", "import time\n", "time"),
    ("agent/core/agent_core.py", "from agent.transport.base import SENDING\n", "agent.transport.base"),
    ("agent/core/rounds.py", "import threading\n", "threading"),
    ("agent/core/state_fetch.py", "import time\n", "time"),
    ("agent/core/suspicion.py", "from agent.clock import MonotonicClock\n", "agent.clock"),
    ("agent/core/phases.py", "from agent.model.optim import scheduled_lr\n", "agent.model.optim"),
    ("agent/protocol/ft_tree.py", "from agent import clock\n", "agent.clock"),
    ("agent/protocol/ft_tree.py", "from ..transport import mqtt\n", "agent.transport"),
    ("agent/protocol/wire.py", "from socket import socket\n", "socket"),
    ("agent/protocol/x.py", "import paho.mqtt.client as mqtt\n", "paho.mqtt.client"),
    ("agent/transport/mqtt.py", "from agent.runtime import AgentRuntime\n", "agent.runtime"),
    ("agent/transport/mqtt.py", "from ..clock import MonotonicClock\n", "agent.clock"),
    ("agent/model/data.py", "import agent.transport.memory\n", "agent.transport.memory"),
    ("dashboard/app.py", "from simulate.report import summary\n", "simulate.report"),
    ("scripts/watch.py", "import simulate\n", "simulate"),
])
def test_a_planted_violation_is_found(path: str, source: str, module: str) -> None:
    found = violations({path: source})
    assert module in {v.module for v in found}, found
    assert all(v.path == path for v in found)


@pytest.mark.parametrize(("path", "source"), [
    ("simulate/cli.py", "import dashboard.cli\nfrom agent.runtime import run_agent\n"),
    ("edgegrove/cli.py", 'import simulate\nC = Command("dashboard.cli", "x")\n'),
    ("tests/unit/x.py", "from simulate.faults import FaultyTransport\n"),
    ("agent/runtime.py", "import threading\nimport time\nfrom agent.clock import Clock\n"),
    ("agent/core/agent_core.py", "import timeit\nfrom agent.protocol.notes import NoteKind\n"),  # not `time`
    ("agent/protocol/wire.py", "from . import notes\nfrom .topics import Topics\n"),
    ("agent/transport/mqtt.py", "import paho.mqtt.client\nimport socket\n"),
    ("dashboard/state.py", "from agent.protocol.messages import Status\n"),
])
def test_what_the_rules_allow_passes(path: str, source: str) -> None:
    assert violations({path: source}) == []


def test_relative_imports_resolve_from_the_files_package() -> None:
    assert list(imports("from .notes import NoteKind\n", "agent/protocol/wire.py")) == [
        (1, ("agent.protocol.notes", "agent.protocol.notes.NoteKind"))]
    assert list(imports("from .. import clock, model\n", "agent/protocol/__init__.py")) == [
        (1, ("agent", "agent.clock", "agent.model"))]
