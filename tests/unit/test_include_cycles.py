"""No include cycle in src/, between files or between modules.

Reads every `#include "..."` line under src/ (paths are relative to src/,
as `inc` in meson.build makes them) and fails on a cycle in two graphs:

- files: a.h includes b.h includes a.h (`#pragma once` lets that compile,
  and hides which of the two is the lower one);
- modules: foo.c and foo.h are one node, "foo", and an edge goes from a
  module to every module whose header one of its two files includes. A cycle
  there is two modules that call each other (foo.c includes bar.h and
  bar.c or bar.h includes foo.h), even when no header is in a cycle: the
  dependencies must point one way, down towards core/.

A header that two modules share (fsproto.h) is a module of its own, with
no .c: including it makes no cycle. A private header foo_int.h is foo's own
inside (the state its files share: session_int.h, mounts_int.h), so it is
module foo: it may include foo.h, and a file that includes it depends on
foo."""
import os
import re

SRC = os.path.join(
    os.environ.get("FORKBOX_SRCDIR", os.path.join(os.path.dirname(__file__), "..", "..")), "src")

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def src_files():
    out = []
    for root, _, names in os.walk(SRC):
        for n in names:
            if n.endswith((".c", ".h")):
                out.append(os.path.relpath(os.path.join(root, n), SRC))
    return sorted(out)


def includes(rel):
    """The src/-relative files rel includes with quotes, resolved as the
    compiler does: next to rel first, then against src/."""
    with open(os.path.join(SRC, rel), encoding="utf-8") as f:
        text = f.read()
    out = []
    for name in INCLUDE.findall(text):
        here = os.path.normpath(os.path.join(os.path.dirname(rel), name))
        if os.path.exists(os.path.join(SRC, here)):
            out.append(here)
        elif os.path.exists(os.path.join(SRC, name)):
            out.append(os.path.normpath(name))
        # else: a generated file (embed.h, ...) or a system header: no edge
    return out


def file_graph():
    return {f: set(includes(f)) for f in src_files()}


def module_of(rel):
    m = os.path.splitext(rel)[0]
    return m[:-len("_int")] if m.endswith("_int") else m


def module_graph(files):
    g = {}
    for f, deps in files.items():
        m = module_of(f)
        g.setdefault(m, set())
        g[m].update(module_of(d) for d in deps if module_of(d) != m)
    return g


def find_cycle(g):
    """One cycle as a list of nodes (first == last), or None. Iterative DFS
    with colours, so a deep graph cannot hit Python's recursion limit."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = {n: WHITE for n in g}
    for start in sorted(g):
        if colour[start] != WHITE:
            continue
        path = [start]
        stack = [iter(sorted(g[start]))]
        colour[start] = GREY
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                colour[path.pop()] = BLACK
                stack.pop()
                continue
            if colour.get(nxt, BLACK) == GREY:
                return path[path.index(nxt):] + [nxt]
            if colour.get(nxt) == WHITE:
                colour[nxt] = GREY
                path.append(nxt)
                stack.append(iter(sorted(g[nxt])))
    return None


def test_find_cycle_finds_one():
    # The checker itself: a cycle is found, a diamond is not one.
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}) is None
    # a.c and b.c share c.h (a header of its own): no cycle; then b.c
    # includes a.h as well: a and b call each other, though no file cycles.
    files = {"x/a.c": {"x/b.h", "x/c.h"}, "x/a.h": set(), "x/b.c": {"x/c.h"},
             "x/b.h": {"x/c.h"}, "x/c.h": set()}
    assert find_cycle(module_graph(files)) is None
    files["x/b.c"].add("x/a.h")
    assert find_cycle(files) is None
    assert find_cycle(module_graph(files)) == ["x/a", "x/b", "x/a"]
    # a_int.h, the private half of a, includes a.h: no cycle; b.c includes
    # a_int.h, so b depends on a, and a.c including b.h closes a cycle.
    files = {"x/a.c": {"x/a.h", "x/a_int.h"}, "x/a.h": set(), "x/a_int.h": {"x/a.h"},
             "x/b.c": {"x/a_int.h"}}
    assert find_cycle(module_graph(files)) is None
    files["x/a.c"].add("x/b.h")
    files["x/b.h"] = set()
    assert find_cycle(module_graph(files)) == ["x/a", "x/b", "x/a"]


def test_tree_is_read():
    files = file_graph()
    assert "core/util.h" in files and "sandbox/spawn.c" in files
    assert "sandbox/spawn.h" in files["sandbox/spawn.c"]


def test_no_file_include_cycle():
    cycle = find_cycle(file_graph())
    assert cycle is None, "include cycle: " + " -> ".join(cycle)


def test_no_module_cycle():
    cycle = find_cycle(module_graph(file_graph()))
    assert cycle is None, "modules that include each other: " + " -> ".join(cycle)
