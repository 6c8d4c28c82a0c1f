"""Write a random-weight GGUF of a real model's shape, for speed measurements.

Speed depends on shapes and block formats, not on weight values: these files let the
size-ladder benchmark (bench/size_ladder.py) run us and llama.cpp on the same real-shape
file without downloading a model. Blocks are random bytes with scales chosen so every
matrix keeps activations near unit scale (no overflow through the layers); norms are 1,
biases 0. The vocabulary is SmolLM2's (from the model store) padded with unused tokens up
to the shape's vocabulary size, and its tokenizer.json is copied beside the file, so
prompts are real text for both engines.

The file is streamed tensor by tensor: a 17 GB model needs ~200 MB of memory to write.

    make_shape_gguf.py qwen3-30b-a3b --type q4_0 --out models/shapes/qwen3-30b-a3b-q4_0
    make_shape_gguf.py qwen2.5-1.5b --type q4_k_m
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
STORE = Path(os.environ.get("EDGELLM_MODELS", REPO / "models"))
VOCAB_SOURCE = "smollm2-135m-instruct"  # its GGUF's vocabulary and tokenizer.json


@dataclass(frozen=True)
class Shape:
    arch: str  # llama.cpp's general.architecture
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    rope_theta: float
    tied: bool
    qkv_bias: bool = False
    qk_norm: bool = False
    experts: int = 0  # MoE: every layer's FFN is `experts` experts of `expert_intermediate`
    experts_used: int = 0
    expert_intermediate: int = 0
    llama3_rope: bool = False
    gpt_oss: bool = False  # biases, attention sinks, biased router and experts, YaRN, windows
    expert_type: str = ""  # the experts' block format when not the file's (gpt-oss: mxfp4)


# The published configs (config.json of each model), by the names people use.
SHAPES = {
    "qwen2.5-1.5b": Shape("qwen2", 1536, 28, 12, 2, 128, 8960, 151936, 1e6, True, qkv_bias=True),
    "llama3.2-3b": Shape("llama", 3072, 28, 24, 8, 128, 8192, 128256, 5e5, True, llama3_rope=True),
    "qwen3-4b": Shape("qwen3", 2560, 36, 32, 8, 128, 9728, 151936, 1e6, True, qk_norm=True),
    "qwen3-30b-a3b": Shape(
        "qwen3moe",
        2048,
        48,
        32,
        4,
        128,
        6144,
        151936,
        1e6,
        False,
        qk_norm=True,
        experts=128,
        experts_used=8,
        expert_intermediate=768,
    ),
    # gpt-oss-20b: MXFP4 experts as OpenAI ships them, the rest at the file's type.
    "gpt-oss-20b": Shape(
        "gpt-oss",
        2880,
        24,
        64,
        8,
        64,
        2880,
        201088,
        150000.0,
        False,
        qkv_bias=True,
        experts=32,
        experts_used=4,
        expert_intermediate=2880,
        gpt_oss=True,
        expert_type="mxfp4",
    ),
}

# Bytes of one block and elements per block, for the formats written here.
BLOCK = {
    "q4_0": (18, 32),
    "q8_0": (34, 32),
    "q4_k": (144, 256),
    "q6_k": (210, 256),
    "mxfp4": (17, 32),
}


def random_blocks(rng: np.random.Generator, fmt: str, rows: int, cols: int) -> np.ndarray:
    """rows x cols weights of format `fmt` as GGUF block bytes: random quants, scales set so
    a row's dot product with a unit-scale vector stays near unit scale."""
    nbytes, elems = BLOCK[fmt]
    blocks = rng.integers(0, 256, size=(rows, cols // elems, nbytes), dtype=np.uint8)
    target = 1.0 / math.sqrt(cols)  # weight std that keeps |W x| ~ |x|
    half = lambda v: np.frombuffer(np.float16(v).tobytes(), np.uint8)  # noqa: E731
    if fmt == "q4_0":  # d, then 16 bytes of nibbles (q - 8: std ~4.6)
        blocks[..., 0:2] = half(target / 4.6)
    elif fmt == "q8_0":  # d, then 32 int8 (std ~74)
        blocks[..., 0:2] = half(target / 74)
    elif fmt == "q4_k":  # d, dmin, 12 bytes of 6-bit scales/mins (mean ~31.5), 128 of nibbles
        d = target / (31.5 * 4.6)
        blocks[..., 0:2] = half(d)
        blocks[..., 2:4] = half(7.5 * d)  # the mins cancel the nibbles' mean of 7.5
    elif fmt == "q6_k":  # 128 low nibbles, 64 high bits, 16 int8 scales (std ~74), d last
        blocks[..., 208:210] = half(target / (74 * 18.5))
    elif fmt == "mxfp4":  # E8M0 byte e (scale 2^(e - 128) on doubled E2M1 codes, std ~5.85)
        blocks[..., 0] = round(128 + math.log2(target / 5.85))
    return blocks.reshape(rows, -1)


def matrix_format(kind: str, layer: int, s: Shape, qtype: str) -> str:
    """llama.cpp's choice per tensor for a mixed type (llama-quant.cpp: Q4_K_M gives Q6_K to
    the output, and to attn_v and ffn_down on the 'use_more_bits' layers), else `qtype`."""
    if s.expert_type and kind.endswith("_exps"):
        return s.expert_type
    if qtype != "q4_k_m":
        return qtype
    if kind == "output":
        return "q6_k"
    more_bits = (
        layer < s.layers // 8 or layer >= 7 * s.layers // 8 or (layer - s.layers // 8) % 3 == 2
    )
    return "q6_k" if kind in ("attn_v", "ffn_down") and more_bits else "q4_k"


def tensors(s: Shape, qtype: str):
    """(name, rows, cols, format or 'f32', experts) of every tensor, in file order."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    yield "token_embd.weight", s.vocab, s.hidden, matrix_format("token_embd", 0, s, qtype), 0
    for i in range(s.layers):
        b = f"blk.{i}."
        yield b + "attn_norm.weight", 1, s.hidden, "f32", 0
        for name, rows in (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
            yield b + name + ".weight", rows, s.hidden, matrix_format(name, i, s, qtype), 0
            if s.qkv_bias:
                yield b + name + ".bias", 1, rows, "f32", 0
        if s.qk_norm:
            yield b + "attn_q_norm.weight", 1, s.head_dim, "f32", 0
            yield b + "attn_k_norm.weight", 1, s.head_dim, "f32", 0
        yield b + "attn_output.weight", s.hidden, q, matrix_format("attn_output", i, s, qtype), 0
        if s.gpt_oss:
            yield b + "attn_output.bias", 1, s.hidden, "f32", 0
            yield b + "attn_sinks.weight", 1, s.heads, "f32", 0
        # gpt-oss names the norm before its experts post_attention_norm (llama.cpp's converter)
        yield (
            b + ("post_attention_norm" if s.gpt_oss else "ffn_norm") + ".weight",
            1,
            s.hidden,
            "f32",
            0,
        )
        if s.experts:
            x, e = s.expert_intermediate, s.experts
            yield b + "ffn_gate_inp.weight", e, s.hidden, "f32", 0
            if s.gpt_oss:
                yield b + "ffn_gate_inp.bias", 1, e, "f32", 0
            for name, rows, cols in (
                ("ffn_gate_exps", x, s.hidden),
                ("ffn_up_exps", x, s.hidden),
                ("ffn_down_exps", s.hidden, x),
            ):
                yield b + name + ".weight", rows, cols, matrix_format(name, i, s, qtype), e
                if s.gpt_oss:
                    yield b + name + ".bias", e, rows, "f32", 0
        else:
            for name, rows, cols in (
                ("ffn_gate", s.intermediate, s.hidden),
                ("ffn_up", s.intermediate, s.hidden),
                ("ffn_down", s.hidden, s.intermediate),
            ):
                yield b + name + ".weight", rows, cols, matrix_format(name, i, s, qtype), 0
    yield "output_norm.weight", 1, s.hidden, "f32", 0
    if not s.tied:
        yield "output.weight", s.vocab, s.hidden, matrix_format("output", 0, s, qtype), 0


def llama3_factors(s: Shape) -> np.ndarray:
    """rope_freqs.weight of Llama 3.2's scaling (factor 32, original context 8192)."""
    factor, old, low, high = 32.0, 8192, 1.0, 4.0
    out = []
    for i in range(0, s.head_dim, 2):
        wavelen = 2 * math.pi * s.rope_theta ** (i / s.head_dim)
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def add_vocabulary(writer, vocab: int) -> None:
    from gguf import GGUFReader

    source = STORE / VOCAB_SOURCE / "gguf" / "model.gguf"
    if not source.is_file():
        raise FileNotFoundError(f"{source} is missing: run `make fetch` first")
    reader = GGUFReader(source)

    def field(key: str):
        return reader.fields[key].contents()

    tokens = list(field("tokenizer.ggml.tokens"))
    types = list(field("tokenizer.ggml.token_type"))
    pad = vocab - len(tokens)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens + [f"<|unused_{i}|>" for i in range(pad)])
    writer.add_token_types(types + [5] * pad)  # llama.cpp's LLAMA_TOKEN_TYPE_UNUSED
    writer.add_token_merges(field("tokenizer.ggml.merges"))
    writer.add_bos_token_id(field("tokenizer.ggml.bos_token_id"))
    writer.add_eos_token_id(field("tokenizer.ggml.eos_token_id"))
    writer.add_add_bos_token(False)


def write(name: str, qtype: str, out: Path, seed: int) -> Path:
    from gguf import GGMLQuantizationType, GGUFWriter

    s = SHAPES[name]
    path, partial = out / "model.gguf", out / "model.gguf.partial"  # renamed when complete
    out.mkdir(parents=True, exist_ok=True)
    w = GGUFWriter(partial, s.arch)
    w.add_name(f"{name} random-weight shape ({qtype})")
    w.add_context_length(32768)
    w.add_embedding_length(s.hidden)
    w.add_block_count(s.layers)
    w.add_feed_forward_length(s.intermediate)
    w.add_head_count(s.heads)
    w.add_head_count_kv(s.kv_heads)
    w.add_key_length(s.head_dim)
    w.add_value_length(s.head_dim)
    w.add_rope_freq_base(s.rope_theta)
    w.add_layer_norm_rms_eps(1e-6)
    if s.experts:
        w.add_expert_count(s.experts)
        w.add_expert_used_count(s.experts_used)
        w.add_expert_feed_forward_length(s.expert_intermediate)
    if s.gpt_oss:  # gpt-oss-20b's config.json: window 128 on the even layers, YaRN x32 of 4096
        from gguf import RopeScalingType

        w.add_sliding_window(128)
        w.add_rope_scaling_type(RopeScalingType.YARN)
        w.add_rope_scaling_factor(32.0)
        w.add_rope_scaling_orig_ctx_len(4096)
    add_vocabulary(w, s.vocab)
    ggml = {
        "q4_0": GGMLQuantizationType.Q4_0,
        "q8_0": GGMLQuantizationType.Q8_0,
        "q4_k": GGMLQuantizationType.Q4_K,
        "q6_k": GGMLQuantizationType.Q6_K,
        "mxfp4": GGMLQuantizationType.MXFP4,
    }
    plan = list(tensors(s, qtype))
    if s.llama3_rope:
        w.add_tensor_info(
            "rope_freqs.weight", (s.head_dim // 2,), np.dtype(np.float32), s.head_dim * 2
        )
    for tname, rows, cols, fmt, experts in plan:
        lead = (experts,) if experts else ()
        if fmt == "f32":
            shape = (cols,) if rows == 1 else (rows, cols)
            w.add_tensor_info(
                tname, lead + shape, np.dtype(np.float32), rows * cols * 4 * max(1, experts)
            )
        else:
            nbytes, elems = BLOCK[fmt]
            byte_shape = lead + (rows, cols // elems * nbytes)
            total = math.prod(byte_shape)
            w.add_tensor_info(tname, byte_shape, np.dtype(np.uint8), total, raw_dtype=ggml[fmt])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    if s.llama3_rope:
        w.write_tensor_data(llama3_factors(s))
    written, total = 0, sum(t.nbytes for t in w.tensors[0].values())
    for i, (tname, rows, cols, fmt, experts) in enumerate(plan):
        if fmt == "f32":
            value = 0.0 if tname.endswith((".bias", "attn_sinks.weight")) else 1.0
            if tname.endswith("ffn_gate_inp.weight"):  # a router: random, so routes vary
                data = rng.normal(0, 1 / math.sqrt(cols), size=(rows, cols)).astype(np.float32)
            else:
                data = np.full((rows, cols) if rows > 1 else (cols,), value, np.float32)
        elif experts:
            data = np.stack([random_blocks(rng, fmt, rows, cols) for _ in range(experts)])
        else:
            data = random_blocks(rng, fmt, rows, cols)
        w.write_tensor_data(data)
        written += data.nbytes
        if i % 20 == 0 or i == len(plan) - 1:
            print(
                f"\r[shape] {path}: {written / 1e9:.2f} of {total / 1e9:.2f} GB", end="", flush=True
            )
    print(flush=True)
    w.close()
    partial.rename(path)
    shutil.copy(STORE / VOCAB_SOURCE / "tokenizer.json", out / "tokenizer.json")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("--type", default="q4_k_m", choices=["q4_0", "q8_0", "q4_k", "q4_k_m"])
    parser.add_argument("--out", type=Path, help="folder (default: <store>/shapes/<shape>-<type>)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out = args.out or STORE / "shapes" / f"{args.shape}-{args.type}"
    if (out / "model.gguf").is_file():
        print(f"[shape] {out / 'model.gguf'} exists")
        return 0
    try:
        write(args.shape, args.type, out, args.seed)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
