"""Arrows point one way: no import cycle among the Python modules under llms/.

Every import counts, a function-local one too (a cycle closed at run time is still a cycle).
verify_runner.py and sweep.py once imported each other, closing the circle by passing
sys.modules[__name__]; the phases and the command line now live below both.
"""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

LLMS = REPO / "llms"


def module_name(path: Path) -> str:
    parts = path.relative_to(LLMS).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    files = [p for p in LLMS.rglob("*.py") if "__pycache__" not in p.parts]
    modules = {module_name(p): p for p in files}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from verify import sweep` names a module; `from verify.gate import X` does too.
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            graph[name] |= {t for t in targets if t in modules and t != name}
    # A package's __init__ is not an edge worth following for cycles of its own modules.
    return {m: {t for t in ts if t not in modules or not m.startswith(f"{t}.")} for m, ts in
            graph.items()}  # fmt: skip


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str]:
        state[m] = 1
        path.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                return path[path.index(t) :] + [t]
            if t not in state and (cycle := visit(t)):
                return cycle
        path.pop()
        state[m] = 2
        return []

    for m in sorted(graph):
        if m not in state and (cycle := visit(m)):
            return cycle
    return []


def test_the_finder_sees_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_under_llms() -> None:
    graph = import_graph()
    assert "verify.verify_runner" in graph and "verify.sweep" in graph["verify.verify_runner"]
    assert "verify.phases" in graph["verify.sweep"]
    cycle = find_cycle(graph)
    assert not cycle, " -> ".join(cycle)
