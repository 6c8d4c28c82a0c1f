"""kernel_registry/supported_kernels.md is generated from the engine's kernel table and the
deployments' descriptors, and EDGELLM_ISA picks the tier the engine reports."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import edgellm_deployment
import edgellm_py  # a missing binding is a failure (conftest), never a skip

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "kernel_registry"))
import generate  # noqa: E402

TIERS = ["scalar", "avx2", "avx512", "amx"]
DEPLOYMENTS = generate.load_deployments(edgellm_deployment)


def test_registry_table_is_generated_from_the_kernel_table() -> None:
    text = generate.REGISTRY.read_text()
    assert generate.updated(text, edgellm_py.kernel_table(), DEPLOYMENTS) == text, (
        "supported_kernels.md is stale: run .venv/bin/python kernel_registry/generate.py"
    )


def test_generated_table_follows_the_engine() -> None:
    # A kernel or path the engine gains appears in the table without a hand edit.
    table = edgellm_py.kernel_table()
    table.append({**table[0], "name": "new_kernel", "paths": ["scalar", "amx"]})
    rendered = generate.render(table, DEPLOYMENTS)
    assert "| `new_kernel` |" in rendered and "scalar, amx" in rendered
    names = [k["name"] for k in edgellm_py.kernel_table()]
    assert names == [name for name, _ in edgellm_py.registered_kernels()]


def test_used_by_comes_from_the_descriptors() -> None:
    """The engine names no deployment; "Used by" is each descriptor's answer to `used_when`."""
    deployments = {p.name for p in (REPO / "llms").iterdir() if (p / "Makefile").exists()}
    assert {d.name for d in DEPLOYMENTS} == deployments
    for k in edgellm_py.kernel_table():
        assert not any(name in k["used_when"] for name in deployments), k
        # "deployment" or "deployment (qualifier)", e.g. "smollm2_135m (MODEL=gguf)"
        users = generate.used_by(k["used_when"], DEPLOYMENTS)
        if not users:  # the activation of a family no deployment runs yet (gpt-oss's)
            assert k["used_when"].startswith("hidden_act "), k
            assert "scalar" in k["paths"], k
            continue
        used = {u.split("(")[0].strip() for u in users.split(",")}
        assert used and used <= deployments, f"{k['name']}: unknown deployment in {used}"
        assert set(k["paths"]) <= set(TIERS) and "scalar" in k["paths"], k
    by_act = {a: generate.used_by(f"hidden_act {a}", DEPLOYMENTS) for a in ("silu", "gelu_tanh")}
    assert "gemma3_270m" in by_act["gelu_tanh"] and "gemma3_270m" not in by_act["silu"]
    assert "smollm2_135m (MODEL=gguf)" in generate.used_by(generate.QUANTIZED, DEPLOYMENTS)


def binding_call_with(env_values: dict[str, str], call: str) -> tuple[str, str]:
    """(edgellm_py.<call>(), stderr) of a fresh process with the given EDGELLM_* variables."""
    env = {**os.environ, **env_values}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "build" / "python"), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", f"import edgellm_py; print(edgellm_py.{call}())"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return proc.stdout.strip(), proc.stderr


def active_isa_with(env_value: str) -> tuple[str, str]:
    """(active_isa(), stderr) of a fresh process with EDGELLM_ISA=env_value."""
    return binding_call_with({"EDGELLM_ISA": env_value}, "active_isa")


def test_edgellm_isa_selects_each_supported_tier() -> None:
    detected = edgellm_py.detected_isa()
    for tier in TIERS:
        active, err = active_isa_with(tier)
        if TIERS.index(tier) <= TIERS.index(detected):
            # (a CPU whose OS denies a tier says so once at detection: not an EDGELLM_ISA line)
            assert active == tier and "EDGELLM_ISA" not in err, (tier, active, err)
        else:  # one stderr line, then the best tier there is
            assert active == detected, (tier, active)
            lines = [ln for ln in err.splitlines() if "EDGELLM_ISA" in ln]
            assert len(lines) == 1 and f"EDGELLM_ISA={tier} is not supported" in lines[0], err


def test_edgellm_isa_unknown_value_is_one_line_and_the_default() -> None:
    default, _ = active_isa_with("")
    assert default == edgellm_py.detected_isa()  # the best tier, AMX included
    for bad in ["avx", "AVX2", "native"]:
        active, err = active_isa_with(bad)
        assert active == default, (bad, active)
        lines = [ln for ln in err.splitlines() if "EDGELLM_ISA" in ln]
        assert len(lines) == 1 and f"unknown EDGELLM_ISA={bad}" in lines[0], err


def test_exec_config_names_what_the_prefill_gemm_computes(smollm2_checkpoint: Path) -> None:
    # The gate's precision tier reads this: f32 only where x reaches the products exactly
    # (amx at fp32 splits x into three bf16 parts, which hold it exactly).
    detected = TIERS.index(edgellm_py.detected_isa())
    for isa in TIERS[: detected + 1]:
        simd = TIERS.index(isa) >= TIERS.index("avx512")
        want = {
            "fp32": "f32",
            "bf16x2": "bf16x2" if isa == "amx" else "f32",
            "bf16": "bf16" if simd else "f32",
        }
        for precision, dtype in want.items():
            session = edgellm_py.Session()
            session.setup(
                str(smollm2_checkpoint),
                threads=1,
                max_context=16,
                isa=isa,
                gemm_precision=precision,
            )
            assert session.exec_config["gemm"] == dtype, (isa, precision)
            assert session.exec_config["isa"] == isa


def test_environment_is_a_front_end_default(smollm2_checkpoint: Path) -> None:
    # EDGELLM_* fill what the caller left empty, only where it asks for them; a bad value is
    # one error naming the option.
    code = (
        "import edgellm_py, sys; s = edgellm_py.Session()\n"
        "try:\n"
        f"    s.setup({str(smollm2_checkpoint)!r}, threads=1, max_context=16, "
        "use_environment=sys.argv[1] == 'env')\n"
        "    print(s.exec_config['description'])\n"
        "except edgellm_py.Error as e:\n"
        "    print('error:', e)\n"
    )

    def described(env_values: dict[str, str], use: str) -> str:
        env = {**os.environ, **env_values}
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO / "build" / "python"), env.get("PYTHONPATH", "")]
        )
        return subprocess.run(
            [sys.executable, "-c", code, use],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.strip()

    assert described({"EDGELLM_PRECISION": "exact"}, "env").startswith("exact (")
    assert described({"EDGELLM_PRECISION": "exact"}, "no").startswith("fast (")
    assert "KV fp32" in described({"EDGELLM_KV_CACHE": "fp32"}, "env")
    assert described({"EDGELLM_KV_CACHE": "fp16"}, "env") == (
        "error: --kv-cache (EDGELLM_KV_CACHE) fp16: expected fp32, bf16 or q8_0"
    )


def test_only_the_exact_path_is_judged_at_the_fp32_tier(smollm2_checkpoint: Path) -> None:
    # The calibrated gate's fp32 tier (1e-5 x the floor) holds only for the exact path; any
    # rounded part (here a bf16 KV cache on an otherwise exact path) makes it reduced.
    from verify.runners.engine_runner import precision_of

    tiers = {}
    for kv_cache in ("", "bf16"):
        session = edgellm_py.Session()
        session.setup(
            str(smollm2_checkpoint),
            threads=1,
            max_context=64,
            kv_cache=kv_cache,
            precision="exact",
        )
        path, tiers[kv_cache] = precision_of(
            edgellm_py, session, session.exec_config["isa"], smollm2_checkpoint
        )
        assert f"KV {session.kv_cache_dtype}" in path, path
    assert tiers == {"": "fp32", "bf16": "reduced"}
