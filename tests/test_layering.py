"""Arrows point one way: no import cycle among the Python modules under llms/, no C++ include
from engine/ into llms/, and llms/ C++ sees only the engine's public headers (engine/include).
The engine names no llms/ path and no deployment, and libedgellm is compiled with no path of
the source tree (its model store is $EDGELLM_MODELS, the front end's default or the user cache).

Every import counts, a function-local one too (a cycle closed at run time is still a cycle).
verify_runner.py and sweep.py once imported each other, closing the circle by passing
sys.modules[__name__]; the phases and the command line now live below both.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
from pathlib import Path

import pytest
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


# --- C++: engine/ never reaches into llms/, and llms/ uses only the public headers ------------

ENGINE = REPO / "engine"
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def quoted_includes(root: Path) -> list[tuple[Path, str]]:
    files = [p for p in root.rglob("*") if p.suffix in (".cpp", ".h")]
    return [(p, inc) for p in files for inc in INCLUDE.findall(p.read_text())]


def resolves(path: Path, inc: str, dirs: list[Path]) -> Path | None:
    for d in [path.parent, *dirs]:
        if (d / inc).is_file():
            return (d / inc).resolve()
    return None


def layering_violations(engine: Path, llms: Path) -> list[str]:
    bad = []
    engine_dirs = [engine / "include", engine, engine / "src", engine / "python"]
    for path, inc in quoted_includes(engine):
        target = resolves(path, inc, engine_dirs)
        if target is None or engine.resolve() not in target.parents:
            bad.append(f"{path.relative_to(engine.parent)}: {inc} is not the engine's")
    public = engine / "include"
    for path, inc in quoted_includes(llms):
        target = resolves(path, inc, [public, llms / "common", llms / "common" / "server"])
        inside = target is not None and (
            llms.resolve() in target.parents or public.resolve() in target.parents
        )
        if not inside:
            bad.append(f"{path.relative_to(llms.parent)}: {inc} is not a public engine header")
    return bad


def test_the_include_check_sees_a_wrong_arrow(tmp_path: Path) -> None:
    engine, llms = tmp_path / "engine", tmp_path / "llms"
    for d in (engine / "src", engine / "include" / "edgellm", llms / "common"):
        d.mkdir(parents=True)
    (engine / "include" / "edgellm" / "api.h").write_text("")
    (engine / "src" / "internal.h").write_text("")
    (llms / "common" / "server.h").write_text("")
    (engine / "src" / "ok.cpp").write_text('#include "edgellm/api.h"\n#include "internal.h"\n')
    (llms / "common" / "ok.cpp").write_text('#include "edgellm/api.h"\n#include "server.h"\n')
    assert layering_violations(engine, llms) == []
    (engine / "src" / "up.cpp").write_text('#include "server.h"\n')
    (llms / "common" / "past.cpp").write_text('#include "internal.h"\n')
    assert len(layering_violations(engine, llms)) == 2


def test_engine_never_includes_llms_and_llms_only_public_headers() -> None:
    assert not layering_violations(ENGINE, LLMS), "\n".join(layering_violations(ENGINE, LLMS))


# --- the engine names no application: no llms/ path, no deployment, no baked source tree ------

LLMS_PATH = re.compile(r"\bllms/")


def application_mentions(engine: Path, deployments: list[str]) -> list[str]:
    """Files under engine/ that name an llms/ path, or a deployment outside engine/tests (whose
    test data may borrow a name)."""
    bad = []
    names = re.compile(r"\b(" + "|".join(map(re.escape, deployments)) + r")\b")
    for path in sorted(p for p in engine.rglob("*") if p.is_file()):
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue  # binary test data
        rel = path.relative_to(engine.parent)
        if LLMS_PATH.search(text):
            bad.append(f"{rel}: names an llms/ path")
        if deployments and "tests" not in path.relative_to(engine).parts[:1]:
            if m := names.search(text):
                bad.append(f"{rel}: names the deployment {m.group(0)}")
    return bad


def test_the_mention_check_sees_the_application(tmp_path: Path) -> None:
    engine = tmp_path / "engine"
    (engine / "src").mkdir(parents=True)
    (engine / "tests").mkdir()
    (engine / "src" / "ok.cpp").write_text("// SmolLM2's shapes\n")
    (engine / "tests" / "data.cpp").write_text("// smollm2_135m's fixture\n")
    assert application_mentions(engine, ["smollm2_135m"]) == []
    (engine / "src" / "up.cpp").write_text("// see llms/verify/README.md\n")
    (engine / "src" / "used.h").write_text('// used_by = "smollm2_135m"\n')
    assert len(application_mentions(engine, ["smollm2_135m"])) == 2


def test_engine_names_no_llms_path_nor_deployment() -> None:
    deployments = sorted(p.parent.name for p in LLMS.glob("*/deployment.json"))
    assert deployments
    bad = application_mentions(ENGINE, deployments)
    assert not bad, "\n".join(bad)


def source_tree_definitions(commands: list[dict], repo: Path) -> list[str]:
    """-D definitions naming a path inside `repo` in the compile commands of libedgellm's own
    sources (engine/src, engine/kernels)."""
    bad = []
    library = [repo / "engine" / "src", repo / "engine" / "kernels"]
    for c in commands:
        source = Path(c["directory"], c["file"]).resolve()
        if not any(d.resolve() in source.parents for d in library):
            continue
        args = c.get("arguments") or shlex.split(c["command"])
        for i, a in enumerate(args):
            value = (
                args[i + 1]
                if a == "-D" and i + 1 < len(args)
                else a[2:]
                if a.startswith("-D")
                else None
            )
            if value is not None and str(repo.resolve()) in value:
                bad.append(f"{source.relative_to(repo.resolve())}: -D{value}")
    return bad


def test_the_definition_check_sees_a_baked_path(tmp_path: Path) -> None:
    src = tmp_path / "engine" / "src"
    src.mkdir(parents=True)
    cmd = {"directory": str(tmp_path), "file": str(src / "a.cpp")}
    ok = [{**cmd, "command": "c++ -DNDEBUG -DEDGELLM_X=1 -c a.cpp"}]
    assert source_tree_definitions(ok, tmp_path) == []
    baked = f'c++ -DSTORE=\\"{tmp_path}/models\\" -c a.cpp'
    assert len(source_tree_definitions([{**cmd, "command": baked}], tmp_path)) == 1
    driver = {"directory": str(tmp_path), "file": str(tmp_path / "llms" / "common" / "d.cpp")}
    assert source_tree_definitions([{**driver, "command": baked}], tmp_path) == []


def test_libedgellm_bakes_in_no_source_tree_path() -> None:
    """CMake gives libedgellm's sources no definition pointing into the tree (the deployment
    policy, llms/common/deployment.cpp, may: it is the application)."""
    cmake = (REPO / "CMakeLists.txt").read_text()
    assert not re.search(r"set_source_files_properties\(\s*engine/[^)]*COMPILE_DEFINITIONS", cmake)
    for block in re.findall(r"target_compile_definitions\(\s*edgellm\s[^)]*\)", cmake):
        assert "PROJECT_SOURCE_DIR" not in block and "CMAKE_SOURCE_DIR" not in block, block
    commands = REPO / "build" / "compile_commands.json"
    if not commands.is_file():
        pytest.skip(f"no {commands}: `make build` writes it")
    entries = json.loads(commands.read_text())
    assert any("engine/src/runtime/model_store.cpp" in e["file"] for e in entries)
    bad = source_tree_definitions(entries, REPO)
    assert not bad, "\n".join(bad)
