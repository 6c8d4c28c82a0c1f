"""Write a seeded, random-initialised HF checkpoint of a supported config.

Random weights exercise every code path at full scale without a download:
compile/run/profile/verify/bench work on `llama32-1b` exactly as on the real
Llama-3.2-1B, and the tiny configs let the test suite compare our engine with
transformers on each family's switches (QKV bias, QK-norm, sandwich norms,
sliding windows, llama3 RoPE scaling).

The tokenizer is borrowed from a checkpoint in the model store (any tokenizer
whose ids fit the vocabulary will do for random weights).

    make_fixture.py llama32-1b --out models/llama32-1b-fixture
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
STORE = Path(os.environ.get("EDGELLM_MODELS", REPO / "models"))
TOKENIZER_SOURCE = "smollm2-135m-instruct"  # 49152 ids, fits every config below

LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
# Tiny shapes where no two fields a bug could confuse share a value: head_dim (24) is not
# hidden_size / num_attention_heads (16), kv heads differ from heads, Gemma's
# query_pre_attn_scalar (24) is not its head_dim (32), and each RoPE base differs.
TINY = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 24,
    "vocab_size": 49152,
    "max_position_embeddings": 4096,  # stage 2's corpus documents fit (make verify)
    "rms_norm_eps": 1e-5,
}

CONFIGS: dict[str, tuple[str, dict]] = {
    # The seed's reference shape: Llama-3.2-1B (GQA 32/8, head_dim 64, tied, llama3 RoPE).
    "llama32-1b": (
        "LlamaConfig",
        {
            "hidden_size": 2048,
            "intermediate_size": 8192,
            "num_hidden_layers": 16,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 64,
            "vocab_size": 128256,
            "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0,
            "rope_scaling": LLAMA3_SCALING,
            "tie_word_embeddings": True,
            "bos_token_id": 128000,
            "eos_token_id": 128001,
        },
    ),
    "llama-tiny": (
        "LlamaConfig",
        {
            **TINY,
            "rope_theta": 500000.0,
            "tie_word_embeddings": False,
            "rope_scaling": {**LLAMA3_SCALING, "original_max_position_embeddings": 64},
        },
    ),
    "qwen2-tiny": ("Qwen2Config", {**TINY, "rope_theta": 1000000.0, "tie_word_embeddings": True}),
    "qwen3-tiny": (
        "Qwen3Config",
        {
            **TINY,
            "rope_theta": 1000000.0,
            "tie_word_embeddings": True,
            "rope_scaling": {"rope_type": "linear", "factor": 2.5},
        },
    ),
    # Every layer windowed, narrower than the test's token list (decode crosses it).
    "mistral-tiny": (
        "MistralConfig",
        {**TINY, "rope_theta": 20000.0, "sliding_window": 6, "tie_word_embeddings": False},
    ),
    # Granite's four multipliers, none 1, and attention_bias (o_proj's bias included).
    "granite-tiny": (
        "GraniteConfig",
        {
            **TINY,
            "rope_theta": 30000.0,
            "attention_bias": True,
            "embedding_multiplier": 3.0,
            "residual_multiplier": 0.4,
            "attention_multiplier": 0.3,
            "logits_scaling": 2.5,
        },
    ),
    # NoPE layers that are not HF's default every-4th alone (layer 1 as well as layer 3).
    "smollm3-tiny": (
        "SmolLM3Config",
        {
            **TINY,
            "num_hidden_layers": 4,
            "rope_theta": 40000.0,
            "no_rope_layers": [1, 0, 1, 0],
            "tie_word_embeddings": True,
            # HF's default ids (128000-128004) lie outside the tiny vocabulary.
            "pad_token_id": 0,
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
    ),
    # Qwen3-30B-A3B's shape in miniature: 8 experts, top-2 renormalised, experts narrower
    # than the dense MLP of the one mlp_only layer.
    "qwen3moe-tiny": (
        "Qwen3MoeConfig",
        {
            **TINY,
            "rope_theta": 50000.0,
            "tie_word_embeddings": False,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 40,
            "norm_topk_prob": True,
            "mlp_only_layers": [1],
        },
    ),
    # OLMoE: QK-norm over the whole projections, top-3 of 8 without renormalisation, every
    # layer MoE with experts intermediate_size wide; its heads are hidden / heads wide.
    "olmoe-tiny": (
        "OlmoeConfig",
        {
            **{k: v for k, v in TINY.items() if k != "head_dim"},
            "rope_theta": 60000.0,
            "num_experts": 8,
            "num_experts_per_tok": 3,
            "norm_topk_prob": False,
            "pad_token_id": 0,
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
    ),
    # GraniteMoE: Granite's four multipliers (none 1, and not granite-tiny's) around experts
    # stacked as input_linear / output_linear, routed by a softmax over the top-2 logits of 8;
    # heads are hidden / heads wide. attention_bias gives o_proj a bias too.
    "granitemoe-tiny": (
        "GraniteMoeConfig",
        {
            **{k: v for k, v in TINY.items() if k != "head_dim"},
            "rope_theta": 80000.0,
            "attention_bias": True,
            "embedding_multiplier": 2.0,
            "residual_multiplier": 0.6,
            "attention_multiplier": 0.2,
            "logits_scaling": 3.5,
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
        },
    ),
    # GraniteMoeShared: top-3 of 8, plus a shared MLP (56 wide, not intermediate_size)
    # that every token runs.
    "granitemoeshared-tiny": (
        "GraniteMoeSharedConfig",
        {
            **{k: v for k, v in TINY.items() if k != "head_dim"},
            "rope_theta": 90000.0,
            "embedding_multiplier": 1.5,
            "residual_multiplier": 0.7,
            "attention_multiplier": 0.25,
            "logits_scaling": 1.8,
            "num_local_experts": 8,
            "num_experts_per_tok": 3,
            "shared_intermediate_size": 56,
        },
    ),
    # Qwen2-MoE: q/k/v biases (qkv_bias), top-2 of 8 experts without renormalisation, a
    # shared expert (56 wide) gated per token by a sigmoid, a dense layer (mlp_only_layers);
    # its heads fill hidden_size.
    "qwen2moe-tiny": (
        "Qwen2MoeConfig",
        {
            **{k: v for k, v in TINY.items() if k != "head_dim"},
            "rope_theta": 110000.0,
            "tie_word_embeddings": False,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 40,
            "shared_expert_intermediate_size": 56,
            "norm_topk_prob": False,
            "mlp_only_layers": [1],
            "pad_token_id": 0,
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
    ),
    # No pre-norms, post-norms on both blocks, QK-norm over the whole projections, biases.
    "olmo2-tiny": (
        "Olmo2Config",
        {
            **TINY,
            "rope_theta": 60000.0,
            "attention_bias": True,
            "tie_word_embeddings": False,
            # HF's default ids (100257/100277) lie outside the tiny vocabulary.
            "pad_token_id": 0,
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
    ),
    # Fused qkv_proj and gate_up_proj, partial rotary (18 of 24 head dims), LongRoPE short
    # factors and attention factor (16384 / 4096), a sliding window on every layer.
    # hidden_size 100: HF validates the factors' length against hidden / heads (25 * 0.75
    # gives 9 pairs), the model uses head_dim (24 * 0.75, 9 pairs as well).
    "phi3-tiny": (
        "Phi3Config",
        {
            **TINY,
            "hidden_size": 100,
            "partial_rotary_factor": 0.75,
            "max_position_embeddings": 16384,
            "original_max_position_embeddings": 4096,
            "rope_theta": 70000.0,
            "rope_scaling": {
                "type": "longrope",
                "short_factor": [1.0, 1.15, 1.4, 1.8, 2.3, 3.1, 4.2, 5.6, 7.5],
                "long_factor": [1.5, 2.0, 3.0, 4.5, 6.0, 9.0, 13.0, 18.0, 25.0],
            },
            "sliding_window": 7,
            "tie_word_embeddings": False,
            # HF's default ids (32000) mean nothing to the borrowed tokenizer.
            "pad_token_id": 0,
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
    ),
    # gpt-oss: attention sinks, q/k/v/o biases, sliding layers that are not HF's default
    # alternation (window 6, crossed by the tests' tokens), YaRN with truncate off (a fractional
    # ramp: dims 1.7 to 5.4 of 12), top-3 of 8 experts by router logit, softmax over those 3,
    # biased router and experts, the clamped SwiGLU.
    "gptoss-tiny": (
        "GptOssConfig",
        {
            **TINY,
            "num_hidden_layers": 5,  # not num_attention_heads (4): the sinks are per head
            "intermediate_size": 40,
            "num_local_experts": 8,
            "num_experts_per_tok": 3,
            "sliding_window": 6,
            "layer_types": [
                "sliding_attention",
                "full_attention",
                "full_attention",
                "sliding_attention",
                "full_attention",
            ],
            "rope_theta": 80000.0,
            "max_position_embeddings": 32768,  # factor x original, as HF's validation wants
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 32.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
                "original_max_position_embeddings": 1024,
            },
            "swiglu_limit": 7.0,
            "tie_word_embeddings": False,
            # HF's default ids lie outside the tiny vocabulary.
            "pad_token_id": 0,
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
    ),
    "gemma3-tiny": (
        "Gemma3TextConfig",
        {
            **TINY,
            "head_dim": 32,
            "query_pre_attn_scalar": 24,
            "sliding_window": 8,
            "rope_theta": 1000000.0,
            "rope_local_base_freq": 10000.0,
            "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
            # Small caps, so tanh bends the random models' logits and scores.
            "final_logit_softcapping": 4.0,
            "attn_logit_softcapping": 3.0,
        },
    ),
}

# How a fixture is written, when not one bf16 model.safetensors: the other weight dtypes
# the loader accepts (values are the bf16 ones, so every dtype holds the same model)
# and a sharded checkpoint (model.safetensors.index.json).
SAVE_OPTIONS: dict[str, dict[str, str]] = {
    "llama-tiny": {"dtype": "float32", "max_shard_size": "4MB"},
    "qwen2-tiny": {"dtype": "float16"},
}


# Parameters initialised wider than the default 0.08, by fixture and name suffix: gpt-oss's
# experts clamp gate and up at +-7, which the default init's pre-activations (~0.6) never reach.
INIT_STD: dict[str, dict[str, float]] = {"gptoss-tiny": {"experts.gate_up_proj": 1.2}}


def write_fixture(name: str, out: Path, seed: int) -> Path:
    """Writes config, bf16 weights, tokenizer and generation config into `out`."""
    import torch
    import transformers

    class_name, kwargs = CONFIGS[name]
    config = getattr(transformers, class_name)(**kwargs, dtype="bfloat16")
    tok_dir = STORE / TOKENIZER_SOURCE
    if not (tok_dir / "tokenizer.json").exists():
        raise FileNotFoundError(f"{tok_dir}/tokenizer.json is missing: run `make fetch` first")
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    gemma = class_name == "Gemma3TextConfig"
    with torch.no_grad():
        # Larger-than-default init so random models have peaked, non-trivial logits.
        for pname, p in model.named_parameters():
            if p.dim() >= 2:
                wide = INIT_STD.get(name, {})
                p.normal_(0.0, next((s for k, s in wide.items() if pname.endswith(k)), 0.08))
            elif "norm" in pname:  # Gemma applies (1 + w), the others w
                p.normal_(0.0 if gemma else 1.0, 0.1)
            else:  # biases
                p.normal_(0.0, 0.1)
    model = model.to(torch.bfloat16)
    save = SAVE_OPTIONS.get(name, {})
    if "dtype" in save:
        model = model.to(getattr(torch, save["dtype"]))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(
        out, safe_serialization=True, max_shard_size=save.get("max_shard_size", "100GB")
    )
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok_dir / f, out / f)
    (out / "edgellm.json").write_text(json.dumps({"fixture": name, "seed": seed}, indent=2) + "\n")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(CONFIGS))
    parser.add_argument(
        "--out", type=Path, help="output directory (default: <store>/<name>-fixture)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out = args.out or STORE / f"{args.name}-fixture"
    if (out / "model.safetensors").exists() or (out / "model.safetensors.index.json").exists():
        return 0
    print(
        f"[fixture] writing random-initialised {args.name} (seed {args.seed}) to {out}", flush=True
    )
    try:
        write_fixture(args.name, out, args.seed)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print("[fixture] done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
