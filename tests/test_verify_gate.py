"""The deployments pass the verify gate, end to end through the CLI.

Runs what `make -C llms/smollm2_135m verify` runs (2 prompts x 32 tokens, every default lens: first
divergence, teacher-forced top-5, the calibrated KL lens), in the default auto phase mode:
HF bf16, HF fp32 and our engine each in a process of their own. Then --spec-gate (the seed's
gate alone), the held-out prompts, and diagnosis: informational, exit 0, with its plot.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from conftest import PYTHON, REPO, VERIFY_RUNNER, verify_env

ADAPTER = "smollm2_135m.verify_adapter"


def run_verify(
    *args: str, timeout: int = 600, adapter: str = ADAPTER, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, str(VERIFY_RUNNER), f"--runner={adapter}", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**verify_env(), **(env or {})},
        cwd=REPO,
    )


def report_of(proc: subprocess.CompletedProcess[str], report_dir: Path) -> dict[str, Any]:
    (path,) = report_dir.glob("*.json")
    return json.loads(path.read_text())


def test_smollm2_passes_the_gate(gate_run: Any) -> None:
    run = gate_run("smollm2_135m")  # make verify's settings, HF really run (conftest)
    proc, report = run.proc, run.report
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = proc.stdout.strip().splitlines()[-1]
    assert "PASS" in summary and "first-divergence 2/2 (gating)" in summary, summary
    assert "teacher-forced 2/2 (gating" in summary and "calibrated 2/2 (gating" in summary
    assert "bf16 floor mean" in summary, summary
    assert report["verdict"] == "pass" and report["meta"]["prompt_format"] == "chat"
    assert report["meta"]["truth_runner"] == "hf-transformers-fp32"
    assert "reference stored" in report["meta"]["hf_cache"], report["meta"]["hf_cache"]
    assert "truth stored" in report["meta"]["hf_cache"], report["meta"]["hf_cache"]
    assert [p["failed"] for p in report["prompts"]] == [False, False]
    for p in report["prompts"]:
        assert p["teacher_forced"]["steps"] == p["calibrated"]["steps"] == 32
        assert p["gating"] == ["tokenizer", "non-finite", "first-divergence", "teacher-forced",
                               "calibrated"]  # fmt: skip
        # The floor is real bf16 noise, and ours is below the tier's margin of it.
        assert p["calibrated"]["floor_mean"] > 0 and p["calibrated"]["passed"]
    assert len(list(run.report_dir.glob("*.md"))) == 1
    # Stage 2: the deployed (fast) path against the exact one, within HF's own bf16 floor.
    assert "stage 1 (logic: exact path vs HF): PASS" in summary, summary
    assert "stage 2 (deployed arithmetic vs exact): PASS" in summary, summary
    s2 = report["stage2"]
    assert s2["passed"] and s2["deployed"].startswith("fast ("), s2
    assert s2["corpus"]["n"] > 5000 and s2["prompts"]["n"] == 2 * 32, s2
    for where, floor in (("corpus", "corpus_floor"), ("prompts", "prompts_floor")):
        assert 0 < s2[where]["mean"] <= s2[floor]["mean"], s2  # really rounded, within budget
        assert s2[where]["p99"] <= s2[floor]["p99"], s2
    assert s2["floor_source"].startswith("stage2_budget.json"), s2


def test_stage2_fails_a_deployed_path_out_of_budget(
    smollm2_checkpoint: Path, engine_binding: Any, tmp_path: Path
) -> None:
    """The gate's stage 2 must be able to fail: int8 activations on quantized weights (the
    opt-in stage 2 keeps out of the default) sit ~10x the floor; stage 1, on the exact path,
    is unaffected by the deployed path's environment."""
    proc = run_verify(
        *("--max-prompts", "1", "--weights", "q4_0", "--report-dir", str(tmp_path)),
        env={"EDGELLM_QUANT_PRECISION": "int8"},
    )
    report = report_of(proc, tmp_path)
    s2 = report["stage2"]
    assert not s2["passed"] and "quantized activations int8" in s2["deployed"], s2
    assert any("KLD" in f for f in s2["failures"]), s2
    assert "stage 2 (deployed arithmetic vs exact): FAIL" in proc.stdout, proc.stdout
    assert "quantized activations fp32" in report["meta"]["precision_path"]  # stage 1: exact
    assert proc.returncode == 1, proc.stdout + proc.stderr


def test_weights_quantized_at_setup_are_judged_as_requantized(
    smollm2_checkpoint: Path, engine_binding: Any, tmp_path: Path
) -> None:
    """--weights q8_0 (make verify WEIGHTS=q8_0) runs the gate on the weights quantized at
    setup: the report names them, the calibrated lens only reports (HF never saw them), the
    token lenses still gate, and the KL shows the quantization really ran."""
    proc = run_verify(
        *("--prompts", "topk_token", "--model", "instruct", "--max-prompts", "1"),
        *("--weights", "q8_0", "--report-dir", str(tmp_path), "--stage", "1"),
    )
    report = report_of(proc, tmp_path)
    assert report["meta"]["precision_tier"] == "requantized", report["meta"]
    assert "weights q8_0 (quantized at setup)" in report["meta"]["precision_path"]
    (p,) = report["prompts"]
    assert p["gating"] == ["tokenizer", "non-finite", "first-divergence", "teacher-forced"]
    assert not p["calibrated"]["gating"] and p["calibrated"]["tier"] == "requantized"
    # The unquantized engine sits at ~1e-8 x the floor; 8-bit weights are visible above it.
    assert p["calibrated"]["ratio_mean"] > 1e-3, p["calibrated"]
    assert proc.returncode == (1 if report["verdict"] == "fail" else 0), proc.stderr


def test_spec_gate_is_the_seeds_gate(
    smollm2_checkpoint: Path, engine_binding: Any, tmp_path: Path
) -> None:
    """The seed's gate alone; run twice, the second run judges the cached HF capture (and
    only that: the engine runs again) to the very same report."""
    reports = []
    for run, extra in (("fresh", ["--fresh-reference"]), ("cached", [])):
        out = tmp_path / run
        proc = run_verify(
            "--max-prompts", "1", "--spec-gate", "--report-dir", str(out), "--stage", "1", *extra
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        summary = proc.stdout.strip().splitlines()[-1]
        assert "first-divergence 1/1 (gating)" in summary, summary
        assert "(informational" in summary and "calibrated" not in summary, summary
        report = report_of(proc, out)
        assert report["meta"]["truth_runner"].startswith("not run")
        assert report["prompts"][0]["gating"] == ["first-divergence"]
        reports.append(report)
    fresh, cached = reports
    assert fresh["meta"]["hf_cache"].startswith("reference stored"), fresh["meta"]
    assert cached["meta"]["hf_cache"].startswith("reference reused"), cached["meta"]
    assert cached["meta"]["seconds"]["engine"] > 0  # our side is measured every run
    assert cached["prompts"] == fresh["prompts"]


def test_held_out_prompts_do_not_fail(
    smollm2_checkpoint: Path, engine_binding: Any, tmp_path: Path
) -> None:
    """Prompts no margin was chosen on: a correct engine must pass every lens there too."""
    held_out = REPO / "llms" / "verify" / "prompts" / "heldout_instruct.txt"
    proc = run_verify(
        "--prompts-file", str(held_out), "--max-prompts", "2", "--report-dir", str(tmp_path),
        "--stage", "1",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_diagnosis_prints_the_layer_table(
    smollm2_checkpoint: Path, engine_binding: Any, tmp_path: Path
) -> None:
    prompt = "Name three colours of the rainbow."
    proc = run_verify(
        "--prompts", "single", "--prompt", prompt, "--report-dir", str(tmp_path)
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    n_layers = json.loads((smollm2_checkpoint / "config.json").read_text())["num_hidden_layers"]
    rows = [ln for ln in proc.stdout.splitlines() if ln.startswith("| layer ")]
    assert len(rows) == n_layers
    assert "| final norm |" in proc.stdout and f"prompt: {prompt}" in proc.stdout
    assert "fp32 cos min" in proc.stdout and "bf16 cos min" in proc.stdout
    summary = proc.stdout.strip().splitlines()[-1]
    assert summary.startswith("diagnosis smollm2_135m") and "PASS" not in summary, summary
    report = report_of(proc, tmp_path)
    layers, truth = report["prompts"][0]["layers"], report["prompts"][0]["layers_truth"]
    assert len(layers) == len(truth) == n_layers + 2
    if report["meta"]["precision_tier"] == "fp32":
        # Against fp32 our fp32 path is orders of magnitude closer than against bf16.
        assert max(s["rel_err"] for s in truth) < 0.01 * min(s["rel_err"] for s in layers)
    md = next(tmp_path.glob("*.md")).read_text()
    assert md.startswith("# diagnosis smollm2_135m") and "verify PASS" not in md
    (png,) = tmp_path.glob("*.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"]({png.name})" in md


def test_gemma3_base_passes_the_gate(gate_run: Any) -> None:
    """The second family on real weights: raw base prompts, the identical gate."""
    run = gate_run("gemma3_270m")
    assert run.proc.returncode == 0, run.proc.stdout + run.proc.stderr
    report = run.report
    assert report["verdict"] == "pass" and report["meta"]["prompt_format"] == "raw"
    assert [p["failed"] for p in report["prompts"]] == [False, False]
    assert report["stage2"]["passed"], report["stage2"]
