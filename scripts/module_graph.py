#!/usr/bin/env python3
"""Draws the imports between leader-gate's modules and checks the house rules.

Reads every file under src/ (tests included: a test module's imports are
imports too), resolves each `crate::`, `super::`, `self::` path and each bare
path through a child module to the module it names, and draws one arrow per
module pair. Then checks:

- no circle: no module reaches itself through imports;
- no arrow runs up a floor: the project's top-level rooms are stacked
  (FLOORS below); a room imports only rooms on lower floors, or its own.

    python3 scripts/module_graph.py            # the drawing (text), then the verdict
    python3 scripts/module_graph.py --dot      # Graphviz, for `dot -Tsvg`
    python3 scripts/module_graph.py --check    # exit 1 on a circle or an upward arrow
    python3 scripts/module_graph.py --write    # rewrite the drawing in docs/development.md

A parent declaring `mod child;` draws no arrow; a parent using
`child::Thing` does. A child's arrow to its own ancestor (`super::Thing`) is
drawn but makes no circle: a child is a room inside its parent and sees its
items as Rust's privacy does. Siblings importing each other, directly or
through a third, do make one.
"""

import os
import re
import sys
from collections import defaultdict

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SRC = os.path.join(ROOT, "src")
DOC = os.path.join(ROOT, "docs", "development.md")
BEGIN = "<!-- module-graph: begin (scripts/module_graph.py --write) -->"
END = "<!-- module-graph: end -->"

# The floors, lowest first. A top-level room may import rooms on lower floors
# and itself; rooms on one floor do not import each other.
FLOORS = [
    ["clock", "backoff", "duration", "exit", "args", "timing"],
    ["elector"],
    ["serve", "client"],
    ["inject"],
    ["cli"],
    ["main"],
]


def module_of(path, src=SRC):
    rel = os.path.relpath(path, src)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib"):
        rel = rel[:-1]
    return tuple(rel)


def strip(text):
    """Drops comments and string literals (keeps line structure)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'r(#*)"', text[i:])
            close = '"' + m.group(1)
            j = text.find(close, i + len(m.group(0)))
            i = n if j < 0 else j + len(close)
            out.append('""')
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            i = j + 1
            out.append('""')
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 4]):
            i += len(re.match(r"'(\\.[^']*|[^\\'])'", text[i:]).group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


def use_paths(tree, prefix=""):
    """Expands a use tree (`a::{b, c::{d, e}}`) into its paths."""
    tree = tree.strip()
    depth, start, parts = 0, 0, []
    brace = None
    for i, c in enumerate(tree):
        if c == "{":
            if depth == 0:
                brace = i
            depth += 1
        elif c == "}":
            depth -= 1
    if brace is None:
        path = tree.split(" as ")[0].strip()
        return [prefix + path] if path else []
    head = tree[:brace].rstrip(":").strip()
    inner = tree[brace + 1:tree.rindex("}")]
    base = prefix + (head + "::" if head else "")
    depth = 0
    for i, c in enumerate(inner + ","):
        if c in "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(inner[start:i])
            start = i + 1
    out = []
    for part in parts:
        part = part.strip()
        if part == "self":
            out.append(base.rstrip(":"))
        elif part:
            out.extend(use_paths(part, base))
    return out


def resolve(path, here, modules, children):
    """The module a path names, or None when it leaves the crate."""
    segs = [s for s in path.split("::") if s]
    if not segs:
        return None
    if segs[0] in ("crate", "leader_gate"):
        cur, segs = (), segs[1:]
    elif segs[0] in ("super", "self"):
        cur = here
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                cur = cur[:-1]
            segs = segs[1:]
    elif segs[0] in children.get(here, ()):
        cur = here
    else:
        return None
    for s in segs:
        if cur + (s,) in modules:
            cur = cur + (s,)
        else:
            break
    return cur


def graph(src=SRC):
    files = {}
    for dirpath, _, names in os.walk(src):
        for name in names:
            if name.endswith(".rs"):
                path = os.path.join(dirpath, name)
                files[module_of(path, src)] = path
    # main.rs is the binary's crate root: its `crate::` is itself.
    modules = set(files) | {()}
    children = defaultdict(set)
    for mod, path in files.items():
        text = strip(open(path).read())
        for m in re.finditer(r"\bmod\s+(\w+)\s*;", text):
            if mod != ("main",):
                children[mod].add(m.group(1))
        files[mod] = (path, text)
    edges = defaultdict(set)
    for mod, (path, text) in files.items():
        # Inline modules (`mod tests { … }`) share their file's arrows: a
        # path inside one is read as the file's, its leading `super::`s
        # (one per inline module around it) dropped first.
        nesting = inline_spans(text)
        paths = []
        for m in re.finditer(r"\buse\s+([^;]+);", text):
            paths.extend(in_file(p, m.start(), nesting) for p in use_paths(m.group(1)))
        for m in re.finditer(r"\b((?:crate|super|self|leader_gate)(?:::\w+)+)", text):
            paths.append(in_file(m.group(1), m.start(), nesting))
        for m in re.finditer(r"(?<![:\w])(\w+)::\w+", text):
            # Inside an inline module too: `use super::*` brings the
            # file's children into its scope.
            if m.group(1) in children.get(mod, ()):
                paths.append(m.group(0))
        for p in paths:
            if p is None:
                continue
            if mod == ("main",) and not p.startswith(("leader_gate", "crate")):
                continue
            if mod == ("main",):
                p = p.replace("crate::", "crate::main::", 1) if p.startswith("crate::") else p
            target = resolve(p, mod, modules, children)
            if target is None or target == () or target == mod:
                continue
            edges[mod].add(target)
    return sorted(files), edges


def inline_spans(text):
    """Where each inline module (`mod tests { … }`) of a file begins and ends."""
    spans = []
    for m in re.finditer(r"\bmod\s+\w+\s*\{", text):
        depth, i = 0, m.end() - 1
        while i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                break
            i += 1
        spans.append((m.start(), i))
    return spans


def in_file(path, at, nesting):
    """`path`, written at `at`, as the file's module would write it: within
    inline modules their leading `super::`s are theirs to drop; a path that
    stays inside an inline module (`self::`, too few `super::`s) is None."""
    depth = sum(1 for a, b in nesting if a <= at < b)
    if depth == 0 or path.startswith(("crate::", "leader_gate::")):
        return path
    segs = path.split("::")
    for _ in range(depth):
        if segs[0] != "super":
            return None
        segs = segs[1:]
    return "::".join(["self", *segs])


def inside(a, b):
    """`a` is a room inside `b` (b is an ancestor of a)."""
    return len(b) < len(a) and a[:len(b)] == b


def circles(nodes, edges):
    # A child sees its parent's items as Rust's privacy does: an arrow to an
    # ancestor is drawn but is no part of a circle.
    edges = {a: {b for b in bs if not inside(a, b)} for a, bs in edges.items()}
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
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
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in nodes:
        if v not in index:
            visit(v)
    return out


def floor_of(mod):
    top = mod[0] if mod else ""
    for i, rooms in enumerate(FLOORS):
        if top in rooms:
            return i
    return None


def upward(nodes, edges):
    bad = []
    for a in nodes:
        for b in sorted(edges.get(a, ())):
            fa, fb = floor_of(a), floor_of(b)
            if fa is None or fb is None:
                bad.append((a, b, "a room on no floor (add it to FLOORS)"))
            elif a[0] != b[0] and fb >= fa:
                bad.append((a, b, "runs up" if fb > fa else "runs sideways"))
    return bad


def name(mod):
    return "::".join(mod) if mod else "crate"


def is_test(mod):
    """A test module (`tests`, `properties`, or inside one)."""
    return any(part in ("tests", "properties") for part in mod)


def drawing(nodes, edges):
    """Floors top down; under each module the rooms of its own side it
    imports (by their path in the side), and once per side the rooms of
    other floors it imports. Test modules are checked, not drawn."""
    lines = []
    for i in reversed(range(len(FLOORS))):
        rooms = FLOORS[i]
        members = [m for m in nodes if m and m[0] in rooms]
        if not members:
            continue
        lines.append(f"floor {i}: {', '.join(r for r in rooms if any(m[0] == r for m in members))}")
        for m in members:
            if is_test(m):
                continue
            own = sorted("::".join(t[1:]) for t in edges.get(m, ()) if t[0] == m[0] and len(m) > 1)
            if len(m) == 1:
                below = sorted({t[0] for n in members if n[0] == m[0] for t in edges.get(n, ()) if t[0] != m[0]})
                own = [f"(below: {', '.join(below)})"] if below else []
            arrow = " → " + ", ".join(own) if own else ""
            lines.append(f"  {'  ' * (len(m) - 1)}{m[-1]}{arrow}")
    return "\n".join(lines)


def dot(nodes, edges):
    out = ["digraph modules {", "  rankdir=BT; node [shape=box, fontsize=10];"]
    for m in nodes:
        out.append(f'  "{name(m)}";')
    for a in nodes:
        for b in sorted(edges.get(a, ())):
            out.append(f'  "{name(a)}" -> "{name(b)}";')
    out.append("}")
    return "\n".join(out)


def main():
    nodes, edges = graph()
    loops = circles(nodes, edges)
    ups = upward(nodes, edges)
    args = sys.argv[1:]
    text = drawing(nodes, edges)
    stale = False
    if "--dot" in args:
        print(dot(nodes, edges))
        return 0
    if "--write" in args or "--check" in args:
        doc = open(DOC).read()
        if BEGIN not in doc:
            print(f"{DOC}: no {BEGIN!r} marker", file=sys.stderr)
            return 1
        head, rest = doc.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        fresh = f"{head}{BEGIN}\n```text\n{text}\n```\n{END}{tail}"
        if "--write" in args:
            open(DOC, "w").write(fresh)
        elif fresh != doc:
            print("docs/development.md: the module drawing is stale; run "
                  "python3 scripts/module_graph.py --write", file=sys.stderr)
            stale = True
    else:
        print(text)
        print()
    for comp in loops:
        print("circle: " + " ↔ ".join(name(m) for m in comp))
    for a, b, why in ups:
        print(f"arrow {why}: {name(a)} → {name(b)}")
    if not loops and not ups and not stale:
        print(f"{len(nodes)} modules, {sum(len(v) for v in edges.values())} arrows: no circle, no arrow up a floor")
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
