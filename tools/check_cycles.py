#!/usr/bin/env python3
"""Fails when the native units call each other in a cycle.

A unit is one .c or .cu file. Unit A depends on unit B when A's object file leaves a symbol
undefined that B's object file defines (read with `nm`). The dependencies must form a DAG, so
each file can be read, tested and replaced knowing only the files below it: the forward pass
(session.c) above the MoE block (moe.c) above the backends, the backends above the kernels.
Calls that go up (a backend into the split's sequence, the split into a device's operations)
pass through function tables (backend.h, device.h, split.h) and leave no symbol behind.

    tools/check_cycles.py BUILD_DIR [BUILD_DIR ...]

reads every object of the library's object target (CMakeFiles/rapidmoe_objs.dir) under each
build folder (NM in the environment names the nm to use); prints the dependency count and any cycle (the units of each strongly connected
component, and one closed path through it), and exits 1 when there is one.
"""
import os
import subprocess
import sys

OBJ_DIR = os.path.join("CMakeFiles", "rapidmoe_objs.dir")
# nm's letters for symbols an object defines for others to link against: text, data, bss,
# read-only data, small data. Weak definitions (W, V: C++ inline functions and templates, which
# every unit that uses them defines for itself) are not a dependency on any one unit.
STRONG = set("TDBRGS")


def units(build_dir):
    """{unit name: object path} of the library's objects under build_dir."""
    root = os.path.join(build_dir, OBJ_DIR)
    found = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            if f.endswith((".c.o", ".cu.o")):
                path = os.path.join(dirpath, f)
                found[os.path.relpath(path, root)[: -len(".o")]] = path
    return found


def symbols(obj):
    """(defined, undefined) global symbol names of one object file."""
    nm = os.environ.get("NM") or "nm"
    out = subprocess.run([nm, "-P", obj], check=True, capture_output=True, text=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name, kind = parts[0], parts[1]
        if kind == "U":
            undefined.add(name)
        elif kind in STRONG:
            defined.add(name)
    return defined, undefined


def graph(objs):
    """{unit: set of units it depends on}."""
    syms = {u: symbols(p) for u, p in objs.items()}
    owner = {}
    for u, (defined, _) in syms.items():
        for s in defined:
            owner[s] = u
    return {u: {owner[s] for s in undefined if s in owner and owner[s] != u} for u, (_, undefined) in syms.items()}


def components(g):
    """Strongly connected components of more than one unit (Tarjan, iterative)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    for start in sorted(g):
        if start in index:
            continue
        work = [(start, iter(sorted(g[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(g[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
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
    return out


def closed_path(g, comp):
    """One cycle through the component's first unit, as a list of units."""
    members = set(comp)
    start = comp[0]
    prev = {start: None}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(g[v] & members):
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return list(reversed(path)) + [start]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return comp


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    bad = 0
    for build_dir in argv[1:]:
        objs = units(build_dir)
        if not objs:
            print(f"check_cycles: no objects under {os.path.join(build_dir, OBJ_DIR)}", file=sys.stderr)
            return 2
        g = graph(objs)
        comps = components(g)
        n_edges = sum(len(d) for d in g.values())
        print(f"check_cycles: {build_dir}: {len(objs)} units, {n_edges} dependencies, {len(comps)} cycles")
        for comp in comps:
            print("  cycle among " + ", ".join(comp) + ": " + " -> ".join(closed_path(g, comp)))
        bad += len(comps)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
