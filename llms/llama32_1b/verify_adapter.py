"""Llama-3.2-1B verify adapter: names the checkpoints; everything else is shared.

``fixture`` is the seeded random-initialised checkpoint of the real config
(``make -C llms/llama32_1b fixture``); a user with the real weights passes
``MODEL=/path/to/Llama-3.2-1B-Instruct`` and the identical gate runs on them.
Random weights give near-flat distributions, so benign top-1 flips are common
there; the gate is never loosened for that.
"""

from __future__ import annotations

from pathlib import Path

from verify.adapter_support import VerifyConfig, load_verify_config, resolve_checkpoint
from verify.runners.engine_runner import EngineRunner

DEPLOYMENT = "llama32_1b"
MODEL_CHOICES = {"fixture": "llama32-1b-fixture"}
DEFAULT_MODEL = "fixture"


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
