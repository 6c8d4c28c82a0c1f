"""The gate must be able to fail: mutants of the engine that the gate has to catch.

Weight mutants run our engine on an altered copy of the checkpoint while HF reads the
original. Call-path mutants wrap the runner from the test side (wrong positions, a stale KV
entry, a wrong RoPE base in decode, the final norm skipped); nothing in the production
kernels knows about them. Every mutant must make the gate fail as CI runs it (--all-steps:
first-divergence or teacher-forced lens), and the clean engine must pass. The lens that
caught each mutant is printed at the end of the run.

Cost: one HF reference capture of the full prompt set (32 tokens) shared by all. Each mutant
is judged on the `make verify` prompts (2) unless it needs the `verify-full` set (8) to be
seen reliably (off-by-one positions and RoPE base shift only nudge this model's top-5), or
needs fewer to stay cheap (final norm skipped recomputes the whole context each step).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from smollm2_135m import verify_adapter as adapter
from verify.adapter_support import VerifyConfig
from verify.comparators import GATE_N_TOKENS, topk_token_ids
from verify.gate import Capture, PromptResult, capture_side, encode_prompts, evaluate
from verify.runners.engine_runner import EngineRunner
from verify.runners.records import DecodeStepRecord, PrefillRecord
from verify.verify_runner import PROMPTS_DIR, load_prompts

PROMPTS = load_prompts(PROMPTS_DIR / "instruct.txt")  # verify-full; make verify: the first 2
VERIFY = 2


@pytest.fixture(scope="module")
def config(smollm2_checkpoint: Path, engine_binding: Any) -> VerifyConfig:
    return adapter.build_config(smollm2_checkpoint, "instruct")


@pytest.fixture(scope="module")
def reference(config: VerifyConfig) -> Capture:
    """HF bf16 on the original checkpoint, captured once for every mutant."""
    from verify.runners.hf_runner import HfRunner

    hf = HfRunner(adapter.hf_reference(config.model_dir), config.max_context, threads=1)
    ids = encode_prompts(hf, PROMPTS, True, GATE_N_TOKENS, config.max_context)
    capture = capture_side("reference", hf, PROMPTS, ids, GATE_N_TOKENS)
    hf.close()
    return capture


def judge(
    runner: Any,
    config: VerifyConfig,
    reference: Capture,
    n_prompts: int = VERIFY,
    n_tokens: int = GATE_N_TOKENS,
) -> list[PromptResult]:
    """The gate as CI runs it (--all-steps) on our side through ``runner``, over the first
    n_prompts prompts and n_tokens tokens of the shared reference."""
    ref = Capture(
        reference.side,
        reference.runner,
        reference.meta,
        [
            replace(p, tokens=p.tokens[:n_tokens], logits=p.logits[:n_tokens])
            for p in reference.prompts[:n_prompts]
        ],
    )
    prompts = PROMPTS[:n_prompts]
    ids = encode_prompts(runner, prompts, True, n_tokens, config.max_context)
    ours = capture_side(
        "engine", runner, prompts, ids, n_tokens, forced=[p.tokens for p in ref.prompts]
    )
    return evaluate(ours, ref, all_steps=True)


def lenses_of(results: list[PromptResult]) -> str:
    per_prompt = [f"p{r.index + 1}: {'+'.join(r.lenses) or '-'}" for r in results]
    return "; ".join(per_prompt)


def test_clean_engine_passes(config: VerifyConfig, reference: Capture) -> None:
    results = judge(adapter.build_runner(config), config, reference, n_prompts=len(PROMPTS))
    assert not any(r.failed or r.lenses for r in results), lenses_of(results)


# ---------------------------------------------------------------------------------------------
# weight mutants: the engine loads an altered copy, HF the original
# ---------------------------------------------------------------------------------------------

Tensors = dict[str, Any]


def _scale_o_proj(t: Tensors) -> None:
    t["model.layers.0.self_attn.o_proj.weight"] *= 1.5


def _swap_kv_heads_k(t: Tensors) -> None:
    w = t["model.layers.0.self_attn.k_proj.weight"]  # [kv_heads * head_dim, hidden]
    w[0:64], w[64:128] = w[64:128].clone(), w[0:64].clone()


def _perturb_final_norm(t: Tensors) -> None:
    import torch

    w = t["model.norm.weight"]
    gen = torch.Generator().manual_seed(0)
    w *= 1 + 0.25 * torch.randn(w.shape, generator=gen).to(w.dtype)


def _norm_one_plus_w(t: Tensors) -> None:
    t["model.layers.5.input_layernorm.weight"] += 1  # Gemma's convention applied to Llama


def _swap_gate_up(t: Tensors) -> None:
    key = "model.layers.20.mlp.{}_proj.weight"
    t[key.format("gate")], t[key.format("up")] = t[key.format("up")], t[key.format("gate")]


def _swap_kv_heads_v(t: Tensors) -> None:
    w = t["model.layers.1.self_attn.v_proj.weight"]
    w[0:64], w[64:128] = w[64:128].clone(), w[0:64].clone()


WEIGHT_MUTANTS: dict[str, Callable[[Tensors], None]] = {
    "o_proj of layer 0 scaled x1.5": _scale_o_proj,
    "K rows of KV heads 0 and 1 swapped (layer 0)": _swap_kv_heads_k,
    "final norm weight perturbed 25% (seeded)": _perturb_final_norm,
    "norm weight read as 1 + w (layer 5 input norm)": _norm_one_plus_w,
    "gate_proj and up_proj swapped (layer 20)": _swap_gate_up,
    "V rows of KV heads 0 and 1 swapped (layer 1)": _swap_kv_heads_v,
}


def altered_checkpoint(
    src: Path,
    dst: Path,
    mutate: Callable[[Tensors], None] | None,
    config_changes: dict[str, Any] | None = None,
) -> Path:
    """A checkpoint copy: unchanged files symlinked, only what changes written anew."""
    from safetensors.torch import load_file, save_file

    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and not f.name.startswith("."):
            if f.name == "model.safetensors" and mutate is not None:
                tensors = load_file(f)
                mutate(tensors)
                save_file(tensors, dst / f.name, metadata={"format": "pt"})
            elif f.name == "config.json" and config_changes:
                cfg = json.loads(f.read_text())
                cfg.update(config_changes)
                (dst / f.name).write_text(json.dumps(cfg, indent=2))
            else:
                os.symlink(f, dst / f.name)
    return dst


@pytest.mark.parametrize("name", list(WEIGHT_MUTANTS))
def test_weight_mutant_fails(
    name: str,
    config: VerifyConfig,
    reference: Capture,
    tmp_path: Path,
    mutant_table: list[tuple[str, str, str]],
) -> None:
    ckpt = altered_checkpoint(config.model_dir, tmp_path / "ckpt", WEIGHT_MUTANTS[name])
    try:
        runner = EngineRunner(ckpt, max_context=config.max_context)
        results = judge(runner, config, reference)
        runner.close()
    finally:
        (ckpt / "model.safetensors").unlink(missing_ok=True)  # 270 MB: do not keep
    mutant_table.append((name, "weights", lenses_of(results)))
    assert any(r.failed for r in results), f"the gate let '{name}' through: {lenses_of(results)}"


# ---------------------------------------------------------------------------------------------
# call-path mutants: the runner wrapped or configured from the test side
# ---------------------------------------------------------------------------------------------


class Wrapped:
    """Delegates the Runner protocol to the real engine runner; mutants override one call."""

    def __init__(self, inner: EngineRunner) -> None:
        self.inner = inner
        self.name = f"mutant of {inner.name}"
        self.max_context = inner.max_context
        self.eos_token_ids = inner.eos_token_ids
        self.prompt_len = 0

    def encode_prompt(self, text: str, chat: bool) -> list[int]:
        return self.inner.encode_prompt(text, chat)

    def decode(self, ids: list[int]) -> str:
        return self.inner.decode(ids)

    def prefill(self, tokens: list[int], capture: bool = False) -> PrefillRecord:
        self.prompt_len = len(tokens)
        return self.inner.prefill(tokens, capture)

    def decode_step(self, token: int, pos: int) -> DecodeStepRecord:
        return self.inner.decode_step(token, pos)

    def close(self) -> None:
        self.inner.close()


class DecodePosOffByOne(Wrapped):
    """Every decode step runs one position late (RoPE angle and KV slot both off by one)."""

    def decode_step(self, token: int, pos: int) -> DecodeStepRecord:
        return self.inner.decode_step(token, pos + 1)


class StaleKvEntry(Wrapped):
    """The KV entry of decode step 20 is left holding the previous token's keys/values,
    as when a cache write lands in the wrong slot. Bites late: only steps after 20 see it."""

    STEP = 20

    def prefill(self, tokens: list[int], capture: bool = False) -> PrefillRecord:
        self.previous = tokens[-1]
        return super().prefill(tokens, capture)

    def decode_step(self, token: int, pos: int) -> DecodeStepRecord:
        record = self.inner.decode_step(token, pos)
        if pos == self.prompt_len + self.STEP:
            self.inner.decode_step(self.previous, pos)  # overwrite the slot, drop the logits
        self.previous = token
        return record


class KvCacheWrapsAt64(Wrapped):
    """A ring-buffer bug: decode positions wrap at 64, so late steps overwrite the prompt's
    first entries and attend to a truncated history. Bites late (prompts are ~45 tokens)."""

    def decode_step(self, token: int, pos: int) -> DecodeStepRecord:
        return self.inner.decode_step(token, pos % 64)


class DecodeRopeBase(Wrapped):
    """Decode runs with RoPE base 10000 (the Llama-2 default) instead of the config's.

    The first token comes from the clean prefill; the decode steps from a second session set
    up on a config copy with rope_theta=10000 (the binding exposes no per-phase knob, so that
    session's prompt keys use the wrong base too: a milder bug than real decode-only drift,
    which mixes two bases in one cache)."""

    def __init__(self, inner: EngineRunner, other: EngineRunner) -> None:
        super().__init__(inner)
        self.other = other

    def prefill(self, tokens: list[int], capture: bool = False) -> PrefillRecord:
        self.other.prefill(tokens)
        return super().prefill(tokens, capture)

    def decode_step(self, token: int, pos: int) -> DecodeStepRecord:
        return self.other.decode_step(token, pos)

    def close(self) -> None:
        self.other.close()
        super().close()


class SkipFinalNorm(Wrapped):
    """Logits from the last layer's output without the final RMSNorm (its scale and weight).

    Built from the engine's own prefill capture of the whole context at every step (the
    pre-norm residual stream) times the tied embedding, so decode steps are covered too."""

    def __init__(self, inner: EngineRunner, lm_head: np.ndarray) -> None:
        super().__init__(inner)
        self.lm_head = lm_head  # [vocab, hidden] float32
        self.context: list[int] = []

    def _logits(self) -> np.ndarray:
        record = self.inner.prefill(self.context, capture=True)
        return self.lm_head @ record.layer_outputs[-1][-1]

    def prefill(self, tokens: list[int], capture: bool = False) -> PrefillRecord:
        self.prompt_len = len(tokens)
        self.context = list(tokens)
        logits = self._logits()
        return PrefillRecord(logits=logits, top1=topk_token_ids(logits, 1)[0])

    def decode_step(self, token: int, pos: int) -> DecodeStepRecord:
        self.context = self.context[:pos] + [token]
        logits = self._logits()
        return DecodeStepRecord(logits=logits, top1=topk_token_ids(logits, 1)[0])


def _lm_head(config: VerifyConfig) -> np.ndarray:
    from safetensors import safe_open

    with safe_open(config.model_dir / "model.safetensors", "pt") as f:
        name = "lm_head.weight" if "lm_head.weight" in f.keys() else "model.embed_tokens.weight"
        return f.get_tensor(name).float().numpy()


def _engine(config: VerifyConfig) -> EngineRunner:
    return EngineRunner(config.model_dir, max_context=config.max_context)


@dataclass
class CallMutant:
    make: Callable[[VerifyConfig, Path], Wrapped]
    n_prompts: int = VERIFY
    n_tokens: int = GATE_N_TOKENS


def _rope_mutant(c: VerifyConfig, tmp: Path) -> Wrapped:
    other = altered_checkpoint(c.model_dir, tmp / "rope", None, {"rope_theta": 10000.0})
    return DecodeRopeBase(_engine(c), EngineRunner(other, max_context=c.max_context))


CALL_MUTANTS: dict[str, CallMutant] = {
    "decode position off by one": CallMutant(
        lambda c, _: DecodePosOffByOne(_engine(c)), n_prompts=len(PROMPTS)
    ),
    "stale KV entry at decode step 20": CallMutant(lambda c, _: StaleKvEntry(_engine(c))),
    "KV cache wraps at 64 positions": CallMutant(lambda c, _: KvCacheWrapsAt64(_engine(c))),
    "RoPE base 10000 in decode": CallMutant(_rope_mutant, n_prompts=len(PROMPTS)),
    "final norm skipped": CallMutant(
        lambda c, _: SkipFinalNorm(_engine(c), _lm_head(c)), n_prompts=1, n_tokens=8
    ),
}


@pytest.mark.parametrize("name", list(CALL_MUTANTS))
def test_call_path_mutant_fails(
    name: str,
    config: VerifyConfig,
    reference: Capture,
    tmp_path: Path,
    mutant_table: list[tuple[str, str, str]],
) -> None:
    mutant = CALL_MUTANTS[name]
    runner = mutant.make(config, tmp_path)
    results = judge(runner, config, reference, mutant.n_prompts, mutant.n_tokens)
    runner.close()
    mutant_table.append((name, "call path", lenses_of(results)))
    assert any(r.failed for r in results), f"the gate let '{name}' through: {lenses_of(results)}"
