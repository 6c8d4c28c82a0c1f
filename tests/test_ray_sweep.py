"""Verify sweeps on Ray (verify_runner.py --ray): same reports as the local run, bounded faults.

A local single-node Ray cluster per sweep (dashboard off). Bounded: 2 prompts per job.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import ray  # noqa: E402, F401  (pinned in requirements.txt: absent fails, never skips)
from conftest import PYTHON, VERIFY_RUNNER, report_line, verify_env

JOBS = [("smollm2_135m", "instruct", "instruct"), ("gemma3_270m", "base", "base")]
# What may differ between two runs of one job: when and how long it ran, where it wrote, and
# whether its HF capture came from the cache.
VOLATILE = {"started", "seconds", "gate_phase", "plot", "hf_cache"}


def judged(report: dict[str, Any]) -> dict[str, Any]:
    """A report without its timings: every verdict, token and KL figure stays."""
    meta = {k: v for k, v in report["meta"].items() if k not in VOLATILE}
    return {**report, "meta": meta}


def reports(folder: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for path in folder.glob("*.json"):
        r = json.loads(path.read_text())
        out[r["meta"]["deployment"]] = judged(r)
    return out


def run(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, str(VERIFY_RUNNER), *args],
        env=verify_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def checkpoints() -> None:
    from conftest import STORE, missing_model

    for d in ("smollm2-135m-instruct", "gemma3-270m"):
        if not (STORE / d / "config.json").is_file():
            missing_model(f"no checkpoint {STORE / d}: run `make fetch`")


def test_sweep_reports_equal_the_local_runs(
    checkpoints: None, gate_run: Any, tmp_path: Path
) -> None:
    remote = tmp_path / "ray"
    jobs = [a for d, m, s in JOBS for a in ("--job", f"{d}:{m}:{s}")]
    # The local runs (the session's make-verify runs, shared with test_verify_gate) come first:
    # the sweep's HF phases then judge the same captures from verify/hf_cache.py (HF runs once
    # per job), while every engine phase runs on Ray.
    theirs = {}
    for deployment, _, _ in JOBS:
        local = gate_run(deployment)
        assert local.proc.returncode == 0, local.proc.stdout + local.proc.stderr
        theirs[deployment] = judged(local.report)
    sweep = run(
        ["--ray", *jobs, "--max-prompts", "2", "--threads", "2", "--ray-cpus", "2",
         "--report-dir", str(remote)],
        timeout=600,
    )  # fmt: skip
    out, err = sweep.stdout, sweep.stderr
    assert sweep.returncode == 0, out + err
    assert "sweep: 2/2 jobs passed" in out, out
    ours = reports(remote)
    assert sorted(ours) == ["gemma3_270m", "smollm2_135m"]
    for deployment in ours:
        assert ours[deployment]["verdict"] == "pass"
        # Every verdict, token, top-k list and KL figure, bit for bit.
        assert ours[deployment] == theirs[deployment], deployment


KILLER = """
import os
import signal

from smollm2_135m.verify_adapter import *  # noqa: F403


def build_runner(config, threads=0, weights="", precision="exact"):
    with open({counter!r}, "a") as f:
        f.write("attempt\\n")
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_task_that_kills_its_worker_is_retried_once_then_reported(
    checkpoints: None, tmp_path: Path
) -> None:
    counter = tmp_path / "attempts"
    (tmp_path / "killer_adapter.py").write_text(KILLER.format(counter=str(counter)))
    env_path = str(tmp_path)
    start = time.monotonic()
    p = subprocess.run(
        [PYTHON, str(VERIFY_RUNNER), "--ray", "--runner", "killer_adapter", "--max-prompts", "1",
         "--stage", "1", "--ray-cpus", "2", "--sweep-timeout", "150",
         "--report-dir", str(tmp_path / "r")],
        env={**verify_env(), "PYTHONPATH": env_path + ":" + verify_env()["PYTHONPATH"]},
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    elapsed = time.monotonic() - start
    assert p.returncode == 1, p.stdout + p.stderr
    row = next(ln for ln in p.stdout.splitlines() if ln.startswith("killer_adapter"))
    assert " failed " in row and "worker died" in row, p.stdout
    assert "sweep: 0/1 jobs passed" in p.stdout
    assert counter.read_text().count("attempt") == 2  # the first try and one retry
    assert not list((tmp_path / "r").glob("*.json"))  # nothing judged
    report_line("ray sweep", f"a worker that dies twice: reported failed in {elapsed:.1f} s")


def test_bad_job_is_one_error_line(tmp_path: Path) -> None:
    p = run(["--job", "no_such_deployment:instruct", "--report-dir", str(tmp_path)], timeout=60)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "no_such_deployment" in lines[0]
