"""The smollm2_135m deployment passes the verify gate, end to end through the CLI.

Runs what `make -C llms/smollm2_135m verify` runs (2 prompts x 32 tokens, top-5), with the
teacher-forced lens gating too (--all-steps, as CI does), in the default auto phase mode:
HF and our engine each in a process of their own. Then diagnosis: informational, exit 0.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import PYTHON, REPO, SMOLLM2_DIR, VERIFY_RUNNER, verify_env

ADAPTER = "smollm2_135m.verify_adapter"
GEMMA_DIR = SMOLLM2_DIR.parent / "gemma3-270m"


def run_verify(
    *args: str, timeout: int = 600, adapter: str = ADAPTER
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, str(VERIFY_RUNNER), f"--runner={adapter}", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=verify_env(),
        cwd=REPO,
    )


def report_of(proc: subprocess.CompletedProcess[str], report_dir: Path) -> dict[str, Any]:
    (path,) = report_dir.glob("*.json")
    return json.loads(path.read_text())


def test_smollm2_passes_the_gate(
    smollm2_checkpoint: Path, engine_binding: Any, tmp_path: Path
) -> None:
    proc = run_verify(
        "--prompts",
        "topk_token",
        "--model",
        "instruct",
        "--max-prompts",
        "3",
        "--all-steps",
        "--report-dir",
        str(tmp_path),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = proc.stdout.strip().splitlines()[-1]
    assert "PASS" in summary and "first-divergence 3/3" in summary, summary
    report = report_of(proc, tmp_path)
    assert report["verdict"] == "pass"
    assert report["meta"]["prompt_format"] == "chat" and report["meta"]["all_steps"] is True
    assert [p["failed"] for p in report["prompts"]] == [False, False, False]
    assert all(p["teacher_forced"]["steps"] == 32 for p in report["prompts"])
    assert len(list(tmp_path.glob("*.md"))) == 1


def test_diagnosis_prints_the_layer_table(
    smollm2_checkpoint: Path, engine_binding: Any, tmp_path: Path
) -> None:
    proc = run_verify("--prompts", "single", "--model", "instruct", "--report-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    n_layers = json.loads((smollm2_checkpoint / "config.json").read_text())["num_hidden_layers"]
    rows = [ln for ln in proc.stdout.splitlines() if ln.startswith("| layer ")]
    assert len(rows) == n_layers
    assert "| final norm |" in proc.stdout and "DIAGNOSIS" in proc.stdout
    layers = report_of(proc, tmp_path)["prompts"][0]["layers"]
    assert len(layers) == n_layers + 2 and all(-1.0 <= s["cos_min"] <= 1.0 for s in layers)


def test_gemma3_base_passes_the_gate(engine_binding: Any, tmp_path: Path) -> None:
    """The second family on real weights: raw base prompts, the identical gate."""
    if not (GEMMA_DIR / "config.json").is_file():
        pytest.skip(f"no checkpoint at {GEMMA_DIR}: run `make fetch`")
    proc = run_verify(
        "--prompts",
        "topk_token",
        "--model",
        "base",
        "--max-prompts",
        "2",
        "--all-steps",
        "--report-dir",
        str(tmp_path),
        adapter="gemma3_270m.verify_adapter",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = report_of(proc, tmp_path)
    assert report["verdict"] == "pass" and report["meta"]["prompt_format"] == "raw"
