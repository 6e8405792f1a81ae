"""The layering rules of the design, held against every Python file of the repository with ast.

Each rule is a "never": files matching ``importer`` never import a module under any of
``forbidden``. An import is an ``import``/``from ... import`` statement anywhere in the file (a
lazy one inside a function too, relative ones resolved) or a module named as a string where
the command line imports it lazily: ``Command("module", ...)`` and ``import_module("module")``.
``RULES`` are the design's layering of the device package; ``PACKAGE_RULES`` what each package
may know of the others. Import loops are held apart: none at all, and none closed behind
``TYPE_CHECKING`` but the known ones.
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
    # Modules under ``forbidden`` that may be imported all the same (fnmatch patterns; their
    # submodules too, and the packages above them: ``from agent import protocol``).
    allowed: tuple[str, ...] = ()

    def applies_to(self, path: str) -> bool:
        return (any(fnmatch.fnmatch(path, p) for p in self.importers)
                and not any(fnmatch.fnmatch(path, p) for p in self.exempt))

    def forbids(self, module: str) -> bool:
        return (any(_under(module, f) for f in self.forbidden)
                and not any(_under(module, a) or _under(a, module) for a in self.allowed))


def _under(module: str, pattern: str) -> bool:
    """``module`` is ``pattern`` or inside it (``agent.core_*`` takes in agent.core_steps.x)."""
    parts = module.split(".")
    return any(fnmatch.fnmatch(".".join(parts[:i]), pattern) for i in range(1, len(parts) + 1))


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

# The rules over every package: what each may know of the others. The device (all of agent/,
# the jobs and the device service included) runs no web stack; the dashboard knows the agent
# only by its protocol (messages, topics, notes, the tree) and the jobs' wire; the core only itself and the
# protocol; nothing but the command line and the tests import the command line or the tests.
WEB_STACK = ("fastapi", "uvicorn", "starlette")
CORE = ("agent/core.py", "agent/core_*.py", "agent/core/*")
PACKAGE_RULES = (
    Rule("the device runs no web stack", ("agent/*",), WEB_STACK),
    Rule("the dashboard knows the agent only by its protocol and the jobs' wire (topics, documents, "
         "states, envelopes: the devices and jobs views), and no command line above it",
         ("dashboard/*",), ("agent", "edgegrove"),
         allowed=("agent.protocol", "agent.jobs.topics", "agent.jobs.document", "agent.jobs.states",
                  "agent.jobs.envelope")),
    Rule("the core knows of the agent only itself and the protocol", CORE, ("agent",),
         allowed=("agent.core", "agent.core_*", "agent.protocol")),
    Rule("the protocol stands on nothing of the agent but itself", ("agent/protocol/*",), ("agent",),
         allowed=("agent.protocol",)),
    Rule("the transport knows of the agent only itself and the protocol's wire", ("agent/transport/*",),
         ("agent",), allowed=("agent.transport", "agent.protocol")),
    Rule("nothing imports the command line but the command line and the tests", ("*",), ("edgegrove",),
         exempt=("edgegrove/*", "tests/*")),
    Rule("nothing imports the tests but the tests", ("*",), ("tests",), exempt=("tests/*",)),
)

# Known exceptions to the rules, as (path, module): none since the core became a package with
# state_fetch, state_server and suspicion inside it and a config of its own.
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
        rules = [r for r in (*RULES, *PACKAGE_RULES) if r.applies_to(path)]
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


# ---------------------------------------------------------------- import loops
#
# No module imports one that imports it back, however far round: not at the top, not lazily in a
# function, not behind ``if TYPE_CHECKING:`` (a loop a type checker still walks, and the sign
# that two modules are one). A TYPE_CHECKING import that closes a loop is counted apart: such
# loops are allowed below, each by its import, and may only go.

PACKAGES = ("agent/", "dashboard/", "simulate/", "edgegrove/", "scripts/")

# TYPE_CHECKING imports that close a loop, as (path, module): none (the core's nine-module loop
# went with the package).
KNOWN_TYPE_CHECKING_LOOPS: frozenset[tuple[str, str]] = frozenset()


@dataclass(frozen=True)
class Edge:
    path: str
    line: int
    importer: str
    module: str
    type_checking: bool

    def __str__(self) -> str:
        how = "under TYPE_CHECKING " if self.type_checking else ""
        return f"{self.path}:{self.line} imports {self.module} {how}and {self.module} imports {self.importer} back"


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_statements(node: ast.AST, type_checking: bool = False
                       ) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement under ``node``, and whether it runs only for a type checker."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child, type_checking
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for statement in child.body:
                yield from _import_statements(ast.Module([statement], []), True)
            for statement in child.orelse:
                yield from _import_statements(ast.Module([statement], []), type_checking)
        else:
            yield from _import_statements(child, type_checking)


def import_edges(sources: Mapping[str, str]) -> list[Edge]:
    """Each import of one module of ``sources`` by another (``from a import b`` imports the
    module a.b if there is one, else a)."""
    modules = {_module_of(path)[0] for path in sources}
    edges = []
    for path, source in sorted(sources.items()):
        importer = _module_of(path)[0]
        for node, type_checking in _import_statements(ast.parse(source, path)):
            if isinstance(node, ast.Import):
                targets = {a.name for a in node.names}
            else:
                base = _resolve(node, path)
                targets = {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
            edges += [Edge(path, node.lineno, importer, t, type_checking)
                      for t in sorted(targets & modules - {importer})]
    return edges


def loops(edges: list[Edge]) -> list[Edge]:
    """Every import of ``edges`` that closes a loop: its module imports the importer back, at
    any depth."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.importer, set()).add(edge.module)

    def reaches(start: str, goal: str) -> bool:
        seen, todo = {start}, [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt == goal:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return False

    return [e for e in edges if reaches(e.module, e.importer)]


def runtime_loops(sources: Mapping[str, str]) -> list[Edge]:
    """Imports that close a loop of imports that run (at the top of a module or in a function)."""
    return loops([e for e in import_edges(sources) if not e.type_checking])


def type_checking_loops(sources: Mapping[str, str]) -> list[Edge]:
    """TYPE_CHECKING imports that close a loop: their module imports the importer back."""
    return [e for e in loops(import_edges(sources)) if e.type_checking]


def package_sources() -> dict[str, str]:
    return {p: s for p, s in repository_sources().items() if p.startswith(PACKAGES)}


# ---------------------------------------------------------------- the repository


def test_the_repository_keeps_the_layering() -> None:
    sources = repository_sources()
    assert {"agent/core/agent_core.py", "agent/protocol/ft_tree.py", "edgegrove/cli.py"} <= set(sources)
    found = violations(sources)
    broken = [str(v) for v in found if (v.path, v.module) not in KNOWN_VIOLATIONS]
    assert broken == [], "\n".join(broken)
    stale = KNOWN_VIOLATIONS - {(v.path, v.module) for v in found}
    assert not stale, f"no longer violated, delete from KNOWN_VIOLATIONS: {sorted(stale)}"


def test_no_import_loop_at_all() -> None:
    found = runtime_loops(package_sources())
    assert found == [], "\n".join(map(str, found))


def test_no_loop_closed_by_type_checking_but_the_known_ones() -> None:
    found = type_checking_loops(package_sources())
    loose = [str(e) for e in found if (e.path, e.module) not in KNOWN_TYPE_CHECKING_LOOPS]
    assert loose == [], "\n".join(loose)
    stale = KNOWN_TYPE_CHECKING_LOOPS - {(e.path, e.module) for e in found}
    assert not stale, f"no longer closing a loop, delete from KNOWN_TYPE_CHECKING_LOOPS: {sorted(stale)}"


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


# ---------------------------------------------------------------- the rules over every package


@pytest.mark.parametrize(("path", "source", "module"), [
    ("agent/jobs/runner.py", "import fastapi\n", "fastapi"),
    ("agent/device/service.py", "from uvicorn import Server\n", "uvicorn"),
    ("agent/device/service.py", "from simulate.fleet import Fleet\n", "simulate.fleet"),
    ("agent/jobs/submit.py", "def f():\n    import dashboard.app\n", "dashboard.app"),
    ("dashboard/state.py", "from agent.runtime import AgentRuntime\n", "agent.runtime"),
    ("dashboard/app.py", "from agent import runtime\n", "agent.runtime"),
    ("dashboard/cli.py", "from edgegrove.cli import main\n", "edgegrove.cli"),
    ("agent/core.py", "from agent.suspicion import SuspicionBook\n", "agent.suspicion"),
    ("agent/core/progress.py", "from agent.config import AgentConfig\n", "agent.config"),
    ("agent/core_steps.py", "from agent.jobs import Job\n", "agent.jobs"),
    ("agent/protocol/membership.py", "from agent.core_config import CoreConfig\n", "agent.core_config"),
    ("agent/transport/mqtt.py", "from agent.core import AgentCore\n", "agent.core"),
    ("simulate/cli.py", "from edgegrove import cli\n", "edgegrove"),
    ("agent/runtime.py", "from tests.unit.test_core import make_core\n", "tests.unit.test_core"),
])
def test_a_planted_violation_of_a_package_rule_is_found(path: str, source: str, module: str) -> None:
    assert module in {v.module for v in violations({path: source})}


@pytest.mark.parametrize(("path", "source"), [
    ("dashboard/state.py", "from agent.protocol.membership import view_tree\nfrom agent import protocol\n"),
    ("agent/core/progress.py", "from agent.core.events import Tick\nfrom agent.protocol.notes import NoteKind\n"),
    ("agent/core_steps.py", "from agent.core_actions import Send\nfrom agent.core import CoreConfig\n"),
    ("agent/transport/memory.py", "from agent.protocol.wire import Frame\nfrom .base import Transport\n"),
    ("agent/config.py", "from pydantic import BaseModel\n"),  # a validation library, not a web stack
    ("edgegrove/__main__.py", "from edgegrove.cli import main\n"),
    ("tests/unit/x.py", "from tests.unit.test_layering import violations\n"),
])
def test_what_the_package_rules_allow_passes(path: str, source: str) -> None:
    assert violations({path: source}) == []


LOOP = {
    "agent/core.py": "from agent.core_steps import RoundSteps\n",
    "agent/core_steps.py": "from agent.core_report import report\n",
    "agent/core_report.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from agent.core import AgentCore\n",
}


def test_a_loop_closed_by_type_checking_is_found_however_far_round() -> None:
    found = type_checking_loops(LOOP)
    assert [(e.path, e.module, e.line) for e in found] == [("agent/core_report.py", "agent.core", 3)]
    assert runtime_loops(LOOP) == []


def test_a_loop_of_runtime_imports_is_found_lazy_ones_too() -> None:
    sources = {
        "simulate/report.py": "def write():\n    from simulate import plots\n",
        "simulate/plots.py": "import typing\nif typing.TYPE_CHECKING:\n    pass\nelse:\n    from simulate.report import Row\n",
    }
    assert {(e.path, e.module) for e in runtime_loops(sources)} == {
        ("simulate/report.py", "simulate.plots"), ("simulate/plots.py", "simulate.report")}
    assert type_checking_loops(sources) == []


def test_a_type_checking_import_that_closes_no_loop_passes() -> None:
    sources = dict(LOOP, **{"agent/core_steps.py": "x = 1\n"})
    assert type_checking_loops(sources) == [] and runtime_loops(sources) == []
