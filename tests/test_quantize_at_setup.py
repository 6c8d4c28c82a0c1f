"""--weights q8_0|q4_0 multiplies exactly the weights gguf-py's quantizer gives.

HF fp32 runs the checkpoint with every matrix rounded through gguf-py's own Q8_0 / Q4_0
quantize + dequantize (ggml's reference rounding); our engine quantizes the same matrices at
setup. Same weights, so the logits agree to fp32 rounding (~1e-6), while the rounding itself
moves them by ~1e-2 (checked too, so the comparison can tell the two apart).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

IDS = list(range(1000, 1040))


def hf_logits(model_dir: Path, quant: str | None) -> np.ndarray:
    import gguf
    import torch
    import transformers

    torch.set_num_threads(2)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if quant:
        qtype = getattr(gguf.GGMLQuantizationType, quant.upper())
        with torch.no_grad():  # the matrices the engine quantizes: 2-D, rows of 32s
            for p in model.parameters():
                if p.dim() == 2 and p.shape[1] % 32 == 0:
                    w = p.numpy()
                    q = gguf.quants.dequantize(gguf.quants.quantize(w, qtype), qtype)
                    p.copy_(torch.from_numpy(q.reshape(w.shape)))
    with torch.no_grad():
        return model(torch.tensor([IDS])).logits[0].numpy()


def ours_logits(engine_binding: Any, model_dir: Path, weights: str) -> np.ndarray:
    s = engine_binding.Session()
    s.setup(str(model_dir), threads=2, max_context=64, weights=weights, precision="exact")
    rows = [np.array(s.prefill(IDS[:8]))]  # prefill, then one decode step per position
    for pos in range(8, len(IDS)):
        rows.append(np.array(s.decode_step(IDS[pos], pos)))
    return np.stack(rows)


@pytest.mark.parametrize("quant", ["q8_0", "q4_0"])
def test_quantized_at_setup_matches_hf_on_the_same_rounding(
    engine_binding: Any, smollm2_checkpoint: Path, quant: str
) -> None:
    ours = ours_logits(engine_binding, smollm2_checkpoint, quant)
    hf = hf_logits(smollm2_checkpoint, quant)[7:]  # positions 7..39, as ours
    plain = hf_logits(smollm2_checkpoint, None)[7:]

    def rel(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.linalg.norm(a - b) / np.linalg.norm(b))

    assert rel(ours, hf) < 1e-4, rel(ours, hf)  # the same weights
    assert rel(plain, hf) > 1e-3, rel(plain, hf)  # the rounding is visible at this scale
