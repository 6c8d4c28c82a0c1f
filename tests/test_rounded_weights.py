"""f32 / f16 weights the engine rounds to bf16 at load are said so, and gated as bf16 weights.

The engine holds weight matrices in bf16. A checkpoint stored in f32 (or f16) whose values are
all bf16 ones (the family fixtures) is held exactly, silently, and judged at verify's fp32 tier.
One whose values bf16 cannot hold is rounded: setup says so on stderr, Session.rounded_weights
names the dtype, and verify's engine runner judges it at the reduced tier, where the calibrated
lens passes it; at the fp32 tier (what it was judged at before) the same logits fail, since the
fp32 truth reads the unrounded weights.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from conftest import REPO
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(REPO / "llms"))
from verify.comparators import calibrated_check  # noqa: E402
from verify.runners.engine_runner import EngineRunner  # noqa: E402

TOKENS = [1, 504, 3101, 42, 77, 19000, 8, 260, 4431, 12, 999, 31]


def off_the_bf16_grid(model: Path) -> None:
    """Every matrix scaled by 1 + 2^-12: f32 values bf16 (8 significant bits) cannot hold."""
    for f in sorted(model.glob("*.safetensors")):
        tensors = load_file(str(f))
        for name, t in tensors.items():
            if t.dim() == 2:
                tensors[name] = (t.float() * (1 + 2**-12)).contiguous()
        save_file(tensors, str(f), metadata={"format": "pt"})


def engine_logits(runner: EngineRunner) -> list[np.ndarray]:
    """Our exact path's logits after each prefix of TOKENS (teacher-forced steps)."""
    return [runner.prefill(TOKENS[: i + 1]).logits for i in range(len(TOKENS))]


def hf_logits(model: Path, dtype: torch.dtype) -> list[np.ndarray]:
    m = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=dtype)
    with torch.no_grad():
        out = m(torch.tensor([TOKENS])).logits[0].float().numpy()
    return list(out)


@pytest.fixture(scope="module")
def fixtures(family_fixture: Any) -> tuple[Path, Path]:
    """(llama-tiny as written: f32 holding bf16 values, the same off the bf16 grid)."""
    exact, rounded = family_fixture("llama-tiny"), family_fixture("llama-tiny")
    off_the_bf16_grid(rounded)
    return exact, rounded


def test_f32_weights_are_rounded_out_loud(
    fixtures: tuple[Path, Path], engine_binding: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    exact, rounded = fixtures
    session = engine_binding.Session()
    session.setup(str(exact), threads=2, max_context=64)
    assert session.rounded_weights == "", "bf16 values in an f32 file are held exactly"
    assert "rounded" not in capfd.readouterr().err
    session.setup(str(rounded), threads=2, max_context=64)
    assert session.rounded_weights == "F32"
    err = capfd.readouterr().err
    assert f"note: {rounded}: its F32 weight matrices" in err and "rounded to bf16" in err, err


def test_rounded_weights_are_gated_as_bf16_and_pass(
    fixtures: tuple[Path, Path], engine_binding: Any
) -> None:
    exact, rounded = fixtures
    held = EngineRunner(exact, threads=2, max_context=64)
    assert held.precision_tier == "fp32", held.precision_path
    runner = EngineRunner(rounded, threads=2, max_context=64)
    assert runner.precision_tier == "reduced", runner.precision_path
    assert "F32 rounded to bf16 at load" in runner.precision_path, runner.precision_path
    ours = engine_logits(runner)
    truth, floor = hf_logits(rounded, torch.float32), hf_logits(rounded, torch.bfloat16)
    judged = calibrated_check(truth, floor, ours, runner.precision_tier)
    assert judged.passed and judged.gating, judged.reason
    # What the fp32 tier said of the same logits: the truth reads the unrounded weights.
    assert not calibrated_check(truth, floor, ours, "fp32").passed
