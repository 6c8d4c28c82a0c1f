"""Each family switch of the forward pass against transformers, on tiny random fixtures.

The engine (through the binding, i.e. the production prefill/decode_step) and
HF transformers in fp32 read the same bf16 weights, so logits must agree to
fp32 rounding at every position: prefill of a prompt, then KV-cached decode
steps past the sliding window. This covers what no real checkpoint here
exercises: Qwen2's QKV bias, Qwen3's QK-norm, llama3 RoPE scaling, untied heads.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "build" / "python"))
edgellm_py = pytest.importorskip("edgellm_py", reason="binding not built (make build)")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

FIXTURES = ["llama-tiny", "qwen2-tiny", "qwen3-tiny", "gemma3-tiny"]
TOKENS = [1, 504, 3101, 42, 77, 19000, 8, 260, 4431, 12, 999, 31, 5, 48000, 600, 2, 7, 300]
PROMPT_LEN = 5


@pytest.fixture(scope="module", params=FIXTURES)
def fixture_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp(request.param)
    subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "make_fixture.py"),
            request.param,
            "--out",
            str(out),
        ],
        check=True,
        capture_output=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    return out


def hf_logits(model_dir: Path) -> np.ndarray:
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    embed = model.model.embed_tokens
    if hasattr(embed, "embed_scale"):
        # HF casts Gemma's sqrt(hidden) to the weight dtype; the bf16 deployments see the
        # bf16-rounded scale, which is what the engine uses. Match it in this fp32 run.
        embed.embed_scale.copy_(embed.embed_scale.to(torch.bfloat16).float())
    with torch.no_grad():
        out = model(torch.tensor([TOKENS]))
    return out.logits[0].numpy()


def test_prefill_and_decode_match_transformers(fixture_dir: Path) -> None:
    ref = hf_logits(fixture_dir)
    session = edgellm_py.Session()
    session.setup(str(fixture_dir), threads=2, max_context=64)
    ours = [session.prefill(TOKENS[:PROMPT_LEN])]
    for pos in range(PROMPT_LEN, len(TOKENS)):
        ours.append(session.decode_step(TOKENS[pos], pos))
    scale = float(np.abs(ref).max())
    for i, logits in enumerate(ours):
        pos = PROMPT_LEN - 1 + i
        err = float(np.abs(logits - ref[pos]).max())
        assert err <= 2e-4 * scale, (
            f"{fixture_dir.name} position {pos}: max |diff| {err:.3g} vs scale {scale:.3g}"
        )
        assert int(np.argmax(logits)) == int(np.argmax(ref[pos])), (
            f"{fixture_dir.name} top-1 at {pos}"
        )
