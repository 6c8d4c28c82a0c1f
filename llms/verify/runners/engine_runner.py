"""Our side: the engine through its binding module, on the production code path.

``prefill`` and ``decode_step`` call the very ``Session::setup / prefill / decode_step`` that
``make run`` calls (engine/python/module.cpp); there is no verify-only forward pass. ``greedy``
generates through the engine's one ``generate()`` loop, as ``make run`` does, and keeps each
step's logits through its per-sample hook. Prompts
are encoded as the inference driver encodes them (llms/common/inference_driver.cpp): chat
template rendered, then tokenized without added specials; raw text with added specials.
Every engine deployment shares this class; its adapter only says which checkpoint.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from verify.comparators import topk_token_ids
from verify.errors import VerifyError
from verify.runners.records import DecodeStepRecord, PrefillRecord

BINDING = "edgellm_py"
# ISA tiers whose kernels keep activations in fp32 end to end (kernels.h). Any other tier, or
# one this list does not know yet, is judged as a reduced-precision path unless the binding
# says otherwise: a wrong guess then costs sharpness, never a false fail.
FP32_ISAS = ("scalar", "avx2")
FP32_NAMES = ("f32", "fp32", "float32")
FULL_PRECISION_WEIGHTS = ("checkpoint", "bf16", "f16", "f32", "gguf-exact")


def import_built(module: str, what: str) -> ModuleType:
    """A module the CMake build puts in build/python (its target has the module's name), or one
    line saying how to build it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise VerifyError(
            f"cannot import {what} {module} ({e}); build it with "
            f"`cmake --build build --target {module}` and put build/python on PYTHONPATH"
        ) from None


def import_binding() -> ModuleType:
    """The engine's binding module, or one line saying how to build it."""
    return import_built(BINDING, "the engine binding")


class EngineRunner:
    """An ``edgellm_py.Session`` set up once for one checkpoint."""

    name = "edgellm"

    def __init__(
        self,
        model_dir: str | Path,
        threads: int = 0,
        max_context: int | None = None,
        weights: str = "",
        precision: str = "exact",
    ) -> None:
        """``precision`` exact: the gate's fp32 tier (stage 1), whatever the environment says;
        deployed: what ``make run`` runs, the fast default with its EDGELLM_* overrides
        (stage 2)."""
        if precision not in ("exact", "deployed"):
            raise VerifyError(f"engine precision {precision!r}: expected exact or deployed")
        self._py = import_binding()
        self.model_dir = Path(model_dir)
        self.session: Any = self._py.Session()
        self._call(
            self.session.setup,
            str(self.model_dir),
            threads=threads,
            max_context=self._py.DEFAULT_MAX_CONTEXT if max_context is None else max_context,
            weights=weights,
            precision="exact" if precision == "exact" else "",
            use_environment=precision == "deployed",
            # The exact path ignores the precision overrides, never the tier asked for: stage 1
            # under EDGELLM_ISA=avx2 proves the avx2 kernels' logic.
            isa="" if precision == "deployed" else os.environ.get("EDGELLM_ISA", ""),
        )
        self.exec_config = dict(self.session.exec_config)
        self.max_context = int(self.session.max_context)
        self.eos_token_ids = tuple(int(i) for i in self.session.eos_token_ids)
        self.num_layers = int(self.session.num_layers)
        self.isa = str(self.exec_config["isa"])
        self.precision_path, self.precision_tier = precision_of(
            self._py, self.session, self.isa, self.model_dir, weights
        )

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Engine errors (bad checkpoint, position out of range) become one-line VerifyErrors."""
        try:
            return fn(*args, **kwargs)
        except self._py.Error as e:
            raise VerifyError(f"engine: {e}") from None

    def encode_prompt(self, text: str, chat: bool) -> list[int]:
        if chat:
            template = self.session.chat_template
            if not template.available():
                raise VerifyError(
                    f"{self.model_dir}: the engine found no chat template it "
                    "can render, but the prompts were to go through one"
                )
            text = self._call(template.render, [("user", text)], add_generation_prompt=True)
            return [int(i) for i in self._call(self.session.tokenizer.encode, text, False)]
        return [int(i) for i in self._call(self.session.tokenizer.encode, text, True)]

    def decode(self, ids: list[int]) -> str:
        return str(self._call(self.session.tokenizer.decode, [int(i) for i in ids]))

    def prefill(self, tokens: list[int], capture: bool = False) -> PrefillRecord:
        if not capture:
            logits = np.asarray(self._call(self.session.prefill, list(tokens), 0))
            return PrefillRecord(logits=logits, top1=topk_token_ids(logits, 1)[0])
        logits, layers, final = self._call(self.session.prefill_capture, list(tokens))
        logits = np.asarray(logits)
        return PrefillRecord(
            logits=logits,
            top1=topk_token_ids(logits, 1)[0],
            layer_outputs=[np.asarray(layer) for layer in layers],
            final_hidden=np.asarray(final),
        )

    def greedy(
        self, prompt_ids: list[int], n_tokens: int, capture: bool = False
    ) -> tuple[list[int], np.ndarray, PrefillRecord]:
        """The gate's greedy capture through generate(): n_tokens, or up to EOS (inclusive).

        Returns every sampled token (EOS included), the logits each came from [steps, vocab],
        and the prefill's record (its layer outputs with capture=True).
        """
        run = self._call(
            self._py.generate_timed,
            self.session.context,
            [int(i) for i in prompt_ids],
            max_tokens=int(n_tokens),
            record_logits=True,
            capture=capture,
        )
        logits = np.asarray(run.logits, dtype=np.float32)
        tokens = [int(t) for t in run.sampled]
        record = PrefillRecord(logits=logits[0], top1=topk_token_ids(logits[0], 1)[0])
        if capture:
            record.layer_outputs = [np.asarray(layer) for layer in run.layer_outputs]
            record.final_hidden = np.asarray(run.final_hidden)
        return tokens, logits, record

    def prefill_logits(self, tokens: list[int], start_pos: int) -> np.ndarray:
        """[n, vocab]: every position's logits, each as a decode step computes it (stage 2)."""
        return np.asarray(self._call(self.session.prefill_logits, list(tokens), int(start_pos)))

    def decode_step(self, token: int, pos: int) -> DecodeStepRecord:
        logits = np.asarray(self._call(self.session.decode_step, int(token), int(pos)))
        return DecodeStepRecord(logits=logits, top1=topk_token_ids(logits, 1)[0])

    def close(self) -> None:
        self.session = None


def _exact_reference(checkpoint: Path) -> bool:
    """Whether the checkpoint beside a .gguf holds its dequantized values in fp32 (gguf/)."""
    try:
        cfg = json.loads((checkpoint / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and cfg.get("torch_dtype") == "float32"


def precision_of(
    py: ModuleType, session: Any, isa: str, model: Path, quantized_at_setup: str = ""
) -> tuple[str, str]:
    """(what the report shows, the calibrated lens' tier) for the path this session runs.

    The tier is ``fp32`` only when the session's resolved config is exact (fp32 GEMM and
    attention arithmetic, fp32 KV cache and quantized-matmul activations: its ``exec_config``)
    and the weights are the checkpoint's own (not quantized at setup; a .gguf file only where
    HF loads its dequantized values exactly; not f32/f16 values the engine rounded to bf16 at
    load, which the truth reads unrounded); otherwise ``reduced``. Weights quantized at setup
    (``--weights q8_0``) are weights HF never saw: ``requantized``, where the calibrated lens
    only reports.
    """
    cfg = dict(getattr(session, "exec_config", {}) or {})
    weights = "gguf" if model.suffix.lower() == ".gguf" else "checkpoint"
    if weights == "gguf" and _exact_reference(model.parent):
        # HF loads the GGUF's dequantized values exactly (fp32 beside the file): the
        # engine's fp32-activation path multiplies the same weights as the truth.
        weights = "gguf-exact"
    rounded = str(getattr(session, "rounded_weights", "") or "")
    if rounded:
        weights = f"{weights} ({rounded} rounded to bf16 at load)"
    described = cfg.get("description", f"isa {isa}")
    if quantized_at_setup:
        return f"{described}, weights {quantized_at_setup} (quantized at setup)", "requantized"
    path = f"{described}, weights {weights}"
    exact = bool(cfg.get("exact")) and weights in FULL_PRECISION_WEIGHTS
    return path, "fp32" if exact else "reduced"
