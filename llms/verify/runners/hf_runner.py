"""The reference side: HuggingFace transformers on the CPU, in bf16 or fp32.

bf16 is the seed's gate reference: greedy prefill, then KV-cached decode steps, exactly as
``generate(do_sample=False)`` does it. fp32 on the same checkpoint is the "truth" the
calibrated lens measures against: our engine computes in fp32 on the same weights, so it
should match it to rounding. For diagnosis either precision also captures each decoder
layer's block output and the post-final-norm hidden state.
torch and transformers are imported here only, so the engine-side phase never pays for them.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from verify.comparators import topk_token_ids
from verify.errors import VerifyError
from verify.runners.records import DecodeStepRecord, PrefillRecord

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


# name -> (weights dtype, autocast dtype or None). "bf16-autocast" is fp32 weights with every
# matmul in bf16 and fp32 accumulation: the precision of a bf16-activation (AMX) engine, used
# by calibrate.py to see where such an engine lands against the floor.
PRECISIONS = {
    "bf16": ("bfloat16", None),
    "fp32": ("float32", None),
    "bf16-autocast": ("float32", "bfloat16"),
}


class HfRunner:
    """transformers AutoModelForCausalLM in bf16 or fp32; the model loads on first use.

    Why lazily: the prompts are tokenized and checked against the context first, so a bad
    prompt fails in a second, not after the model has loaded.
    """

    def __init__(
        self,
        model_ref: str | Path,
        max_context: int,
        threads: int = 0,
        precision: str = "bf16",
        attn_implementation: str | None = None,
    ) -> None:
        import torch
        import transformers
        from transformers import AutoTokenizer

        transformers.logging.set_verbosity_error()
        if threads > 0:
            torch.set_num_threads(threads)
        self._torch = torch
        if precision not in PRECISIONS:
            raise VerifyError(
                f"HF precision {precision!r}: expected one of {', '.join(PRECISIONS)}"
            )
        self.precision = precision
        self._attn = attn_implementation
        self.name = f"hf-transformers-{precision}" + (f"-{self._attn}" if self._attn else "")
        self.model_ref = str(model_ref)
        self.max_context = max_context
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.model_ref)
        except Exception as e:  # any load failure is a bad checkpoint: say it in one line
            raise VerifyError(
                f"HF transformers cannot load the tokenizer of {self.model_ref}: {_first_line(e)}"
            ) from None
        self._model: Any = None
        self._cache: Any = None
        self._cache_len = 0
        self._last_layer_out: Any = None
        eos = getattr(self.tokenizer, "eos_token_id", None)
        self.eos_token_ids: tuple[int, ...] = (eos,) if isinstance(eos, int) else ()

    # --- model --------------------------------------------------------------------------------

    @property
    def model(self) -> Any:
        if self._model is None:
            from transformers import AutoModelForCausalLM

            try:
                extra = {"attn_implementation": self._attn} if self._attn else {}
                model = AutoModelForCausalLM.from_pretrained(
                    self.model_ref,
                    dtype=getattr(self._torch, PRECISIONS[self.precision][0]),
                    **extra,
                )
            except Exception as e:  # any load failure is a bad checkpoint: say it in one line
                raise VerifyError(
                    f"HF transformers cannot load {self.model_ref}: {_first_line(e)}"
                ) from None
            self._model = model.eval()
            if self.precision != "bf16":
                _round_scalar_buffers_like_bf16(model, self._torch)
            eos = model.generation_config.eos_token_id
            ids = [eos] if isinstance(eos, int) else list(eos or [])
            self.eos_token_ids = tuple(sorted({*ids, *self.eos_token_ids}))
            # HF's last hidden_states entry is after the final norm; our layer capture is
            # before it, so hook the last decoder layer for the pre-norm value.
            model.model.layers[-1].register_forward_hook(self._hook_last_layer)
        return self._model

    def _autocast(self) -> Any:
        dtype = PRECISIONS[self.precision][1]
        torch = self._torch
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast("cpu", dtype=getattr(torch, dtype))

    def _hook_last_layer(self, _module: Any, _inputs: Any, output: Any) -> None:
        self._last_layer_out = output[0] if isinstance(output, tuple) else output

    @property
    def attn_implementation(self) -> str:
        return str(getattr(self.model.config, "_attn_implementation", "unknown"))

    # --- the Runner protocol ----------------------------------------------------------------

    def encode_prompt(self, text: str, chat: bool) -> list[int]:
        if chat:
            if not getattr(self.tokenizer, "chat_template", None):
                raise VerifyError(
                    f"{self.model_ref} has no chat template, but the prompts were to go through one"
                )
            text = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
            )
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return list(self.tokenizer(text, add_special_tokens=True)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def prefill(self, tokens: list[int], capture: bool = False) -> PrefillRecord:
        torch = self._torch
        from transformers import DynamicCache

        model = self.model
        self._cache = DynamicCache()
        with torch.inference_mode(), self._autocast():
            out = model(
                input_ids=torch.tensor([tokens], dtype=torch.long),
                past_key_values=self._cache,
                use_cache=True,
                output_hidden_states=capture,
            )
        self._cache = out.past_key_values
        self._cache_len = len(tokens)
        logits = out.logits[0, -1].float().numpy().copy()
        record = PrefillRecord(logits=logits, top1=topk_token_ids(logits, 1)[0])
        if capture:
            hs = out.hidden_states  # [embeddings, layer 0, ..., layer L-2, norm(layer L-1)]
            layers = [h[0].float().numpy().copy() for h in hs[1:-1]]
            layers.append(self._last_layer_out[0].float().numpy().copy())
            record.layer_outputs = layers
            record.final_hidden = hs[-1][0].float().numpy().copy()
        return record

    def decode_step(self, token: int, pos: int) -> DecodeStepRecord:
        torch = self._torch
        if self._cache is None or pos > self._cache_len:
            raise VerifyError(f"HF decode_step at position {pos} with {self._cache_len} cached")
        if pos < self._cache_len:
            self._cache.crop(pos)  # rewind: positions >= pos are recomputed
        with torch.inference_mode(), self._autocast():
            out = self.model(
                input_ids=torch.tensor([[token]], dtype=torch.long),
                position_ids=torch.tensor([[pos]], dtype=torch.long),
                cache_position=torch.tensor([pos], dtype=torch.long),
                past_key_values=self._cache,
                use_cache=True,
            )
        self._cache = out.past_key_values
        self._cache_len = pos + 1
        logits = out.logits[0, -1].float().numpy().copy()
        return DecodeStepRecord(logits=logits, top1=topk_token_ids(logits, 1)[0])

    def forced_logits(self, prompt_ids: list[int], tokens: list[int]) -> np.ndarray:
        """Logits of every step of a teacher-forced run over ``tokens``, in one forward pass.

        Row i is the distribution after the prompt plus tokens[:i], as a KV-cached decode
        step i would give it (the same positions and mask; only the matmul shapes differ,
        which in fp32 moves the logits by rounding alone). Only the last len(tokens)
        positions go through the LM head, so a long prompt costs no vocab-sized rows.
        """
        torch = self._torch
        if not tokens:
            return np.zeros((0, 0), dtype=np.float32)
        ids = list(prompt_ids) + list(tokens[:-1])
        with torch.inference_mode(), self._autocast():
            out = self.model(
                input_ids=torch.tensor([ids], dtype=torch.long),
                use_cache=False,
                logits_to_keep=len(tokens),
            )
        return out.logits[0].float().numpy().copy()

    def document_logits(self, ids: list[int], chunk: int) -> Any:
        """Logits [<= chunk, vocab] of a whole document's positions, chunk after chunk: one
        forward pass over the document, the LM head (and any final softcap) per chunk, so a
        262k vocab never needs all rows at once."""
        torch = self._torch
        model = self.model
        cap = getattr(model.config, "final_logit_softcapping", None)
        with torch.inference_mode(), self._autocast():
            hidden = model.model(
                input_ids=torch.tensor([list(ids)], dtype=torch.long), use_cache=False
            ).last_hidden_state[0]
            for s in range(0, len(ids), chunk):
                logits = model.lm_head(hidden[s : s + chunk]).float()
                if cap:
                    logits = torch.tanh(logits / cap) * cap
                yield logits.numpy()

    def close(self) -> None:
        self._model = None
        self._cache = None


def _round_scalar_buffers_like_bf16(model: Any, torch: Any) -> None:
    """Round scalar buffers that HF casts to the weight dtype, as a bf16 run sees them.

    Gemma's embedding scale sqrt(hidden) is a non-persistent fp32 buffer that HF multiplies
    in after ``.to(weight.dtype)``: 25.25 in bf16, 25.298 in fp32. The checkpoint's model
    (and our engine) is the bf16 one, so the fp32 truth uses the rounded scale too; without
    it the truth itself would be 0.2% off in every embedding.
    """
    for module in model.modules():
        scale = getattr(module, "embed_scale", None)
        if isinstance(scale, torch.Tensor) and scale.numel() == 1:
            with torch.no_grad():
                scale.copy_(scale.to(torch.bfloat16).to(scale.dtype))


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0]
