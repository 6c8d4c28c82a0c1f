"""Each family switch of the forward pass against transformers, on tiny random fixtures.

The engine (through the binding, i.e. the production prefill/decode_step) and HF
transformers in fp32 read the same weights, so logits must agree to fp32 rounding at every
position: a prefill of every prefix of the token list (every position through the batched
prefill path), KV-cached decode steps past the sliding window, and a prefill continued at
start_pos > 0. The fixtures (scripts/make_fixture.py) cover what no real checkpoint here
exercises: Qwen2's QKV bias, Qwen3's QK-norm, llama3 and linear RoPE scaling, untied heads,
Gemma's query_pre_attn_scalar and final-logit / attention softcaps, F32 and F16 weight files
and a sharded checkpoint; no two config fields a bug could confuse share a value.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from conftest import report_line

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from make_fixture import CONFIGS, SAVE_OPTIONS  # noqa: E402

FIXTURES = [
    "llama-tiny",
    "qwen2-tiny",
    "qwen3-tiny",
    "gemma3-tiny",
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
]
TOKENS = [1, 504, 3101, 42, 77, 19000, 8, 260, 4431, 12, 999, 31, 5, 48000, 600, 2, 7, 300]
PROMPT_LEN = 5
SPLIT = 7  # the continued prefill: [0, SPLIT) first, then the rest at start_pos = SPLIT
TOLERANCE = 2e-4  # of the largest |logit|: fp32 rounding, not bf16
TIERS = ["scalar", "avx2", "avx512", "amx"]
# Families whose attention ignores head_dim: heads are hidden_size / heads wide.
HEADS_SPLIT_HIDDEN = {
    "OlmoeForCausalLM",
    "GraniteMoeForCausalLM",
    "GraniteMoeSharedForCausalLM",
    "Qwen2MoeForCausalLM",  # (its head_dim must fill hidden_size)
}
MOE_FIXTURES = [
    "qwen3moe-tiny",
    "olmoe-tiny",
    "gptoss-tiny",
    "granitemoe-tiny",
    "granitemoeshared-tiny",
    "qwen2moe-tiny",
]


@pytest.fixture(scope="module", params=FIXTURES)
def fixture_dir(request: pytest.FixtureRequest, family_fixture: Any) -> Path:
    return family_fixture(request.param)


@functools.cache
def hf_logits(model_dir: Path) -> np.ndarray:
    # eager attention: the only HF path that applies attn_logit_softcapping.
    model = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager"
    )
    embed = model.model.embed_tokens
    if hasattr(embed, "embed_scale"):
        # HF casts Gemma's sqrt(hidden) to the weight dtype; the bf16 deployments see the
        # bf16-rounded scale, which is what the engine uses. Match it in this fp32 run.
        embed.embed_scale.copy_(embed.embed_scale.to(torch.bfloat16).float())
    with torch.no_grad():
        out = model(torch.tensor([TOKENS]))
    return out.logits[0].numpy()


def test_fixture_is_what_it_claims(fixture_dir: Path) -> None:
    """The switches under test are really in the files (a fixture edit cannot drop them)."""
    cfg = json.loads((fixture_dir / "config.json").read_text())
    if cfg["architectures"][0] not in HEADS_SPLIT_HIDDEN:
        assert cfg["head_dim"] != cfg["hidden_size"] // cfg["num_attention_heads"]
    experts = cfg.get("num_experts") or cfg.get("num_local_experts")
    if experts:  # routing that a wrong top-k, renormalisation or width would change
        assert 1 < cfg["num_experts_per_tok"] < experts
    for shared in ("shared_intermediate_size", "shared_expert_intermediate_size"):
        if shared in cfg:  # a shared MLP of its own width
            assert 0 < cfg[shared] != cfg["intermediate_size"]
            assert cfg[shared] != cfg.get("moe_intermediate_size")
    if cfg["architectures"] == ["GptOssForCausalLM"]:  # sinks and a window crossed by TOKENS
        assert set(cfg["layer_types"]) == {"sliding_attention", "full_attention"}
        assert cfg["sliding_window"] < len(TOKENS) and cfg["rope_scaling"]["rope_type"] == "yarn"
    if "moe_intermediate_size" in cfg:  # Qwen3-MoE: a dense layer among the MoE ones
        assert cfg["moe_intermediate_size"] != cfg["intermediate_size"] and cfg["mlp_only_layers"]
    if "query_pre_attn_scalar" in cfg:
        assert cfg["query_pre_attn_scalar"] != cfg["head_dim"]
        assert cfg["final_logit_softcapping"] and cfg["attn_logit_softcapping"]
    save = SAVE_OPTIONS.get(fixture_dir.name.rstrip("0123456789"), {})
    if "max_shard_size" in save:
        assert (fixture_dir / "model.safetensors.index.json").is_file()
        assert len(list(fixture_dir.glob("model-*-of-*.safetensors"))) > 1
    if "dtype" in save:
        want = {"float32": "F32", "float16": "F16"}[save["dtype"]]
        files = sorted(fixture_dir.glob("*.safetensors"))
        with open(files[0], "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        assert {t["dtype"] for k, t in header.items() if k != "__metadata__"} == {want}


def check(
    name: str, what: str, ours: list[tuple[int, np.ndarray]], ref: np.ndarray, scale: float
) -> float:
    worst = 0.0
    for pos, logits in ours:
        err = float(np.abs(logits - ref[pos]).max())
        worst = max(worst, err)
        assert err <= TOLERANCE * scale, (
            f"{name} {what} position {pos}: max |diff| {err:.3g} > {TOLERANCE} x {scale:.3g}"
        )
        assert int(np.argmax(logits)) == int(np.argmax(ref[pos])), f"{name} top-1 at {pos}"
    return worst


@pytest.mark.parametrize("tier", TIERS)
def test_every_position_matches_transformers(
    fixture_dir: Path, engine_binding: Any, tier: str
) -> None:
    """On every ISA tier this CPU has (a tier it lacks is skipped by name)."""
    if TIERS.index(tier) > TIERS.index(engine_binding.detected_isa()):
        pytest.skip(f"ISA tier {tier}: this CPU lacks it (not testable here)")
    name = fixture_dir.name.rstrip("0123456789")
    assert name in CONFIGS
    ref = hf_logits(fixture_dir)
    scale = float(np.abs(ref).max())
    session = engine_binding.Session()
    # The exact path (stage 1): HF fp32 is its truth; the fast path is stage 2's business.
    session.setup(str(fixture_dir), threads=2, max_context=64, precision="exact", isa=tier)
    assert session.exec_config["isa"] == tier

    prefill = [(k - 1, session.prefill(TOKENS[:k])) for k in range(1, len(TOKENS) + 1)]
    session.prefill(TOKENS[:PROMPT_LEN])
    decode = [(p, session.decode_step(TOKENS[p], p)) for p in range(PROMPT_LEN, len(TOKENS))]
    session.prefill(TOKENS[:SPLIT])
    continued = [(len(TOKENS) - 1, session.prefill(TOKENS[SPLIT:], SPLIT))]

    errors = {
        "prefill": check(name, "prefill", prefill, ref, scale),
        "decode": check(name, "decode", decode, ref, scale),
        "continued prefill": check(name, "continued prefill", continued, ref, scale),
    }
    report_line(
        f"family fixtures: max |logit diff| vs HF fp32 (tolerance {TOLERANCE} x max |logit|)",
        f"{name:<12} {tier:<7} max|logit| {scale:7.3f}  tolerance {TOLERANCE * scale:.2e}  "
        + "  ".join(f"{k} {v:.2e}" for k, v in errors.items()),
    )


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("name", MOE_FIXTURES)
def test_moe_batched_decode_is_bit_identical_to_alone(
    name: str, tier: str, family_fixture: Any, engine_binding: Any, monkeypatch: Any
) -> None:
    """A decode batch groups its sequences' tokens by expert (one matmul per expert over
    several sequences): each sequence's logits must stay those of its own decode_step."""
    if TIERS.index(tier) > TIERS.index(engine_binding.detected_isa()):
        pytest.skip(f"ISA tier {tier}: this CPU lacks it (not testable here)")
    monkeypatch.setenv("EDGELLM_ISA", tier)  # Model.setup reads the tier from the environment
    model = engine_binding.Model()
    model.setup(str(family_fixture(name)), threads=2, max_context=64, precision="exact")
    assert model.exec_config["isa"] == tier
    prompts = [TOKENS[:3], TOKENS[4:9], TOKENS[10:12]]
    alone = [engine_binding.Context(model) for _ in prompts]
    batched = [engine_binding.Context(model) for _ in prompts]
    tokens = []
    for a, b, ids in zip(alone, batched, prompts, strict=True):
        a.prefill(ids)
        tokens.append(int(np.argmax(b.prefill(ids))))
    for _ in range(4):
        positions = [c.position for c in batched]
        together = engine_binding.decode_batch(batched, tokens, positions)
        for i, ctx in enumerate(alone):
            assert np.array_equal(ctx.decode_step(tokens[i], positions[i]), together[i]), (name, i)
        tokens = [int(np.argmax(t)) for t in together]


def test_moe_weight_bytes_count_the_routed_experts(
    family_fixture: Any, engine_binding: Any, tmp_path: Path
) -> None:
    """weight_bytes (what one decode step streams, the roofline's numerator) counts the
    experts_per_token experts a token reads, not every expert: each more per token adds one
    expert's bytes on each MoE layer."""
    src = family_fixture("qwen3moe-tiny")
    cfg = json.loads((src / "config.json").read_text())
    sizes = []
    for k in (1, 2, 3):
        (src / "config.json").write_text(json.dumps({**cfg, "num_experts_per_tok": k}))
        session = engine_binding.Session()
        session.setup(str(src), threads=2, max_context=64, precision="exact")
        sizes.append(session.weight_bytes)
    assert sizes[1] - sizes[0] == sizes[2] - sizes[1] > 0, sizes
    # 2 MoE layers (layer 1 is dense), each expert's gate, up and down at least bf16's bytes.
    per_expert = 3 * cfg["moe_intermediate_size"] * cfg["hidden_size"] * 2
    assert sizes[1] - sizes[0] >= 2 * per_expert


def test_longrope_context_stops_at_the_original(family_fixture: Any, engine_binding: Any) -> None:
    """HF keeps LongRoPE's short factors only while a sequence fits
    original_max_position_embeddings; the engine's static table holds those, so its context
    stops there, below max_position_embeddings."""
    model_dir = family_fixture("phi3-tiny")
    cfg = json.loads((model_dir / "config.json").read_text())
    original = cfg["original_max_position_embeddings"]
    assert cfg["rope_scaling"]["type"] == "longrope" and cfg["max_position_embeddings"] > original
    session = engine_binding.Session()
    session.setup(str(model_dir), threads=1, max_context=2 * original, precision="exact")
    assert session.max_context == original
