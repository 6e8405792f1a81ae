"""Structure figures of the repository (issue 53): import loops closed only behind TYPE_CHECKING,
classes that declare an attribute their (repository) base class declares too, the largest class
and file. Run from the repository root: `python scripts/structure_figures.py [ROOT]`."""

import ast
import sys
from pathlib import Path

ROOT = Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
PKGS = ("agent", "simulate", "dashboard", "edgegrove")
files = {p: p.read_text() for pkg in PKGS for p in (ROOT / pkg).rglob("*.py")}

def modname(p):
    parts = p.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

mods = {modname(p): p for p in files}

def resolve(node, p):
    if node.level == 0:
        return node.module or ""
    base = modname(p).split(".")
    if p.name != "__init__.py":
        base = base[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))

def targets(name):
    out = set()
    while name:
        if name in mods:
            out.add(name)
            break
        name = name.rpartition(".")[0]
    return out

def edges(p, tree):
    tc_lines = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test):
            for s in n.body:
                for m in ast.walk(s):
                    if hasattr(m, "lineno"):
                        tc_lines.add(m.lineno)
    for n in ast.walk(tree):
        names = []
        if isinstance(n, ast.Import):
            names = [a.name for a in n.names]
        elif isinstance(n, ast.ImportFrom):
            mod = resolve(n, p)
            names = [f"{mod}.{a.name}" for a in n.names] or [mod]
        for nm in names:
            for t in targets(nm):
                yield t, n.lineno in tc_lines

full, runtime = {}, {}
for p, src in files.items():
    m = modname(p)
    tree = ast.parse(src)
    full.setdefault(m, set())
    runtime.setdefault(m, set())
    for t, tc in edges(p, tree):
        if t == m:
            continue
        full[m].add(t)
        if not tc:
            runtime[m].add(t)

def sccs(g):
    index, low, stack, on, out, i = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)
    def visit(v):
        index[v] = low[v] = i[0]
        i[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(frozenset(comp))
    for v in list(g):
        if v not in index:
            visit(v)
    return out

full_c, run_c = sccs(full), set(sccs(runtime))
tc_loops = [c for c in full_c if c not in run_c]
print("import loops (all imports):", len(full_c), "; runtime-only:", len(run_c))
print("loops closed only by TYPE_CHECKING:", len(tc_loops))
for c in tc_loops:
    print("  ", len(c), "modules:", sorted(c))

# attributes per class, declared in a class and again in a (repo) base class
classes = {}
for p, src in files.items():
    for n in ast.walk(ast.parse(src)):
        if isinstance(n, ast.ClassDef):
            attrs = set()
            for s in n.body:
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name):
                    attrs.add(s.target.id)
            for f in ast.walk(n):
                if isinstance(f, (ast.Assign, ast.AnnAssign)):
                    tg = f.targets if isinstance(f, ast.Assign) else [f.target]
                    for t in tg:
                        for e in ast.walk(t):
                            if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self":
                                attrs.add(e.attr)
            bases = [ast.unparse(b).split(".")[-1] for b in n.bases]
            lines = n.end_lineno - n.lineno + 1
            classes.setdefault(n.name, []).append((p.relative_to(ROOT), attrs, bases, lines))
twice = []
for name, defs in classes.items():
    for _path, attrs, bases, _ in defs:
        for b in bases:
            for _bpath, battrs, _, _ in classes.get(b, []):
                shared = attrs & battrs
                if shared and b != name:
                    twice.append((name, b, len(shared)))
print("classes with attributes declared twice (in the class and a base):", len({(a, b) for a, b, _ in twice}))
for a, b, k in sorted(set(twice)):
    print(f"   {a}({b}): {k} attributes")
largest = max(((lines, name, str(path)) for name, defs in classes.items() for path, _, _, lines in defs))
print("largest class:", largest)
agent_largest = max(((size, n, str(p)) for n, defs in classes.items() for p, _, _, size in defs
                     if str(p).startswith("agent/")))
print("largest class in agent/:", agent_largest)
sizes = sorted(((len(src.splitlines()), str(p.relative_to(ROOT))) for p, src in files.items()), reverse=True)[:3]
print("largest files:", sizes)
asizes = sorted(((len(src.splitlines()), str(p.relative_to(ROOT))) for p, src in files.items() if str(p.relative_to(ROOT)).startswith("agent/")), reverse=True)[:3]
print("largest files in agent/:", asizes)
