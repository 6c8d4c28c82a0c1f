"""Shared fixtures: import paths, the smollm2 checkpoint, the engine binding, the HF reference.

Skips only when a model is missing (a fresh clone before `make fetch`), and never under CI
(`CI` set), where `make test` has fetched them: there a missing model fails. A missing engine
binding is always a failure, because `make test` builds it and CI must not go green by
skipping the gate.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
for _p in (REPO / "llms", REPO):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))
if str(REPO / "build" / "python") not in sys.path:
    sys.path.append(str(REPO / "build" / "python"))  # after PYTHONPATH: a custom build wins
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

STORE = Path(os.environ.get("EDGELLM_MODELS") or REPO / "models")
# The store every engine front end in this session resolves names in: the clone's models/
# (`make fetch` fills it), whatever the library's own default would be.
os.environ["EDGELLM_MODELS"] = str(STORE)
SMOLLM2_DIR = STORE / "smollm2-135m-instruct"
VERIFY_RUNNER = REPO / "llms" / "verify" / "verify_runner.py"
PYTHON = sys.executable

MUTANTS = "gate mutants: which lens caught each"
# Figures measured in this process and not yet carried by a test report; the reports take them
# to the process that prints the summary (a pytest-xdist worker prints nothing itself).
_PENDING: list[tuple[str, Any]] = []
_REPORT: dict[str, list[Any]] = {}  # section -> lines (or mutant rows) printed after the run


def report_line(section: str, line: str) -> None:
    """A measured figure to print in the terminal summary, e.g. an error beside its tolerance."""
    _PENDING.append((section, line))


def mutant_row(name: str, kind: str, lenses: str) -> None:
    """One row of the summary's table of gate mutants and the lenses that caught them."""
    _PENDING.append((MUTANTS, [name, kind, lenses]))


def verify_env() -> dict[str, str]:
    """The environment the make targets give verify_runner.py."""
    paths = [str(REPO / "build" / "python"), str(REPO / "llms"), str(REPO)]
    if os.environ.get("PYTHONPATH"):
        paths.insert(0, os.environ["PYTHONPATH"])
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(paths),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }


def missing_model(message: str) -> None:
    """A model `make fetch` provides is absent: a skip on a developer's fresh clone, a failure
    under CI (which ran `make fetch`), so a broken fetch can never turn tests into skips."""
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def smollm2_checkpoint() -> Path:
    if not (SMOLLM2_DIR / "config.json").is_file():
        missing_model(f"no checkpoint at {SMOLLM2_DIR}: run `make fetch` (or set EDGELLM_MODELS)")
    return SMOLLM2_DIR


EDGELLM_BIN = REPO / "build" / "edgellm"


def with_chat_template(checkpoint: Path, parent: Path, template: str) -> Path:
    """`checkpoint` under `parent` (same directory name: the served model id) with
    `template` as its chat template; the other files are links to the originals."""
    model = parent / checkpoint.name
    model.mkdir()
    for f in checkpoint.iterdir():
        if f.name != "tokenizer_config.json":
            (model / f.name).symlink_to(f)
    config = json.loads((checkpoint / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    return model


def edgellm_cmd(subcommand: str = "run", deployment: str = "smollm2_135m") -> list[str]:
    """The argv prefix of `edgellm SUBCOMMAND --deployment DEPLOYMENT`."""
    return [str(EDGELLM_BIN), subcommand, "--deployment", deployment]


@pytest.fixture(scope="session")
def edgellm_bin() -> Path:
    """The `edgellm` command, which `make test` builds: absent is a failure."""
    if not EDGELLM_BIN.is_file():
        pytest.fail(f"{EDGELLM_BIN} is missing: cmake --build build --target edgellm_cli")
    return EDGELLM_BIN


@pytest.fixture(scope="session")
def smollm2_run(smollm2_checkpoint: Path, edgellm_bin: Path) -> list[str]:
    """`edgellm run` on the smollm2 deployment (its checkpoint fetched)."""
    return edgellm_cmd("run")


@pytest.fixture(scope="module")
def binding() -> Any:
    """edgellm_py alone, without a model (the Jinja tests need only the interpreter)."""
    try:
        import edgellm_py
    except ImportError as e:
        pytest.fail(f"edgellm_py not importable ({e}): cmake --build build --target edgellm_py")
    return edgellm_py


@pytest.fixture(scope="session")
def engine_binding(smollm2_checkpoint: Path) -> Any:
    """edgellm_py, which `make test` builds: absent or broken is a failure, never a skip."""
    try:
        import edgellm_py
    except ImportError as e:
        pytest.fail(
            f"engine binding edgellm_py not importable ({e}): "
            "cmake --build build --target edgellm_py"
        )
    return edgellm_py


@pytest.fixture(scope="session")
def deployment_policy() -> Any:
    """edgellm_deployment (llms/common/python), which `make build` builds: absent is a failure."""
    try:
        import edgellm_deployment
    except ImportError as e:
        pytest.fail(
            f"deployment module edgellm_deployment not importable ({e}): "
            "cmake --build build --target edgellm_deployment"
        )
    return edgellm_deployment


@pytest.fixture(scope="session")
def edgellm_package(smollm2_checkpoint: Path) -> Any:
    """The `edgellm` package (build/python/edgellm, laid out by the build): absent is a failure."""
    try:
        import edgellm
    except ImportError as e:
        pytest.fail(
            f"package edgellm not importable ({e}): cmake --build build --target edgellm_package"
        )
    return edgellm


# `make verify` for each deployment the suite gates on real weights: (checkpoint, --model).
GATE_JOBS = {
    "smollm2_135m": ("smollm2-135m-instruct", "instruct"),
    "gemma3_270m": ("gemma3-270m", "base"),
}


@dataclass
class GateRun:
    """One `make verify`-equivalent run: its process (stdout, exit code) and its JSON report."""

    proc: subprocess.CompletedProcess[str]
    report: dict[str, Any]
    report_dir: Path


def session_shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder every process of this pytest session sees: the root of the basetemp that
    pytest-xdist gives each worker below it, or the basetemp itself in a plain run."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def gate_run(engine_binding: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """gate_run(deployment) -> GateRun: the gate at make verify's settings (2 prompts x 32 tokens,
    both stages, 2 threads), run once per session and shared by the gate's own tests and the Ray
    sweep's comparison, across pytest-xdist workers too (the first to ask runs it under a lock;
    the others read its result). SmolLM2's run recomputes its HF references
    (--fresh-reference), so HF really runs in every session however warm the capture cache is."""
    import fcntl

    runs: dict[str, GateRun] = {}

    def run(deployment: str, out: Path) -> None:
        checkpoint, model = GATE_JOBS[deployment]
        if not (STORE / checkpoint / "config.json").is_file():
            missing_model(f"no checkpoint {STORE / checkpoint}: run `make fetch`")
        fresh = ["--fresh-reference"] if deployment == "smollm2_135m" else []
        proc = subprocess.run(
            [PYTHON, str(VERIFY_RUNNER), f"--runner={deployment}.verify_adapter",
             "--prompts", "topk_token", "--model", model, "--max-prompts", "2",
             "--threads", "2", "--report-dir", str(out / "report"), *fresh],
            capture_output=True, text=True, timeout=900, env=verify_env(), cwd=REPO, check=False,
        )  # fmt: skip
        done = {"args": proc.args, "returncode": proc.returncode}
        (out / "process.json").write_text(
            json.dumps({**done, "stdout": proc.stdout, "stderr": proc.stderr})
        )

    def get(deployment: str) -> GateRun:
        if deployment not in runs:
            out = session_shared_dir(tmp_path_factory) / f"gate-{deployment}"
            out.mkdir(exist_ok=True)
            with open(out / ".lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # held while another worker runs it
                if not (out / "process.json").is_file():
                    run(deployment, out)
            proc = subprocess.CompletedProcess(**json.loads((out / "process.json").read_text()))
            reports = list((out / "report").glob("*.json"))
            assert len(reports) == 1, proc.stdout + proc.stderr
            runs[deployment] = GateRun(proc, json.loads(reports[0].read_text()), out / "report")
        return runs[deployment]

    return get


@pytest.fixture(scope="session")
def family_fixture(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """family_fixture(name) -> a directory holding scripts/make_fixture.py's tiny random
    checkpoint `name` (seed 0). Written once per session, in this process (no interpreter and
    torch start-up per module); every call returns a fresh copy, named after the fixture, that
    the caller may edit."""
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            if str(REPO / "scripts") not in sys.path:
                sys.path.insert(0, str(REPO / "scripts"))
            from make_fixture import write_fixture

            try:
                made[name] = write_fixture(name, tmp_path_factory.mktemp("made") / name, seed=0)
            except FileNotFoundError as e:  # the tokenizer it borrows is not fetched
                missing_model(str(e))
        copy = tmp_path_factory.mktemp(name)
        shutil.copytree(made[name], copy, dirs_exist_ok=True)
        return copy

    return get


# How `make test` spreads the suite over pytest-xdist workers: a file is one unit of work, so
# a module's fixtures (servers, Ray clusters) start once, on one worker; files of independent
# tests on cheap or cached fixtures are spread test by test.
SPREAD = {"test_gate_mutants.py", "test_cli.py"}
# The longest units start first (measured: the Ray sweep with the two gate runs it compares
# against, ~200 s; then the servers), so that no worker is left alone with one at the end.
# The gate's own tests come after the servers: by then the sweep's worker has run the gates
# they share (gate_run). Order alone changes nothing a test checks.
LONGEST_FIRST = [
    "test_ray_sweep.py", "test_server.py", "test_ray_serve.py", "test_verify_gate.py",
    "test_tool_calls.py",
]  # fmt: skip


def work_unit(nodeid: str) -> str:
    file = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    return nodeid if file in SPREAD else file


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(work_unit(item.nodeid), len(rank)))  # stable


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Units of work as work_unit() draws them, handed out in collection order. (xdist's own
    --dist loadgroup groups nothing under pytest 9: it renames `item._nodeid`, which pytest 9
    no longer reads.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ByWorkUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return ByWorkUnit(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Any:
    outcome = yield
    if _PENDING:  # a new list: the report's own may be the item's, shared by its other phases
        report = outcome.get_result()
        report.user_properties = [*report.user_properties, ("edgellm_summary", list(_PENDING))]
        _PENDING.clear()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    for name, value in report.user_properties:
        if name == "edgellm_summary":
            for section, line in value:
                _REPORT.setdefault(section, []).append(line)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    for section, lines in _REPORT.items():
        terminalreporter.section(section)
        if section == MUTANTS:
            width = max(len(row[0]) for row in lines)
            lines = [f"{name:<{width}}  {kind:<9}  {lenses}" for name, kind, lenses in lines]
        for line in lines:
            terminalreporter.write_line(line)


def assert_one_line_error(
    proc: subprocess.CompletedProcess[str], *needles: str, code: int | None = None
) -> None:
    """Bad input: a non-zero exit (or exactly `code`) and one `error:` line naming the problem."""
    assert proc.returncode != 0 if code is None else proc.returncode == code, (
        proc.stdout + proc.stderr
    )
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error:"), lines[0]
    assert "Traceback" not in proc.stderr + proc.stdout
    for needle in needles:
        assert needle in lines[0], lines[0]
