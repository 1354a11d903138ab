"""The package's modules import each other without a circle (a function-level import counts: it
hides a circle, it does not break it), found as tools/check_cycles.py finds the native units'."""

from __future__ import annotations

import ast
from pathlib import Path

import rapidmoe_gguf

PACKAGE = Path(rapidmoe_gguf.__file__).parent
ROOT = Path(__file__).resolve().parent.parent   # the source tree: native/ and tools/ (an installed run has no copy)


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports, anywhere in its text."""
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    got = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else []))
            for alias in node.names:
                got.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
        elif isinstance(node, ast.Import):
            got.update(a.name for a in node.names)
    return {m for m in got if m in modules and m != name}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module: tools/check_cycles.py's, which
    finds the native units' call cycles."""
    import importlib.util

    path = ROOT / "tools" / "check_cycles.py"
    spec = importlib.util.spec_from_file_location("check_cycles", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool.components(graph)


def test_imports_no_circle_among_the_package_modules():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    graph.pop("rapidmoe_gguf", None)              # the package's face imports what it shows
    graph = {k: v - {"rapidmoe_gguf"} for k, v in graph.items()}
    assert sum(len(v) for v in graph.values()) > 50, "the import graph was not read"
    assert _circles(graph) == []


def test_imports_circle_check_finds_one():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_imports_native_units_outside_cpu_reach_it_through_the_backend():
    """The model code and the devices call the CPU's kernels through the backend table (backend.h):
    no file of native/src outside cpu/, nor of native/cuda, includes a header of cpu/."""
    import re

    native = ROOT / "native"
    offenders = []
    outside = [p for p in (native / "src").rglob("*.[ch]") if "cpu" not in p.relative_to(native / "src").parts[:1]]
    assert len(outside) > 30, "the native sources were not found"
    for path in sorted([*outside, *(native / "cuda").glob("*.cu*")]):
        for line in path.read_text(encoding="utf-8").splitlines():
            if re.match(r'\s*#\s*include\s+"(\.\./)*(src/)?cpu/', line):
                offenders.append(f"{path.relative_to(native)}: {line.strip()}")
    assert offenders == []
