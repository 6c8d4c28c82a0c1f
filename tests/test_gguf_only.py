"""A bare .gguf runs from its own metadata: config, tensor names, tokenizer, chat template.

* Each real model's model.gguf alone in a directory: token ids over
  tests/data/tokenizer_corpus.txt equal HF `tokenizers` on the converted tokenizer.json
  (0 mismatches, with and without special tokens), decode equals HF's, the chat template
  is recognised as the converted one is, and the logits of every prompt position are
  bit-identical to the converted GGUF deployment (<ckpt>/gguf/, the exact fp32 checkpoint
  beside the same file), exact and fast arithmetic.
* GGUFs written here by gguf-py from the tiny family fixtures (llama, qwen2, qwen3, gemma3,
  every tensor F32, llama.cpp's conventions: Llama Q/K rows permuted, Llama 3 RoPE scaling
  as rope_freqs.weight, Gemma norms 1 + w) give the converted fixture's logits bit for bit.
* llama.cpp's BPE pre-tokenizer types (tokenizer.ggml.pre) tokenize as the HF tokenizer of
  that type does, on the smollm2 vocabulary.
* Unsupported architectures, tokenizer models and pre types, and RoPE factors that are not
  Llama 3's, get one error naming them (and the supported ones).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import REPO, STORE, assert_one_line_error, edgellm_cmd, missing_model
from test_server import free_port
from test_tokenizer import CORPUS

sys.path.insert(0, str(REPO / "scripts"))
from make_fixture import CONFIGS  # noqa: E402

MODELS = ["smollm2-135m-instruct", "gemma3-270m"]
PROMPT = "The capital of France is Paris. Tokyo, 2024: ü → ✓ 🤗\n\tend"


def store_gguf(name: str) -> Path:
    path = STORE / name / "model.gguf"
    if not path.is_file():
        missing_model(f"no {path}: run `make fetch`")
    return path


def alone(gguf: Path, tmp_path: Path) -> Path:
    """The GGUF as the only file of a fresh directory (a link: the bytes are the store's)."""
    d = tmp_path / "bare"
    d.mkdir()
    os.symlink(gguf, d / "model.gguf")
    return d / "model.gguf"


def first_difference(got: list[int], want: list[int]) -> str:
    at = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
    return f"first at {at}" if at is not None else f"lengths {len(got)} vs {len(want)}"


def mismatches(ours: Any, hf: Any, add_special: bool, texts: list[str] = CORPUS) -> list[str]:
    bad = []
    for text in texts:
        want = hf.encode(text, add_special_tokens=add_special).ids
        got = ours.encode(text, add_special_tokens=add_special)
        if got != want:
            bad.append(f"{text!r}: {first_difference(got, want)}")
    return bad


# ---------------------------------------------------------------------- the real models


@pytest.mark.parametrize("model", MODELS)
def test_tokenizer_from_gguf_matches_hf(model: str, tmp_path: Path, engine_binding: Any) -> None:
    import tokenizers

    path = alone(store_gguf(model), tmp_path)
    ours = engine_binding.Tokenizer.from_gguf(str(path))
    hf = tokenizers.Tokenizer.from_file(str(STORE / model / "tokenizer.json"))
    assert ours.vocab_size() == hf.get_vocab_size()
    for add_special in (False, True):
        bad = mismatches(ours, hf, add_special)
        assert not bad, f"{len(bad)} of {len(CORPUS)} differ: {bad[:5]}"
    for text in CORPUS[:80]:
        ids = hf.encode(text, add_special_tokens=True).ids
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=False), text
        assert ours.decode(ids, True) == hf.decode(ids, skip_special_tokens=True), text


@pytest.mark.parametrize("model", MODELS)
def test_chat_template_from_gguf(model: str, tmp_path: Path, engine_binding: Any) -> None:
    path = alone(store_gguf(model), tmp_path)
    ours = engine_binding.ChatTemplate.from_gguf(str(path))
    converted = engine_binding.ChatTemplate.load(str(STORE / model))
    assert ours.name() == converted.name()
    assert ours.name() == {"smollm2-135m-instruct": "chatml", "gemma3-270m": "none"}[model]
    if ours.available():
        messages = [("system", "Be brief."), ("user", "Hi <|im_end|>"), ("assistant", "Hello")]
        assert ours.render(messages) == converted.render(messages)


def test_any_chat_template_renders(tmp_path: Path, engine_binding: Any) -> None:
    """A GGUF's template of no known family renders (the Jinja interpreter, no recognizer);
    one the interpreter refuses names the metadata key, the construct and its line."""
    path = tmp_path / "model.gguf"
    writer = gguf_writer(path, "llama")
    writer.add_chat_template("{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}")
    finish(writer)
    chat = engine_binding.ChatTemplate.from_gguf(str(path))
    assert chat.name() == "jinja"
    assert chat.render([("user", "hi"), ("assistant", "yo")]) == "[user] hi[assistant] yo"
    refused = tmp_path / "refused.gguf"
    writer = gguf_writer(refused, "llama")
    writer.add_chat_template("{{ bos_token }}\n{% include 'other.jinja' %}")
    finish(writer)
    with pytest.raises(
        engine_binding.Error,
        match=r"metadata 'tokenizer\.chat_template'.*template line 2: .*include",
    ):
        engine_binding.ChatTemplate.from_gguf(str(refused)).render([("user", "hi")])


def setup(binding: Any, path: Path, precision: str) -> Any:
    s = binding.Session()
    s.setup(str(path), threads=2, max_context=64, precision=precision)
    return s


@pytest.mark.parametrize("precision", ["exact", "fast"])
@pytest.mark.parametrize("model", MODELS)
def test_logits_bit_identical_to_converted(
    model: str, precision: str, tmp_path: Path, engine_binding: Any
) -> None:
    converted_path = store_gguf(model).parent / "gguf" / "model.gguf"
    if not converted_path.is_file():
        missing_model(f"no {converted_path}: run `make fetch`")
    bare = setup(engine_binding, alone(store_gguf(model), tmp_path), precision)
    converted = setup(engine_binding, converted_path, precision)
    assert bare.vocab_size == converted.vocab_size
    assert bare.num_layers == converted.num_layers
    assert bare.hidden_size == converted.hidden_size
    assert bare.eos_token_ids == converted.eos_token_ids
    tokens = converted.tokenizer.encode(PROMPT, add_special_tokens=True)
    assert bare.tokenizer.encode(PROMPT, add_special_tokens=True) == tokens
    got = bare.prefill_logits(tokens)
    want = converted.prefill_logits(tokens)
    assert got.shape == want.shape
    diff = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert diff.size == 0, f"{diff.size} logits differ, max {np.abs(got - want).max()}"


def test_cli_runs_a_bare_gguf(tmp_path: Path, smollm2_run: list[str]) -> None:
    path = alone(store_gguf("smollm2-135m-instruct"), tmp_path)
    proc = subprocess.run(
        [*smollm2_run, "--model", str(path), "--n-tokens", "8", "--threads", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout, proc.stdout


def test_python_api_chats_with_a_bare_gguf(tmp_path: Path, edgellm_package: Any) -> None:
    """The bare file chats as its converted deployment does (same tokens, bit-identical
    logits), and its exact-path answer is right. (SmolLM2's first token here is a near tie,
    "The" 25.33 vs "L" 25.24 on the exact path, which the fast path's bf16 rounding may flip:
    the answer is compared across loaders, not pinned to a word, on the fast path.)"""
    store = store_gguf("smollm2-135m-instruct")
    path = alone(store, tmp_path)
    france = [{"role": "user", "content": "What is the capital of France?"}]

    def say(model: Path, **kw: Any) -> str:
        llm = edgellm_package.load(model, threads=2, max_context=128, **kw)
        return llm.chat(france, 20)["choices"][0]["message"]["content"]

    bare = edgellm_package.load(path, threads=2, max_context=128)
    assert bare.model.chat_template.name() == "chatml"
    assert say(path) == say(store)
    assert "Paris" in say(path, precision="exact")


def test_a_bare_file_name_in_the_current_folder(
    tmp_path: Path, smollm2_run: list[str], edgellm_package: Any, monkeypatch: Any
) -> None:
    """`--model model.gguf`, no folder: the file in the current folder, as ./model.gguf is
    (its folder is '.', not an empty path taken for a checkpoint directory), in `run`,
    `serve` and edgellm.load."""
    path = alone(store_gguf("smollm2-135m-instruct"), tmp_path)
    here = {"cwd": path.parent, "capture_output": True, "text": True, "timeout": 300}
    run = subprocess.run([*smollm2_run, "--model", path.name, "--n-tokens", "4"], **here)
    assert run.returncode == 0, run.stderr
    port = free_port()
    serve = [*edgellm_cmd("serve"), "--model", path.name, "--port", str(port), "--threads", "2"]
    proc = subprocess.Popen(serve, cwd=path.parent, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    assert r.status == 200
                    break
            except OSError:
                assert time.time() < deadline, "serve did not come up"
                time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    monkeypatch.chdir(path.parent)
    llm = edgellm_package.load(path.name, threads=2, max_context=128)
    assert llm.chat([{"role": "user", "content": "Hi"}], 4)["choices"][0]["message"]["content"]


# ------------------------------------------------------- GGUFs written here by gguf-py


def gguf_writer(path: Path, arch: str) -> Any:
    from gguf import GGUFWriter

    return GGUFWriter(path, arch)


def finish(writer: Any) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def add_smollm2_vocab(writer: Any, pre: str = "smollm") -> None:
    """tokenizer.ggml.* as the real smollm2 GGUF holds them, with `pre` as the pre-tokenizer."""
    from gguf import GGUFReader

    reader = GGUFReader(store_gguf("smollm2-135m-instruct"))

    def field(key: str) -> Any:
        return reader.fields[key].contents()

    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(field("tokenizer.ggml.tokens"))
    writer.add_token_types(field("tokenizer.ggml.token_type"))
    writer.add_token_merges(field("tokenizer.ggml.merges"))
    writer.add_bos_token_id(field("tokenizer.ggml.bos_token_id"))
    writer.add_eos_token_id(field("tokenizer.ggml.eos_token_id"))
    writer.add_add_bos_token(False)


# HF tokenizer.json pre-tokenizers of the types llama.cpp names (convert_hf_to_gguf.py).
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
    r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
# gpt-oss's tokenizer.json (o200k): cased words carry their contraction.
CASED = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
CONTRACTION = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
GPT4O_SPLIT = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{CASED}*{LOWER}+{CONTRACTION}|"
    rf"[^\r\n\p{{L}}\p{{N}}]?{CASED}+{LOWER}*{CONTRACTION}|"
    r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def byte_level(trim_offsets: bool, use_regex: bool) -> dict[str, Any]:
    return {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": trim_offsets,
        "use_regex": use_regex,
    }


def split(pattern: str) -> dict[str, Any]:
    return {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}


HF_PRE = {
    "gpt-2": (None, byte_level(True, True), False),
    "llama-bpe": (
        None,
        {"type": "Sequence", "pretokenizers": [split(LLAMA3_SPLIT), byte_level(True, False)]},
        True,
    ),
    "gpt-4o": (
        None,
        {"type": "Sequence", "pretokenizers": [split(GPT4O_SPLIT), byte_level(True, False)]},
        False,
    ),
    "qwen2": (
        {"type": "NFC"},
        {"type": "Sequence", "pretokenizers": [split(QWEN2_SPLIT), byte_level(False, False)]},
        False,
    ),
}


# Words whose case changes inside: o200k splits them there ("ĠYou" "Tube"), the other regexes
# keep them whole and SmolLM2's merges join them ("ĠYouTube"); the corpus alone cannot tell
# gpt-4o's split from Llama 3's.
CASE_CHANGES = [
    "Watch it on YouTube, a PowerPoint from GitHub or LinkedIn.",
    "the iPad's WordPress site at McDonald's",
]


@pytest.mark.parametrize("pre", sorted(HF_PRE))
def test_bpe_pre_types_match_hf(pre: str, tmp_path: Path, engine_binding: Any) -> None:
    import tokenizers

    path = tmp_path / "vocab.gguf"
    writer = gguf_writer(path, "llama")
    add_smollm2_vocab(writer, pre)
    finish(writer)
    spec = json.loads((STORE / "smollm2-135m-instruct" / "tokenizer.json").read_text())
    normalizer, pre_tokenizer, ignore_merges = HF_PRE[pre]
    spec["normalizer"], spec["pre_tokenizer"] = normalizer, pre_tokenizer
    spec["model"]["ignore_merges"] = ignore_merges
    hf = tokenizers.Tokenizer.from_str(json.dumps(spec))
    ours = engine_binding.Tokenizer.from_gguf(str(path))
    texts = CORPUS + CASE_CHANGES
    bad = mismatches(ours, hf, False, texts)
    assert not bad, f"{len(bad)} of {len(texts)} differ: {bad[:5]}"


# GGUF tensor names of HF's (per layer), as llama.cpp's converter writes them.
LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "mlp.gate": "ffn_gate_inp",  # a MoE layer's router
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp",  # Qwen2-MoE's shared expert
    "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp",
    "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
}
GEMMA_NAMES = {
    "pre_feedforward_layernorm": "ffn_norm",
    "post_attention_layernorm": "post_attention_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
POST_NORM_ARCHS = ("gemma3", "olmo2")  # post_attention_layernorm follows attention
# Phi-3's fused projections and GraniteMoE's router, shared MLP and output_linear (its
# input_linear is split into gate and up by split_granite_moe).
ARCH_NAMES = {
    "phi3": {"self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"},
    "granitemoe": {
        "block_sparse_moe.router.layer": "ffn_gate_inp",
        "block_sparse_moe.output_linear": "ffn_down_exps",
        "shared_mlp.output_linear": "ffn_down_shexp",
    },
}
ARCH = {
    "llama-tiny": "llama",
    "qwen2-tiny": "qwen2",
    "qwen3-tiny": "qwen3",
    "gemma3-tiny": "gemma3",
    "granite-tiny": "granite",
    "smollm3-tiny": "smollm3",
    "qwen3moe-tiny": "qwen3moe",
    "gptoss-tiny": "gpt-oss",
    "qwen2moe-tiny": "qwen2moe",
    "olmo2-tiny": "olmo2",
    "olmoe-tiny": "olmoe",
    "phi3-tiny": "phi3",
    "granitemoe-tiny": "granitemoe",
    "granitemoeshared-tiny": "granitemoe",
}
# archs whose converter is llama.cpp's LlamaModel (or a subclass of it)
PERMUTED = ("llama", "granite", "granitemoe", "smollm3")


def gguf_name(arch: str, hf: str) -> str:
    if hf.startswith("model.layers."):
        _, _, layer, rest = hf.split(".", 3)
        module, suffix = rest.rsplit(".", 1)
        names = {**LAYER_NAMES, **(GEMMA_NAMES if arch in POST_NORM_ARCHS else {})}
        names |= ARCH_NAMES.get(arch, {})
        if arch not in POST_NORM_ARCHS:
            names["post_attention_layernorm"] = "ffn_norm"
        return f"blk.{layer}.{names[module]}.{suffix}"
    module, suffix = hf.rsplit(".", 1)
    return {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}[
        module
    ] + f".{suffix}"


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: rotate_half pairs -> interleaved, per head."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def llama3_rope_factors(cfg: dict[str, Any]) -> np.ndarray:
    """rope_freqs.weight as llama.cpp's converter computes it (LlamaModel)."""
    import math

    import torch

    scaling, dim = cfg["rope_scaling"], cfg["head_dim"]
    freqs = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor, old_context = scaling["factor"], scaling["original_max_position_embeddings"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    out = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < old_context / high:
            out.append(1.0)
        elif wavelen > old_context / low:
            out.append(factor)
        else:
            smooth = (old_context / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def head_dim(cfg: dict[str, Any]) -> int:
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def split_granite_moe(weights: dict[str, np.ndarray], cfg: dict[str, Any]) -> None:
    """GraniteMoE's fused [gate; up] tensors as llama.cpp's converter splits them: each
    layer's input_linear [E, 2I, H] into ffn_{gate,up}_exps, shared_mlp.input_linear into
    ffn_{gate,up}_shexp."""
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        fused = {
            "block_sparse_moe.input_linear.weight": "exps",
            "shared_mlp.input_linear.weight": "shexp",
        }
        for hf, kind in fused.items():
            if p + hf in weights:
                w = weights.pop(p + hf)
                gate, up = np.split(w, 2, axis=-2)
                weights[f"blk.{layer}.ffn_gate_{kind}.weight"] = gate
                weights[f"blk.{layer}.ffn_up_{kind}.weight"] = up


def add_longrope(writer: Any, cfg: dict[str, Any]) -> None:
    """Phi-3's LongRoPE as llama.cpp's converter writes it (Phi3MiniModel)."""
    import math

    scaling, original = cfg["rope_scaling"], cfg["original_max_position_embeddings"]
    scale = cfg["max_position_embeddings"] / original
    writer.add_rope_scaling_orig_ctx_len(original)
    writer.add_rope_scaling_attn_factors(
        math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1.0 else 1.0
    )
    for kind in ("long", "short"):
        factors = np.asarray(scaling[f"{kind}_factor"], dtype=np.float32)
        writer.add_tensor(f"rope_factors_{kind}.weight", factors)


def stack_experts(weights: dict[str, np.ndarray], cfg: dict[str, Any]) -> None:
    """Each MoE layer's experts as llama.cpp's converter stacks them: one 3-D tensor
    blk.N.ffn_{gate,up,down}_exps [n_expert, rows, cols] per projection."""
    for layer in range(cfg["num_hidden_layers"]):
        for proj in ("gate", "up", "down"):
            names = [
                f"model.layers.{layer}.mlp.experts.{e}.{proj}_proj.weight"
                for e in range(cfg.get("num_experts") or cfg["num_local_experts"])
            ]
            if names[0] in weights:
                stacked = np.stack([weights.pop(n) for n in names])
                weights[f"blk.{layer}.ffn_{proj}_exps.weight"] = stacked


def gpt_oss_tensors(weights: dict[str, np.ndarray], cfg: dict[str, Any]) -> None:
    """gpt-oss's tensors under llama.cpp's names, as its converter (GptOssModel) writes an
    unquantized checkpoint: HF's stacked x @ W experts transposed, gate/up de-interleaved
    (even / odd columns) into ffn_{gate,up}_exps, their biases split the same way; the router as
    ffn_gate_inp, sinks as attn_sinks.weight, post_attention_layernorm as post_attention_norm."""
    for layer in range(cfg["num_hidden_layers"]):
        hf, blk = f"model.layers.{layer}.", f"blk.{layer}."
        gate_up = weights.pop(hf + "mlp.experts.gate_up_proj").transpose(0, 2, 1)  # [E, 2X, H]
        bias = weights.pop(hf + "mlp.experts.gate_up_proj_bias")  # [E, 2X]
        weights[blk + "ffn_gate_exps.weight"] = gate_up[:, ::2, :]
        weights[blk + "ffn_up_exps.weight"] = gate_up[:, 1::2, :]
        weights[blk + "ffn_gate_exps.bias"] = bias[:, ::2]
        weights[blk + "ffn_up_exps.bias"] = bias[:, 1::2]
        down = weights.pop(hf + "mlp.experts.down_proj").transpose(0, 2, 1)  # [E, H, X]
        weights[blk + "ffn_down_exps.weight"] = down
        weights[blk + "ffn_down_exps.bias"] = weights.pop(hf + "mlp.experts.down_proj_bias")
        for kind in ("weight", "bias"):
            weights[blk + f"ffn_gate_inp.{kind}"] = weights.pop(hf + f"mlp.router.{kind}")
        weights[blk + "attn_sinks.weight"] = weights.pop(hf + "self_attn.sinks")
        norm = weights.pop(hf + "post_attention_layernorm.weight")
        weights[blk + "post_attention_norm.weight"] = norm


def write_fixture_gguf(
    fixture: Path,
    name: str,
    out: Path,
    arch: str = "",
    extra: dict[str, Any] | None = None,
    edit: Callable[[Any], None] | None = None,
    chat_template: str | None = None,
    q8_experts: bool = False,
) -> None:
    """The fixture's weights and config as llama.cpp's converter would write them (F32),
    declared as `arch` (default: the fixture's own), with `extra` GGUF tensors, what
    `edit` adds to the writer, and `chat_template` as its tokenizer.chat_template; with
    `q8_experts`, the stacked gate and up experts as Q8_0, quantized by gguf-py."""
    import torch
    from safetensors.torch import load_file

    cfg = json.loads((fixture / "config.json").read_text())
    arch = arch or ARCH[name]
    weights: dict[str, np.ndarray] = {}
    for f in sorted(fixture.glob("*.safetensors")):
        weights |= {k: v.to(torch.float32).numpy() for k, v in load_file(str(f)).items()}
    writer = gguf_writer(out, arch)
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    writer.add_key_length(head_dim(cfg))
    writer.add_value_length(head_dim(cfg))
    writer.add_rope_freq_base(cfg["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    scaling = cfg.get("rope_scaling") or {}
    if scaling.get("rope_type") == "llama3":
        writer.add_tensor("rope_freqs.weight", llama3_rope_factors(cfg))
    if scaling.get("rope_type") == "linear":
        from gguf import RopeScalingType

        writer.add_rope_scaling_type(RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(scaling["factor"])
    if arch == "gemma3":
        writer.add_sliding_window(cfg["sliding_window"])
        writer.add_sliding_window_pattern([t == "sliding_attention" for t in cfg["layer_types"]])
        writer.add_rope_freq_base_swa(cfg["rope_local_base_freq"])
        writer.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    if arch in ("granite", "granitemoe"):
        writer.add_embedding_scale(cfg["embedding_multiplier"])
        writer.add_residual_scale(cfg["residual_multiplier"])
        writer.add_attention_scale(cfg["attention_multiplier"])
        writer.add_logit_scale(cfg["logits_scaling"])
    if arch in ("qwen3moe", "qwen2moe", "olmoe", "granitemoe"):
        writer.add_expert_count(cfg.get("num_experts") or cfg["num_local_experts"])
        writer.add_expert_used_count(cfg["num_experts_per_tok"])
    if arch in ("qwen3moe", "qwen2moe"):  # OLMoE's, GraniteMoE's: feed_forward_length wide
        writer.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    if arch == "qwen2moe":
        writer.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    if arch in ("qwen3moe", "qwen2moe", "olmoe"):
        stack_experts(weights, cfg)
    if arch == "gpt-oss":
        from gguf import RopeScalingType

        writer.add_expert_count(cfg["num_local_experts"])
        writer.add_expert_used_count(cfg["num_experts_per_tok"])
        writer.add_expert_feed_forward_length(cfg["intermediate_size"])
        writer.add_sliding_window(cfg["sliding_window"])
        writer.add_rope_scaling_type(RopeScalingType.YARN)
        writer.add_rope_scaling_factor(scaling["factor"])
        writer.add_rope_scaling_orig_ctx_len(scaling["original_max_position_embeddings"])
        writer.add_rope_scaling_yarn_beta_fast(scaling["beta_fast"])
        writer.add_rope_scaling_yarn_beta_slow(scaling["beta_slow"])
        gpt_oss_tensors(weights, cfg)
    if arch == "granitemoe":
        if cfg.get("shared_intermediate_size"):
            writer.add_expert_shared_feed_forward_length(cfg["shared_intermediate_size"])
        split_granite_moe(weights, cfg)
    if arch == "phi3":
        writer.add_rope_dimension_count(
            int(cfg["partial_rotary_factor"] * cfg["hidden_size"]) // cfg["num_attention_heads"]
        )
        writer.add_sliding_window(cfg.get("sliding_window") or 0)
        add_longrope(writer, cfg)
    add_smollm2_vocab(writer)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    for hf, w in weights.items():
        if hf == "lm_head.weight" and cfg.get("tie_word_embeddings"):
            continue
        if arch in PERMUTED and ".q_proj." in hf:
            w = permute(w, cfg["num_attention_heads"])
        if arch in PERMUTED and ".k_proj." in hf:
            w = permute(w, cfg["num_key_value_heads"])
        if arch == "gemma3" and hf.endswith("norm.weight"):
            w = w + np.float32(1.0)  # llama.cpp stores Gemma's (1 + w)
        tensor = hf if hf.startswith("blk.") else gguf_name(arch, hf)  # stacked experts: named
        if q8_experts and tensor.endswith(("ffn_gate_exps.weight", "ffn_up_exps.weight")):
            from gguf import GGMLQuantizationType
            from gguf.quants import quantize

            q8 = GGMLQuantizationType.Q8_0
            writer.add_tensor(tensor, quantize(w, q8), raw_dtype=q8)
            continue
        writer.add_tensor(tensor, np.ascontiguousarray(w, dtype=np.float32))
    for name_in_gguf, w in (extra or {}).items():
        writer.add_tensor(name_in_gguf, w)
    if edit:
        edit(writer)
    finish(writer)


def drop_tensors(checkpoint: Path, drop: Callable[[str], bool]) -> None:
    """Rewrites a one-file checkpoint without the tensors `drop` names."""
    from safetensors.torch import load_file, save_file

    path = checkpoint / "model.safetensors"
    tensors = {k: v for k, v in load_file(str(path)).items() if not drop(k)}
    save_file(tensors, str(path), metadata={"format": "pt"})


@pytest.fixture(scope="module", params=sorted(ARCH))
def fixture_pair(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, family_fixture: Any
) -> tuple[str, Path, Path]:
    """(name, the converted fixture checkpoint, its GGUF alone in a directory)."""
    name = request.param
    fixture = family_fixture(name)  # a copy of its own: edited below
    cfg = json.loads((fixture / "config.json").read_text())
    # What a GGUF cannot say, the reference checkpoint does not use either: llama.cpp
    # hard-codes Gemma 3's query scale as 1/sqrt(head_dim).
    if "query_pre_attn_scalar" in cfg:
        cfg["query_pre_attn_scalar"] = cfg["head_dim"]
    # ... gpt-oss's sliding layers as the even ones ...
    if cfg["architectures"] == ["GptOssForCausalLM"]:
        cfg["layer_types"] = [
            "sliding_attention" if i % 2 == 0 else "full_attention"
            for i in range(cfg["num_hidden_layers"])
        ]
    # ... and SmolLM3's NoPE layers as every 4th.
    if "no_rope_layers" in cfg:
        cfg["no_rope_layers"] = [int((i + 1) % 4 != 0) for i in range(cfg["num_hidden_layers"])]
    # ... and OLMo 2 without attention biases (llama.cpp's OLMO2 has no place for them).
    if cfg["architectures"] == ["Olmo2ForCausalLM"] and cfg.get("attention_bias"):
        cfg["attention_bias"] = False
        drop_tensors(fixture, lambda name: name.endswith("_proj.bias"))
    # The GGUF carries smollm2's vocabulary and its special ids (<|im_start|>, <|im_end|>).
    cfg["bos_token_id"], cfg["eos_token_id"] = 1, 2
    (fixture / "generation_config.json").unlink(missing_ok=True)  # transformers' default ids
    (fixture / "config.json").write_text(json.dumps(cfg))
    gguf_dir = tmp_path_factory.mktemp(name + "-gguf")
    write_fixture_gguf(fixture, name, gguf_dir / "model.gguf")
    return name, fixture, gguf_dir / "model.gguf"


def test_family_fixture_gguf_logits_bit_identical(
    fixture_pair: tuple[str, Path, Path], engine_binding: Any
) -> None:
    name, fixture, gguf = fixture_pair
    assert CONFIGS[name]  # a fixture make_fixture.py knows
    bare = setup(engine_binding, gguf, "exact")
    converted = setup(engine_binding, fixture, "exact")
    assert bare.eos_token_ids == converted.eos_token_ids
    tokens = converted.tokenizer.encode(PROMPT)
    assert bare.tokenizer.encode(PROMPT) == tokens
    got, want = bare.prefill_logits(tokens), converted.prefill_logits(tokens)
    diff = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert diff.size == 0, f"{name}: {diff.size} logits differ, max {np.abs(got - want).max()}"


@pytest.mark.parametrize("fixture_pair", ["qwen3moe-tiny"], indirect=True)
def test_quantized_stacked_experts_slice_per_expert(
    fixture_pair: tuple[str, Path, Path], engine_binding: Any, tmp_path: Path
) -> None:
    """A quantized 3-D expert tensor is sliced into its experts' blocks: the Q8_0 file answers
    as the F32 one does, within Q8_0's rounding (an expert read at another's offset, as the
    expert-swap gate mutants show, moves the logits by a large fraction of their range)."""
    name, fixture, f32 = fixture_pair
    q8 = tmp_path / "model.gguf"
    write_fixture_gguf(fixture, name, q8, q8_experts=True)
    reference = setup(engine_binding, f32, "exact")
    tokens = reference.tokenizer.encode(PROMPT)
    want = reference.prefill_logits(tokens)
    got = setup(engine_binding, q8, "exact").prefill_logits(tokens)
    err, scale = float(np.abs(got - want).max()), float(np.abs(want).max())
    assert err <= 0.02 * scale, f"max |diff| {err:.3g} > 2% of max |logit| {scale:.3g}"
    assert int(np.argmax(got)) == int(np.argmax(want))


# ---------------------------------------------------------------------------- bad input


def test_unsupported_architecture_is_named(tmp_path: Path, smollm2_run: list[str]) -> None:
    path = tmp_path / "model.gguf"
    writer = gguf_writer(path, "mamba")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    finish(writer)
    proc = subprocess.run(
        [*smollm2_run, "--model", str(path), "--n-tokens", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert_one_line_error(
        proc,
        "architecture 'mamba' is not supported",
        "(supported: gemma3, gpt-oss, granite, granitemoe, llama, olmo2, olmoe, phi3, qwen2, "
        "qwen2moe, qwen3, qwen3moe, smollm3)",
    )


def test_a_tensor_the_architecture_has_no_place_for_is_named(
    tmp_path: Path, family_fixture: Any, smollm2_run: list[str]
) -> None:
    """A llama file holding a QK-norm (Llama has none): the tensor is named as one the
    architecture has no place for, never silently left out of the forward pass."""
    path = tmp_path / "model.gguf"
    fixture = family_fixture("llama-tiny")
    head_dim = json.loads((fixture / "config.json").read_text())["head_dim"]
    norm = {"blk.0.attn_q_norm.weight": np.ones(head_dim, dtype=np.float32)}
    write_fixture_gguf(fixture, "llama-tiny", path, extra=norm)
    proc = subprocess.run(
        [*smollm2_run, "--model", str(path), "--n-tokens", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert_one_line_error(
        proc,
        "tensor 'model.layers.0.self_attn.q_norm.weight' is unexpected for LlamaForCausalLM",
        "(it has no QK-norm)",
    )


def test_a_llama_file_with_biases_runs_as_qwen2(
    tmp_path: Path, family_fixture: Any, engine_binding: Any
) -> None:
    """llama.cpp's converter permutes a Llama file's q/k biases as it permutes the rows of
    q/k (a bias-carrying llama file is Qwen2's layout): read back, the Qwen2 fixture
    written as llama gives the converted fixture's logits bit for bit."""
    fixture = family_fixture("qwen2-tiny")
    cfg = json.loads((fixture / "config.json").read_text())
    cfg["bos_token_id"], cfg["eos_token_id"] = 1, 2  # the GGUF's smollm2 vocabulary
    (fixture / "generation_config.json").unlink(missing_ok=True)
    (fixture / "config.json").write_text(json.dumps(cfg))
    path = tmp_path / "model.gguf"
    write_fixture_gguf(fixture, "qwen2-tiny", path, arch="llama")
    bare, converted = setup(engine_binding, path, "exact"), setup(engine_binding, fixture, "exact")
    tokens = converted.tokenizer.encode(PROMPT)
    got, want = bare.prefill_logits(tokens), converted.prefill_logits(tokens)
    diff = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert diff.size == 0, f"{diff.size} logits differ, max {np.abs(got - want).max()}"


def test_rope_freqs_that_are_not_llama3_are_refused(tmp_path: Path, engine_binding: Any) -> None:
    path = tmp_path / "model.gguf"
    writer = gguf_writer(path, "llama")
    writer.add_context_length(64)
    writer.add_embedding_length(16)
    writer.add_block_count(1)
    writer.add_feed_forward_length(16)
    writer.add_head_count(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tensor("token_embd.weight", np.zeros((4, 16), dtype=np.float32))
    writer.add_tensor("rope_freqs.weight", np.asarray([1, 3, 2, 8], dtype=np.float32))
    finish(writer)
    with pytest.raises(engine_binding.Error, match=r"is not Llama 3 scaling"):
        setup(engine_binding, path, "exact")


@pytest.mark.parametrize(
    ("model", "pre", "message"),
    [
        ("bert", "default", r"'tokenizer\.ggml\.model' is 'bert'.*\(supported: gpt2, llama\)"),
        (
            "gpt2",
            "falcon",
            r"'tokenizer\.ggml\.pre' is 'falcon'.*"
            r"\(supported: gpt-2, gpt-4o, llama-bpe, qwen2, smollm\)",
        ),
    ],
)
def test_unsupported_tokenizer_is_named(
    model: str, pre: str, message: str, tmp_path: Path, engine_binding: Any
) -> None:
    path = tmp_path / "vocab.gguf"
    writer = gguf_writer(path, "llama")
    writer.add_tokenizer_model(model)
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(["a", "b", "ab"])
    writer.add_token_merges(["a b"])
    finish(writer)
    with pytest.raises(engine_binding.Error, match=message):
        engine_binding.Tokenizer.from_gguf(str(path))
