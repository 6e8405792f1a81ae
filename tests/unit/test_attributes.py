"""Every attribute has one owner, and no class holds more state than one head can follow.

Held with ast against every package. An attribute is *declared* by a class that annotates it in
its body (``phase: Phase``, a dataclass field) or assigns it through ``self`` in a method
(``self.phase = ...``, ``self.count += 1``). Plain class-body assignments (constants, enum
members, overridden class variables) are not state and are not counted. A Protocol declares an
interface, not state: it owns nothing.

- One owner: in one inheritance chain (a class and every class it inherits from in the
  repository), no attribute is declared by two classes. A mixin that re-declares its host's
  attributes to reach them is two classes sharing one object's state: each half can break the
  other's invariants unseen.
- State per class: a class assigns at most ``MAX_STATE_ATTRIBUTES`` attributes through ``self``
  (a record's fields are not counted: a frozen config of 50 options is flat, not tangled).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import pytest

from tests.unit.test_layering import _module_of, _resolve, repository_sources

PACKAGES = ("agent/", "dashboard/", "simulate/", "edgegrove/", "scripts/")
MAX_STATE_ATTRIBUTES = 24

# Classes that share attributes with a class they inherit from, as (subclass, base): none since
# the core became a package (AgentCore no longer inherits the RoundSteps mixin).
KNOWN_SHARED: frozenset[tuple[str, str]] = frozenset()
# Classes over MAX_STATE_ATTRIBUTES, with their count when this check came: they may only
# shrink (a count above it fails; an entry under the limit or gone fails as stale: delete it).
KNOWN_CROWDED: Mapping[str, int] = {
    "agent.transport.mqtt.MqttTransport": 32,
}


@dataclass
class ClassInfo:
    qualname: str  # module.Name
    path: str
    line: int
    bases: list[str]  # dotted names as written, imports resolved
    declared: dict[str, int] = field(default_factory=dict)  # attribute -> line
    state: set[str] = field(default_factory=set)  # attributes assigned through self
    protocol: bool = False


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Subscript):  # Generic[T], Base[int]
        return _dotted(node.value)
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return f"{head}.{node.attr}" if head else None
    return None


def _symbols(tree: ast.Module, path: str) -> dict[str, str]:
    """The module's top-level names bound by imports -> the dotted name they stand for."""
    names: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            module = _resolve(node, path)
            for alias in node.names:
                names[alias.asname or alias.name] = f"{module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0])
    return names


def _self_targets(method: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[tuple[str, int]]:
    for node in ast.walk(method):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        for target in targets:
            for part in ast.walk(target):
                if (isinstance(part, ast.Attribute) and isinstance(part.value, ast.Name)
                        and part.value.id == "self" and isinstance(part.ctx, ast.Store)):
                    yield part.attr, part.lineno


def _is_class_variable(annotation: ast.expr) -> bool:
    """``ClassVar[...]``: a constant of the class (a subclass may override it), not state."""
    name = _dotted(annotation)
    return name is not None and name.split(".")[-1] == "ClassVar"


def _class_info(node: ast.ClassDef, module: str, path: str, symbols: Mapping[str, str]) -> ClassInfo:
    bases = []
    for base in node.bases:
        name = _dotted(base)
        if name is not None:
            head, _, rest = name.partition(".")
            resolved = symbols.get(head, f"{module}.{head}")
            bases.append(f"{resolved}.{rest}" if rest else resolved)
    info = ClassInfo(f"{module}.{node.name}", path, node.lineno, bases,
                     protocol=any(b.split(".")[-1] == "Protocol" for b in bases))
    for statement in node.body:
        if (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                and not _is_class_variable(statement.annotation)):
            info.declared.setdefault(statement.target.id, statement.lineno)
        elif isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
            for name, line in _self_targets(statement):
                info.declared.setdefault(name, line)
                info.state.add(name)
    return info


def classes(sources: Mapping[str, str]) -> dict[str, ClassInfo]:
    """Every top-level class of ``sources`` (repository-relative path -> text), by module.Name."""
    found: dict[str, ClassInfo] = {}
    for path, source in sorted(sources.items()):
        tree = ast.parse(source, path)
        module = _module_of(path)[0]
        symbols = _symbols(tree, path)
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                info = _class_info(node, module, path, symbols)
                found[info.qualname] = info
    # A name re-exported by a package's __init__ stands for the class it imports.
    aliases = {f"{_module_of(p)[0]}.{name}": target for p, s in sources.items()
               for name, target in _symbols(ast.parse(s, p), p).items()}
    for info in found.values():
        info.bases = [_follow(b, found, aliases) for b in info.bases]
    return found


def _follow(name: str, found: Mapping[str, ClassInfo], aliases: Mapping[str, str]) -> str:
    for _ in range(8):
        if name in found or name not in aliases:
            return name
        name = aliases[name]
    return name


def ancestors(info: ClassInfo, found: Mapping[str, ClassInfo]) -> list[ClassInfo]:
    """The classes of the repository ``info`` inherits from, nearest first, each once."""
    seen: dict[str, ClassInfo] = {}
    todo = list(info.bases)
    while todo:
        base = found.get(todo.pop(0))
        if base is not None and base.qualname not in seen and base.qualname != info.qualname:
            seen[base.qualname] = base
            todo.extend(base.bases)
    return list(seen.values())


@dataclass(frozen=True)
class SharedState:
    subclass: ClassInfo
    base: ClassInfo
    attributes: tuple[str, ...]

    def __str__(self) -> str:
        return (f"{self.subclass.path}:{self.subclass.line} {self.subclass.qualname} and "
                f"{self.base.path}:{self.base.line} {self.base.qualname} both declare "
                f"{len(self.attributes)} attributes: {', '.join(self.attributes)}")


def shared_state(sources: Mapping[str, str]) -> list[SharedState]:
    """Each pair of classes in one chain that declare the same attributes (a class and any
    class it inherits from; two mixins of one class meet in it)."""
    found = classes(sources)
    pairs: dict[tuple[str, str], SharedState] = {}
    for info in found.values():
        chain = [c for c in (info, *ancestors(info, found)) if not c.protocol]
        for i, lower in enumerate(chain):
            for upper in chain[i + 1:]:
                common = tuple(sorted(set(lower.declared) & set(upper.declared)))
                if common and (lower.qualname, upper.qualname) not in pairs:
                    pairs[(lower.qualname, upper.qualname)] = SharedState(lower, upper, common)
    return sorted(pairs.values(), key=str)


def crowded(sources: Mapping[str, str]) -> dict[str, int]:
    """Classes assigning more than MAX_STATE_ATTRIBUTES attributes through self, with the count."""
    return {q: len(c.state) for q, c in sorted(classes(sources).items())
            if len(c.state) > MAX_STATE_ATTRIBUTES}


def package_sources() -> dict[str, str]:
    return {p: s for p, s in repository_sources().items() if p.startswith(PACKAGES)}


# ---------------------------------------------------------------- the repository


def test_every_attribute_has_one_owner() -> None:
    sources = package_sources()
    assert {"agent/core/agent_core.py", "dashboard/app.py", "simulate/cli.py"} <= set(sources)
    found = shared_state(sources)
    broken = [str(s) for s in found if (s.subclass.qualname, s.base.qualname) not in KNOWN_SHARED]
    assert broken == [], "\n".join(broken)
    stale = KNOWN_SHARED - {(s.subclass.qualname, s.base.qualname) for s in found}
    assert not stale, f"no longer sharing state, delete from KNOWN_SHARED: {sorted(stale)}"


def test_no_class_holds_more_state_than_its_allowance() -> None:
    found = crowded(package_sources())
    grown = [f"{q}: {n} attributes through self (limit {KNOWN_CROWDED.get(q, MAX_STATE_ATTRIBUTES)})"
             for q, n in found.items() if n > KNOWN_CROWDED.get(q, MAX_STATE_ATTRIBUTES)]
    assert grown == [], "\n".join(grown)
    stale = sorted(set(KNOWN_CROWDED) - set(found))
    assert not stale, f"now within {MAX_STATE_ATTRIBUTES} or gone, delete from KNOWN_CROWDED: {stale}"


# ---------------------------------------------------------------- the check can say no


MIXIN = '''
class Steps:
    """A mixin reaching into its host's state."""
    phase: str
    round: int

    def advance(self) -> None:
        self.round += 1


class Core(Steps):
    def __init__(self) -> None:
        self.phase = "idle"
        self.round = 0
        self.queue = []
'''


def test_a_mixin_sharing_its_hosts_state_is_found() -> None:
    found = shared_state({"agent/core_x.py": MIXIN})
    assert [(s.subclass.qualname, s.base.qualname, s.attributes) for s in found] == [
        ("agent.core_x.Core", "agent.core_x.Steps", ("phase", "round"))]


def test_state_shared_across_modules_and_through_two_mixins_is_found() -> None:
    sources = {
        "agent/steps.py": "class Steps:\n    def go(self):\n        self.phase = 1\n",
        "agent/watch.py": "class Watch:\n    def see(self):\n        self.phase = 2\n",
        "agent/__init__.py": "from .watch import Watch\n",
        "agent/core.py": "from agent import Watch\nfrom . import steps\n\n"
                         "class Core(steps.Steps, Watch):\n    pass\n",
    }
    found = {(s.subclass.qualname, s.base.qualname) for s in shared_state(sources)}
    assert found == {("agent.steps.Steps", "agent.watch.Watch")}


@pytest.mark.parametrize("source", [
    # A subclass that only reads what its base owns, and one that overrides a constant.
    "class Base:\n    def __init__(self):\n        self.n = 0\n\n"
    "class Sub(Base):\n    LIMIT = 3\n    def more(self):\n        return self.n + 1\n",
    # A subclass overriding a ClassVar constant.
    "from typing import ClassVar\n\nclass Fault:\n    END: ClassVar[str] = 'heal'\n\n"
    "class Crash(Fault):\n    END: ClassVar[str] = 'restart'\n",
    # A Protocol declares an interface; its implementation owns the attribute.
    "from typing import Protocol\n\nclass Clock(Protocol):\n    now: float\n\n"
    "class Fixed(Clock):\n    def __init__(self):\n        self.now = 0.0\n",
    # Two unrelated classes may use one name.
    "class A:\n    x: int\n\nclass B:\n    x: int\n",
])
def test_what_one_owner_allows_passes(source: str) -> None:
    assert shared_state({"agent/x.py": source}) == []


def test_a_class_with_too_much_state_is_found() -> None:
    body = "\n".join(f"        self.a{i} = {i}" for i in range(MAX_STATE_ATTRIBUTES + 1))
    source = f"class Big:\n    def __init__(self):\n{body}\n\nclass Record:\n" + "\n".join(
        f"    f{i}: int = 0" for i in range(MAX_STATE_ATTRIBUTES + 1))
    assert crowded({"simulate/big.py": source}) == {"simulate.big.Big": MAX_STATE_ATTRIBUTES + 1}
