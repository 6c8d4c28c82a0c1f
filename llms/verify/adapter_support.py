"""What every verify adapter shares: the deployment descriptor, --model resolution, the config.

A deployment's facts live in llms/<deployment>/deployment.json and its policy (--model
resolution, chat template or raw prompts) in llms/common/deployment.h, reached through its
module edgellm_deployment (the code the edgellm command runs); the model-path rules are the
engine's (edgellm/model_store.h, through the binding). An adapter only points here, so nothing
is written twice.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from verify.errors import VerifyError

REPO_ROOT = Path(__file__).resolve().parents[2]
POLICY = "edgellm_deployment"  # llms/common/python/deployment_module.cpp, in build/python


def _binding() -> Any:
    from verify.runners.engine_runner import import_binding  # one-line error when absent

    return import_binding()


def _policy() -> ModuleType:
    """The deployment policy's module, or one line saying how to build it."""
    from verify.runners.engine_runner import import_built

    return import_built(POLICY, "the deployment module")


def _call(fn: Any, *args: Any) -> Any:
    """Calls into the deployment policy; its errors become one-line VerifyErrors."""
    try:
        return fn(*args)
    except _policy().Error as e:
        raise VerifyError(str(e)) from None


def load_deployment(folder: Path) -> Any:
    """llms/<deployment>/deployment.json, read by the policy (the file make and C++ read)."""
    return _call(_policy().Deployment.load, Path(folder) / "deployment.json")


def model_store() -> Path:
    """$EDGELLM_MODELS, else the source tree's models/: the rule the edgellm command follows."""
    return Path(_policy().model_store())


def checkpoint_dir(model: Path) -> Path:
    """The HF-format directory of a --model path (the engine's rule): itself, or the one
    holding a .gguf file. A GGUF deployment runs the file's quantized matrices in our
    engine; HF (the reference) loads the checkpoint the converter dequantized from it."""
    return Path(_binding().checkpoint_dir(str(model)))


@dataclass
class VerifyConfig:
    """What the gate needs to know about one checkpoint of one deployment."""

    deployment: str
    model_choice: str
    model_dir: Path
    variant: str  # instruct | base: which prompt set, and chat template or raw text
    prompt_format: str  # chat | raw
    max_context: int
    num_layers: int
    vocab_size: int

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["model_dir"] = str(self.model_dir)
        return d


def _read_json(path: Path) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise VerifyError(f"{path}: unreadable ({e})") from None
    if not isinstance(data, dict):
        raise VerifyError(f"{path}: expected a JSON object")
    return data


def load_verify_config(deployment: Any, model_dir: Path, choice: str) -> VerifyConfig:
    """The gate's config from the descriptor and the checkpoint's own files.

    The variant (prompt set) and the prompt format (chat template or raw text) are the
    policy's decision (Deployment.variant / prompt_format), so `make run` and `make verify`
    feed a checkpoint the same way.
    """
    hf_dir = checkpoint_dir(model_dir)
    cfg = _read_json(hf_dir / "config.json")
    text_cfg = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    variant = _call(_policy().Deployment.variant, model_dir, choice)
    prompt_format = _call(deployment.prompt_format, model_dir, choice)
    try:
        positions = int(text_cfg.get("max_position_embeddings") or deployment.max_context)
        num_layers = int(text_cfg["num_hidden_layers"])
        vocab = int(text_cfg["vocab_size"])
    except (KeyError, TypeError, ValueError) as e:
        raise VerifyError(f"{model_dir / 'config.json'}: missing or bad field {e}") from None
    return VerifyConfig(
        deployment=deployment.name,
        model_choice=choice,
        model_dir=model_dir,
        variant=variant,
        prompt_format=prompt_format,
        max_context=min(deployment.max_context, positions),
        num_layers=num_layers,
        vocab_size=vocab,
    )


class StandardAdapter:
    """The adapter contract for a deployment described by its deployment.json alone.

    Its runner is the shared EngineRunner over the production Session::setup / prefill /
    decode_step, so an adapter built from it names nothing but its folder.
    """

    def __init__(self, folder: Path) -> None:
        self.deployment = load_deployment(folder)
        self.choices: dict[str, str] = dict(self.deployment.models)
        self.default_model: str = self.deployment.default_model

    def resolve_model(self, choice: str) -> Path:
        """--model value -> checkpoint directory (store key or path); one-line error if absent."""
        return Path(_call(self.deployment.resolve_model, choice)).resolve()

    def hf_reference(self, model_dir: Path) -> str:
        """HF loads the very directory our engine loads (no hub is reachable here); for a
        GGUF, the checkpoint dequantized from it."""
        return str(checkpoint_dir(model_dir))

    def build_config(self, model_dir: Path, choice: str) -> VerifyConfig:
        return load_verify_config(self.deployment, model_dir, choice)

    def build_runner(
        self, config: VerifyConfig, threads: int = 0, weights: str = "", precision: str = "exact"
    ) -> Any:
        """ONE-TIME setup of our engine on the checkpoint (map, pre-pack, KV cache);
        ``weights`` q8_0|q4_0 quantizes its matrices at setup (empty: as stored);
        ``precision`` exact (stage 1) or deployed (stage 2: what ``make run`` runs)."""
        from verify.runners.engine_runner import EngineRunner  # needs the built binding

        return EngineRunner(
            config.model_dir,
            threads=threads,
            max_context=config.max_context,
            weights=weights,
            precision=precision,
        )


def adapter_module(adapter_file: str) -> dict[str, Any]:
    """The verify-adapter contract of the deployment whose folder holds ``adapter_file``.

    A deployment's verify_adapter.py is ``globals().update(adapter_module(__file__))``.
    """
    a = StandardAdapter(Path(adapter_file).resolve().parent)
    return {
        "DEPLOYMENT": a.deployment.name,
        "MODEL_CHOICES": a.choices,
        "DEFAULT_MODEL": a.default_model,
        "resolve_model": a.resolve_model,
        "hf_reference": a.hf_reference,
        "build_config": a.build_config,
        "build_runner": a.build_runner,
    }
