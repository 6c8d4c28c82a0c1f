"""The gate must be able to fail: mutants of the engine that `make verify` has to catch.

Weight mutants run our engine on an altered copy of the checkpoint (tensors or config.json)
while HF reads the original. Call-path mutants wrap the runner from the test side (wrong
positions, overwritten KV entries, rounded logits, the final norm skipped); nothing in the
production kernels knows about them. Every mutant is judged as `make verify` judges: the
first 2 prompts of the model's set, 32 tokens, every default lens, at the precision tier the
engine reports. Each must fail, and the clean engine must pass. The lens that caught each
mutant (and whether the looser `reduced` tier would have) is printed at the end of the run:
that table is in llms/verify/README.md.

Cost: the two HF references (bf16 greedy, fp32 teacher-forced) of each model are captured
once (kept across sessions by verify/hf_cache.py) and shared by its mutants; a mutant costs
one engine setup and 2 prompts.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import REPO, SMOLLM2_DIR, missing_model, mutant_row
from verify import hf_cache
from verify.adapter_support import VerifyConfig, load_deployment, load_verify_config
from verify.comparators import GATE_N_TOKENS, topk_token_ids
from verify.gate import (
    Capture,
    GatePolicy,
    PromptResult,
    capture_side,
    capture_truth,
    encode_prompts,
    evaluate,
)
from verify.phases import PROMPTS_DIR, load_prompts
from verify.runners.engine_runner import EngineRunner, import_binding
from verify.runners.records import DecodeStepRecord, PrefillRecord

VERIFY = 2  # make verify's prompt count
GEMMA_DIR = SMOLLM2_DIR.parent / "gemma3-270m"
MODELS = {"smollm2": SMOLLM2_DIR, "gemma3": GEMMA_DIR}
FOLDERS = {"smollm2": "smollm2_135m", "gemma3": "gemma3_270m"}  # deployment of each model
WINDOW = 16  # Gemma's sliding window in the window mutant's checkpoint: the prompts cross it
# The families proven on tiny random fixtures: the clean engine passes the gate on each, and
# mutants of each family's own switches fail it (FAMILY_MUTANTS below).
FAMILY_FIXTURES = (
    "mistral-tiny",
    "granite-tiny",
    "smollm3-tiny",
    "olmo2-tiny",
    "qwen3moe-tiny",
    "olmoe-tiny",
    "phi3-tiny",
    "gptoss-tiny",
    "granitemoe-tiny",
    "granitemoeshared-tiny",
    "qwen2moe-tiny",
)


# ---------------------------------------------------------------------------------------------
# references, captured once per (model, checkpoint config) and shared
# ---------------------------------------------------------------------------------------------


@dataclass
class Subject:
    """One model under test with its two HF references over make verify's prompts."""

    config: VerifyConfig
    prompts: list[str]
    reference: Capture
    truth: Capture


def altered_checkpoint(
    src: Path,
    dst: Path,
    mutate: Callable[[dict[str, Any], dict[str, Any]], None] | None = None,
    config_changes: dict[str, Any] | None = None,
) -> Path:
    """A checkpoint copy: unchanged files symlinked, only what changes written anew."""
    from safetensors.torch import load_file, save_file

    dst.mkdir(parents=True)
    cfg = json.loads((src / "config.json").read_text())
    for f in src.iterdir():
        if not f.is_file() or f.name.startswith("."):
            continue
        if f.name == "model.safetensors" and mutate is not None:
            tensors = load_file(f)
            mutate(tensors, cfg)
            save_file(tensors, dst / f.name, metadata={"format": "pt"})
        elif f.name == "config.json" and config_changes:
            (dst / f.name).write_text(json.dumps({**cfg, **config_changes}, indent=2))
        else:
            os.symlink(f, dst / f.name)
    return dst


def _capture_subject(folder: str, model_dir: Path, choice: str) -> Subject:
    from verify.runners.hf_runner import HfRunner

    deployment = load_deployment(REPO / "llms" / folder)
    config = load_verify_config(deployment, model_dir, choice)
    prompts = load_prompts(PROMPTS_DIR / f"{config.variant}.txt")[:VERIFY]
    chat = config.prompt_format == "chat"
    # The verify runner's content-keyed capture cache: an altered config is other content.
    options = {"mutant_subject": prompts, "chat": chat, "max_context": config.max_context}
    keys = {side: hf_cache.capture_key(side, model_dir, options) for side in ("reference", "truth")}
    reference = hf_cache.lookup(keys["reference"], "reference")
    if reference is None:
        hf = HfRunner(model_dir, config.max_context, threads=1)
        ids = encode_prompts(hf, prompts, chat, GATE_N_TOKENS, config.max_context)
        reference = capture_side("reference", hf, prompts, ids, GATE_N_TOKENS)
        hf.close()
        hf_cache.store(keys["reference"], reference)
    truth = hf_cache.lookup(keys["truth"], "truth")
    if truth is None:
        fp32 = HfRunner(model_dir, config.max_context, threads=1, precision="fp32")
        truth = capture_truth(fp32, reference)
        fp32.close()
        hf_cache.store(keys["truth"], truth)
    return Subject(config, prompts, reference, truth)


@pytest.fixture(scope="session")
def subjects(
    engine_binding: Any, tmp_path_factory: pytest.TempPathFactory, family_fixture: Any
) -> Any:
    """subjects(model, config_changes) -> Subject, captured on first use. A family fixture
    (scripts/make_fixture.py) is judged as SmolLM2's deployment judges a checkpoint of it:
    its prompts, through the chat template it borrows with SmolLM2's tokenizer."""
    cache: dict[tuple[str, str], Subject] = {}

    def get(model: str, changes: dict[str, Any] | None = None) -> Subject:
        key = (model, json.dumps(changes, sort_keys=True))
        if key not in cache:
            src = family_fixture(model) if model in FAMILY_FIXTURES else MODELS[model]
            if not (src / "config.json").is_file():
                missing_model(f"no checkpoint at {src}: run `make fetch`")
            choice = "base" if model == "gemma3" else "instruct"
            if changes:
                dst = tmp_path_factory.mktemp(model) / "ckpt"
                src = altered_checkpoint(src, dst, None, changes)
            cache[key] = _capture_subject(FOLDERS.get(model, "smollm2_135m"), src, choice)
        return cache[key]

    return get


def judge(runner: Any, s: Subject, n_prompts: int = VERIFY, n_tokens: int = GATE_N_TOKENS,
          tier: str | None = None) -> list[PromptResult]:  # fmt: skip
    """`make verify` on our side through ``runner``: every default lens, the runner's tier."""

    def cut(c: Capture) -> Capture:
        prompts = [
            replace(p, tokens=p.tokens[:n_tokens], logits=p.logits[:n_tokens])
            for p in c.prompts[:n_prompts]
        ]
        return replace(c, prompts=prompts)

    ref, truth = cut(s.reference), cut(s.truth)
    prompts = s.prompts[:n_prompts]
    chat = s.config.prompt_format == "chat"
    ids = encode_prompts(runner, prompts, chat, n_tokens, s.config.max_context)
    ours = capture_side(
        "engine", runner, prompts, ids, n_tokens, forced=[p.tokens for p in ref.prompts]
    )
    policy = GatePolicy(tier=tier or runner.precision_tier)
    results = evaluate(ours, ref, truth, policy=policy)
    # What the looser tier of a bf16-activation path would have said (same captures).
    reduced = evaluate(ours, ref, truth, policy=GatePolicy(tier="reduced"))
    for r, red in zip(results, reduced, strict=True):
        r.notes.append(f"reduced tier: {'caught' if red.failed else 'passed'}")
    return results


def lenses_of(results: list[PromptResult]) -> str:
    per_prompt = [f"p{r.index + 1}: {'+'.join(r.lenses) or '-'}" for r in results]
    worst = max((r.calibrated.ratio_max for r in results if r.calibrated), default=0.0)
    reduced = any("reduced tier: caught" in n for r in results for n in r.notes)
    return f"{'; '.join(per_prompt)} | KL/floor up to {worst:.3g} | reduced tier: " + (
        "caught" if reduced else "passed"
    )


def _engine(model_dir: Path, s: Subject) -> EngineRunner:
    return EngineRunner(model_dir, max_context=s.config.max_context)


@pytest.mark.parametrize("model", [*MODELS, *FAMILY_FIXTURES])
def test_clean_engine_passes(model: str, subjects: Any) -> None:
    s = subjects(model)
    runner = _engine(s.config.model_dir, s)
    results = judge(runner, s)
    runner.close()
    assert not any(r.failed or r.lenses for r in results), lenses_of(results)


# ---------------------------------------------------------------------------------------------
# weight mutants: the engine loads an altered copy (tensors or config.json), HF the original
# ---------------------------------------------------------------------------------------------

Tensors = dict[str, Any]
Config = dict[str, Any]
ATTN = "model.layers.{}.self_attn.{}_proj.weight"


def _scale_o_proj(t: Tensors, c: Config) -> None:
    t[ATTN.format(0, "o")] *= 1.5


def _swap_rows(w: Any, a: slice, b: slice) -> None:
    w[a], w[b] = w[b].clone(), w[a].clone()


def _swap_kv_heads(which: str, layer: int) -> Callable[[Tensors, Config], None]:
    def mutate(t: Tensors, c: Config) -> None:
        d = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
        _swap_rows(t[ATTN.format(layer, which)], slice(0, d), slice(d, 2 * d))

    return mutate


def _perturb_final_norm(t: Tensors, c: Config) -> None:
    import torch

    w = t["model.norm.weight"]
    gen = torch.Generator().manual_seed(0)
    w *= 1 + 0.25 * torch.randn(w.shape, generator=gen).to(w.dtype)


def _norm_one_plus_w(t: Tensors, c: Config) -> None:
    t["model.layers.5.input_layernorm.weight"] += 1  # Gemma's convention applied to Llama


def _norm_w_not_one_plus_w(t: Tensors, c: Config) -> None:
    t["model.layers.3.self_attn.k_norm.weight"] -= 1  # Gemma's 1 + w read as plain w


def _swap_gate_up(t: Tensors, c: Config) -> None:
    key = "model.layers.20.mlp.{}_proj.weight"
    t[key.format("gate")], t[key.format("up")] = t[key.format("up")], t[key.format("gate")]


def _scale_gate_proj_mid(t: Tensors, c: Config) -> None:
    # gate_proj, not down_proj or o_proj: Gemma's post-norms would cancel a linear scale.
    t[f"model.layers.{c['num_hidden_layers'] // 2}.mlp.gate_proj.weight"] *= 1.2


def _query_head_wrong_group(t: Tensors, c: Config) -> None:
    """Query head 0 attends with KV group 1 (and head g, g = heads per group, with group 0):
    moving head 0's q rows and o_proj columns to slot g, which sits in the next group."""
    d = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    g = c["num_attention_heads"] // c["num_key_value_heads"]
    _swap_rows(t[ATTN.format(3, "q")], slice(0, d), slice(g * d, (g + 1) * d))
    o = t[ATTN.format(3, "o")].T  # a view: columns of o_proj as rows
    _swap_rows(o, slice(0, d), slice(g * d, (g + 1) * d))


@dataclass
class WeightMutant:
    models: tuple[str, ...]
    mutate: Callable[[Tensors, Config], None] | None = None
    config: Callable[[Config], Config] | None = None
    reference_changes: dict[str, Any] = field(default_factory=dict)  # both sides' checkpoint


SMOL, GEMMA, BOTH = ("smollm2",), ("gemma3",), ("smollm2", "gemma3")

WEIGHT_MUTANTS: dict[str, WeightMutant] = {
    "o_proj of layer 0 scaled x1.5": WeightMutant(SMOL, _scale_o_proj),
    "K rows of KV heads 0 and 1 swapped (layer 0)": WeightMutant(SMOL, _swap_kv_heads("k", 0)),
    "final norm weight perturbed 25% (seeded)": WeightMutant(SMOL, _perturb_final_norm),
    "norm weight read as 1 + w (layer 5 input norm)": WeightMutant(SMOL, _norm_one_plus_w),
    "gate_proj and up_proj swapped (layer 20)": WeightMutant(SMOL, _swap_gate_up),
    "V rows of KV heads 0 and 1 swapped (layer 1)": WeightMutant(SMOL, _swap_kv_heads("v", 1)),
    # new classes
    "gate_proj of the middle layer scaled x1.2": WeightMutant(BOTH, _scale_gate_proj_mid),
    "query head 0 mapped to the wrong KV group (layer 3)": WeightMutant(
        SMOL, _query_head_wrong_group
    ),
    "k_norm read as w instead of 1 + w (layer 3)": WeightMutant(GEMMA, _norm_w_not_one_plus_w),
    "RMSNorm epsilon of the other family (1e-5 <-> 1e-6)": WeightMutant(
        BOTH, config=lambda c: {"rms_norm_eps": 1e-6 if c["rms_norm_eps"] > 5e-6 else 1e-5}
    ),
    "final-logit softcap 30 applied (Gemma 2's, Gemma 3 has none)": WeightMutant(
        GEMMA, config=lambda c: {"final_logit_softcapping": 30.0}
    ),
    "local layers use the global RoPE base": WeightMutant(
        GEMMA, config=lambda c: {"rope_local_base_freq": c["rope_theta"]}
    ),
    "attention scale 1/sqrt(hidden/heads), not query_pre_attn_scalar": WeightMutant(
        GEMMA,
        config=lambda c: {"query_pre_attn_scalar": c["hidden_size"] // c["num_attention_heads"]},
    ),
    f"sliding window off by one ({WINDOW - 1} vs {WINDOW} on both sides' copy)": WeightMutant(
        GEMMA,
        config=lambda c: {"sliding_window": WINDOW - 1},
        reference_changes={"sliding_window": WINDOW},
    ),
}


MISTRAL, GRANITE, SMOLLM3 = ("mistral-tiny",), ("granite-tiny",), ("smollm3-tiny",)
OLMO2 = ("olmo2-tiny",)
MOE = ("qwen3moe-tiny", "olmoe-tiny", "qwen2moe-tiny")
PHI3 = ("phi3-tiny",)
GPTOSS = ("gptoss-tiny",)
GRANITE_MOE = ("granitemoe-tiny", "granitemoeshared-tiny")
EXPERT = "model.layers.{}.mlp.experts.{}.{}_proj.weight"


def _swap_experts(t: Tensors, c: Config) -> None:
    """Experts 0 and 1 of layer 0 trade weights; the router still sends tokens by index."""
    for proj in ("gate", "up", "down"):
        a, b = EXPERT.format(0, 0, proj), EXPERT.format(0, 1, proj)
        t[a], t[b] = t[b], t[a]


def _swap_expert_gate_up(t: Tensors, c: Config) -> None:
    """Expert 0 of layer 0 with its gate and up projections fused in the wrong order."""
    a, b = EXPERT.format(0, 0, "gate"), EXPERT.format(0, 0, "up")
    t[a], t[b] = t[b], t[a]


def _swap_fused_gate_up(t: Tensors, c: Config) -> None:
    w = t["model.layers.1.mlp.gate_up_proj.weight"]  # rows [gate; up]
    i = c["intermediate_size"]
    _swap_rows(w, slice(0, i), slice(i, 2 * i))


def _drop_sinks(t: Tensors, c: Config) -> None:
    """Every attention sink at -1e4: exp(sink - max) is 0, as if the sinks were not there."""
    for k in t:
        if k.endswith("self_attn.sinks"):
            t[k].fill_(-1e4)


def _swap_interleaved_gate_up(t: Tensors, c: Config) -> None:
    """Layer 0's experts read with gate and up de-interleaved the wrong way round (gate from the
    odd columns of gate_up_proj, up from the even ones), weights and biases alike."""
    for k in (
        "model.layers.0.mlp.experts.gate_up_proj",
        "model.layers.0.mlp.experts.gate_up_proj_bias",
    ):
        w = t[k]
        w[..., 0::2], w[..., 1::2] = w[..., 1::2].clone(), w[..., 0::2].clone()


def _full_rotary(c: Config) -> Config:
    """RoPE over the whole head: the factor lists grow by 1.0s to the full head's pairs."""
    pairs = c["head_dim"] // 2
    rs = c["rope_scaling"]
    pad = lambda f: f + [1.0] * (pairs - len(f))  # noqa: E731
    return {
        "partial_rotary_factor": 1.0,
        "rope_scaling": {
            **rs,
            "short_factor": pad(rs["short_factor"]),
            "long_factor": pad(rs["long_factor"]),
        },
    }


def _swap_input_linear_halves(t: Tensors, c: Config) -> None:
    """GraniteMoE's input_linear [E, 2I, H] read as [up; gate] (every expert, every layer)."""
    import torch

    i = c["intermediate_size"]
    for k in [k for k in t if k.endswith("block_sparse_moe.input_linear.weight")]:
        t[k] = torch.cat([t[k][:, i:], t[k][:, :i]], dim=1)


# Each family's own logic, broken in the engine's copy of the config (HF reads the original).
FAMILY_MUTANTS: dict[str, WeightMutant] = {
    "sliding window ignored (Mistral as Llama)": WeightMutant(
        MISTRAL, config=lambda c: {"sliding_window": None}
    ),
    "sliding window off by one": WeightMutant(
        MISTRAL, config=lambda c: {"sliding_window": c["sliding_window"] + 1}
    ),
    "residual_multiplier dropped": WeightMutant(
        GRANITE, config=lambda c: {"residual_multiplier": 1.0}
    ),
    "embedding_multiplier dropped": WeightMutant(
        GRANITE, config=lambda c: {"embedding_multiplier": 1.0}
    ),
    "attention scale 1/sqrt(head_dim), not attention_multiplier": WeightMutant(
        GRANITE, config=lambda c: {"attention_multiplier": c["head_dim"] ** -0.5}
    ),
    "logits_scaling dropped": WeightMutant(GRANITE, config=lambda c: {"logits_scaling": 1.0}),
    "o_proj bias dropped": WeightMutant(
        GRANITE,
        lambda t, c: [t[k].zero_() for k in t if k.endswith("o_proj.bias")],
    ),
    "RoPE applied on the NoPE layer": WeightMutant(
        SMOLLM3, config=lambda c: {"no_rope_layers": [1] * c["num_hidden_layers"]}
    ),
    "QK-norm weights not applied": WeightMutant(
        OLMO2,
        lambda t, c: [t[k].fill_(1.0) for k in t if k.endswith(("q_norm.weight", "k_norm.weight"))],
    ),
    "post-feedforward norm weight not applied": WeightMutant(
        OLMO2,
        lambda t, c: [
            t[k].fill_(1.0) for k in t if k.endswith("post_feedforward_layernorm.weight")
        ],
    ),
    "RoPE skipped on a RoPE layer": WeightMutant(
        SMOLLM3, config=lambda c: {"no_rope_layers": [0] * c["num_hidden_layers"]}
    ),
    "MoE top-k off by one": WeightMutant(
        MOE, config=lambda c: {"num_experts_per_tok": c["num_experts_per_tok"] + 1}
    ),
    "MoE norm_topk_prob flipped": WeightMutant(
        MOE, config=lambda c: {"norm_topk_prob": not c["norm_topk_prob"]}
    ),
    "two experts' weights swapped (layer 0)": WeightMutant(MOE, _swap_experts),
    # (Swapping two router rows is the same model as swapping the two experts' weights.)
    "one expert's gate_proj and up_proj swapped (layer 0)": WeightMutant(MOE, _swap_expert_gate_up),
    "rotary over the full head (partial_rotary_factor 1.0)": WeightMutant(
        PHI3, config=_full_rotary
    ),
    "gate and up halves of gate_up_proj swapped (layer 1)": WeightMutant(PHI3, _swap_fused_gate_up),
    "LongRoPE short factors dropped": WeightMutant(
        PHI3,
        config=lambda c: {
            "rope_scaling": {
                **c["rope_scaling"],
                "short_factor": [1.0] * len(c["rope_scaling"]["short_factor"]),
            }
        },
    ),
    "LongRoPE attention factor dropped (max_position_embeddings = original)": WeightMutant(
        PHI3, config=lambda c: {"max_position_embeddings": c["original_max_position_embeddings"]}
    ),
    "sliding window ignored (Phi-3)": WeightMutant(PHI3, config=lambda c: {"sliding_window": None}),
    "attention sinks dropped": WeightMutant(GPTOSS, _drop_sinks),
    "experts' gate/up interleave swapped (layer 0)": WeightMutant(
        GPTOSS, _swap_interleaved_gate_up
    ),
    "YaRN attention factor dropped (attention_factor 1.0)": WeightMutant(
        GPTOSS, config=lambda c: {"rope_scaling": {**c["rope_scaling"], "attention_factor": 1.0}}
    ),
    "sliding window on the wrong layers (layer_types inverted)": WeightMutant(
        GPTOSS,
        config=lambda c: {
            "layer_types": [
                "full_attention" if t == "sliding_attention" else "sliding_attention"
                for t in c["layer_types"]
            ]
        },
    ),
    "GraniteMoE top-k off by one": WeightMutant(
        GRANITE_MOE, config=lambda c: {"num_experts_per_tok": c["num_experts_per_tok"] + 1}
    ),
    "gate and up halves of input_linear swapped (GraniteMoE)": WeightMutant(
        GRANITE_MOE, _swap_input_linear_halves
    ),
    "shared expert dropped (Qwen2-MoE)": WeightMutant(
        ("qwen2moe-tiny",),
        lambda t, c: [t[k].zero_() for k in t if k.endswith("shared_expert.down_proj.weight")],
    ),
    "shared MLP dropped (GraniteMoeShared)": WeightMutant(
        ("granitemoeshared-tiny",),
        lambda t, c: [t[k].zero_() for k in t if k.endswith("shared_mlp.output_linear.weight")],
    ),
}
WEIGHT_MUTANTS.update(FAMILY_MUTANTS)


def _cases(mutants: dict[str, Any]) -> list[Any]:
    return [
        pytest.param(m, name, id=f"{m}-{name}") for name, mt in mutants.items() for m in mt.models
    ]


def _run_and_record(name: str, model: str, kind: str, runner: Any, s: Subject,
                    **kw: Any) -> None:  # fmt: skip
    try:
        results = judge(runner, s, **kw)
    finally:
        runner.close()
    mutant_row(f"{model}: {name}", kind, lenses_of(results))
    assert any(r.failed for r in results), f"the gate let '{name}' through: {lenses_of(results)}"


@pytest.mark.parametrize(("model", "name"), _cases(WEIGHT_MUTANTS))
def test_weight_mutant_fails(model: str, name: str, subjects: Any, tmp_path: Path) -> None:
    m = WEIGHT_MUTANTS[name]
    s = subjects(model, m.reference_changes or None)
    src_cfg = json.loads((s.config.model_dir / "config.json").read_text())
    changes = m.config(src_cfg) if m.config else None
    ckpt = altered_checkpoint(s.config.model_dir, tmp_path / "ckpt", m.mutate, changes)
    try:
        if m.reference_changes:  # the control: the clean engine passes on that copy
            clean = _engine(s.config.model_dir, s)
            control = judge(clean, s)
            clean.close()
            assert not any(r.failed for r in control), f"control failed: {lenses_of(control)}"
        _run_and_record(name, model, "weights", _engine(ckpt, s), s)
    finally:
        (ckpt / "model.safetensors").unlink(missing_ok=True)  # hundreds of MB: do not keep


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
        self.precision_tier = inner.precision_tier
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


class EarlyKvOverwritten(Wrapped):
    """At decode step 24 the KV entries of positions 1-4 are overwritten with the current
    token's, as a mis-indexed cache write late in a long decode would. Bites late."""

    STEP = 24

    def decode_step(self, token: int, pos: int) -> DecodeStepRecord:
        if pos == self.prompt_len + self.STEP:
            for early in range(1, 5):
                self.inner.decode_step(token, early)  # rewrites that slot; logits dropped
        return self.inner.decode_step(token, pos)


class KvCacheWraps(Wrapped):
    """A ring-buffer bug: decode positions wrap at a fixed capacity, so late steps overwrite
    the prompt's first entries and attend to a truncated history. Bites late."""

    def __init__(self, inner: EngineRunner, capacity: int) -> None:
        super().__init__(inner)
        self.capacity = capacity

    def decode_step(self, token: int, pos: int) -> DecodeStepRecord:
        return self.inner.decode_step(token, pos % self.capacity)


class LogitsInBf16(Wrapped):
    """The logits land in a bf16 buffer: every logit rounded to 8 significant bits."""

    @staticmethod
    def _round(logits: np.ndarray) -> np.ndarray:
        bits = np.asarray(logits, dtype=np.float32).view(np.uint32)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # round to nearest even
        return rounded.astype(np.uint32).view(np.float32)

    def prefill(self, tokens: list[int], capture: bool = False) -> PrefillRecord:
        record = super().prefill(tokens, capture)
        record.logits = self._round(record.logits)
        return record

    def decode_step(self, token: int, pos: int) -> DecodeStepRecord:
        logits = self._round(self.inner.decode_step(token, pos).logits)
        return DecodeStepRecord(logits=logits, top1=topk_token_ids(logits, 1)[0])


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


class WithFault(Wrapped):
    """The engine with one fault-injection mutant on (kernels/fault_injection.h) while it runs:
    a family switch broken inside the forward pass, where no checkpoint edit reaches."""

    def __init__(self, inner: EngineRunner, fault: str) -> None:
        super().__init__(inner)
        import_binding().set_kernel_fault(fault)

    def close(self) -> None:
        import_binding().set_kernel_fault("none")
        super().close()


def _with_fault(fault: str) -> Callable[[Subject, Path], Wrapped]:
    return lambda s, _: WithFault(_engine(s.config.model_dir, s), fault)


def _lm_head(model_dir: Path) -> np.ndarray:
    from safetensors import safe_open

    with safe_open(model_dir / "model.safetensors", "pt") as f:
        name = "lm_head.weight" if "lm_head.weight" in f.keys() else "model.embed_tokens.weight"
        return f.get_tensor(name).float().numpy()


def _rope_mutant(s: Subject, tmp: Path) -> Wrapped:
    other = altered_checkpoint(s.config.model_dir, tmp / "rope", None, {"rope_theta": 10000.0})
    return DecodeRopeBase(_engine(s.config.model_dir, s), _engine(other, s))


def _wrapping(s: Subject, _: Path) -> Wrapped:
    """A capacity the decode crosses after ~16 steps: 64 for SmolLM2's ~45-token chat
    prompts, the next multiple of 16 for Gemma's short base prompts."""
    longest = max(len(p.prompt_ids) for p in s.reference.prompts)
    return KvCacheWraps(_engine(s.config.model_dir, s), -(-(longest + 16) // 16) * 16)


@dataclass
class CallMutant:
    make: Callable[[Subject, Path], Wrapped]
    models: tuple[str, ...] = BOTH
    n_prompts: int = VERIFY
    n_tokens: int = GATE_N_TOKENS


def _wrap(cls: type[Wrapped]) -> Callable[[Subject, Path], Wrapped]:
    return lambda s, _: cls(_engine(s.config.model_dir, s))


CALL_MUTANTS: dict[str, CallMutant] = {
    "decode position off by one": CallMutant(_wrap(DecodePosOffByOne)),
    "stale KV entry at decode step 20": CallMutant(_wrap(StaleKvEntry)),
    "KV cache wraps at a fixed capacity": CallMutant(_wrapping),
    "RoPE base 10000 in decode": CallMutant(_rope_mutant, SMOL),
    "final norm skipped": CallMutant(
        lambda s, _: SkipFinalNorm(_engine(s.config.model_dir, s), _lm_head(s.config.model_dir)),
        SMOL,
        n_prompts=1,
        n_tokens=8,
    ),
    # new classes
    "early KV entries (positions 1-4) overwritten at decode step 24": CallMutant(
        _wrap(EarlyKvOverwritten)
    ),
    "logits rounded to bf16": CallMutant(_wrap(LogitsInBf16)),
    # gpt-oss's own switches inside the forward pass
    "router softmax over all experts, then top-k (gpt-oss)": CallMutant(
        _with_fault("router softmax over all experts"), GPTOSS
    ),
    "SwiGLU clamp dropped (gpt-oss)": CallMutant(_with_fault("SwiGLU clamp dropped"), GPTOSS),
}


@pytest.mark.parametrize(("model", "name"), _cases(CALL_MUTANTS))
def test_call_path_mutant_fails(model: str, name: str, subjects: Any, tmp_path: Path) -> None:
    m = CALL_MUTANTS[name]
    s = subjects(model)
    runner = m.make(s, tmp_path)
    _run_and_record(
        name,
        model,
        "call path",
        runner,
        s,
        n_prompts=m.n_prompts,
        n_tokens=m.n_tokens,
    )
