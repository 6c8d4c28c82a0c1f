"""GGUF deployments: exact block formats, the reader on real and damaged files, end to end.

* The engine's repacked blocks, dequantized, are bit-identical to gguf-py's own
  dequantization (gguf.quants.dequantize) on real tensors of both models (every format they
  hold: Q4_1, Q8_0, Q5_0, Q4_K, Q6_K) and on a file written by gguf-py's GGUFWriter (Q4_0,
  Q4_1, Q5_0, Q8_0 quantized by gguf-py).
* The GGUF deployment's checkpoint (<checkpoint>/gguf/, the gate's HF reference) holds those
  values exactly, in fp32.
* `--model <checkpoint>/model.gguf` runs; damaged GGUF files give one error line.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import STORE, assert_one_line_error, edgellm_cmd, missing_model
from reference_cache import array_digest, computed_once

REPO = Path(__file__).resolve().parents[1]
MODELS = {
    "smollm2-135m-instruct": STORE / "smollm2-135m-instruct" / "model.gguf",
    "gemma3-270m": STORE / "gemma3-270m" / "model.gguf",
}


def gguf_path(name: str) -> Path:
    path = MODELS[name]
    if not path.is_file():
        missing_model(f"no {path}: run `make fetch`")
    return path


MAX_ROWS = 512  # a big table (Gemma's 262k-row embedding) is checked on its first rows


def gguf_py_rows(tensor: Any) -> np.ndarray:
    """gguf-py's own dequantization of the tensor's first MAX_ROWS rows, in fp32."""
    from gguf.quants import dequantize

    return dequantize(tensor.data[:MAX_ROWS], tensor.tensor_type).astype(np.float32)


def expect_bit_identical(binding: Any, path: Path, tensor: Any) -> None:
    got = binding.gguf_dequantize(str(path), tensor.name, max_rows=MAX_ROWS)
    want = gguf_py_rows(tensor)
    assert got.shape == want.shape, (tensor.name, got.shape, want.shape)
    diff = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert diff.size == 0, (
        f"{tensor.name} ({tensor.tensor_type.name}): {diff.size} values differ, first at "
        f"{diff[0]}: {got.flat[diff[0]]!r} vs {want.flat[diff[0]]!r}"
    )


def quantized_samples(path: Path) -> dict[str, Any]:
    """Per quantized format in the file: its first and its last 2-D tensor, by name."""
    from gguf import GGUFReader

    by_type: dict[str, list[Any]] = {}
    for t in GGUFReader(path).tensors:
        if len(t.shape) == 2 and t.tensor_type.name not in ("F32", "F16", "BF16"):
            by_type.setdefault(t.tensor_type.name, []).append(t)
    return {t.name: t for ts in by_type.values() for t in (ts[0], ts[-1])}


@pytest.mark.parametrize("model", sorted(MODELS))
def test_real_tensors_dequantize_bit_identically(model: str, engine_binding: Any) -> None:
    path = gguf_path(model)
    # gguf-py reads (~8 s for Gemma's vocabulary) and dequantizes in Python: the digests of
    # its rows are kept by content, and a tensor whose digest differs is compared in full.
    digests = computed_once(
        "gguf-py-dequantize",
        lambda: {n: array_digest(gguf_py_rows(t)) for n, t in quantized_samples(path).items()},
        files=[path], packages=("gguf", "numpy"), code=(gguf_py_rows, quantized_samples),
        max_rows=MAX_ROWS,
    )  # fmt: skip
    assert digests, "no quantized tensors found"
    for name, want in digests.items():
        got = engine_binding.gguf_dequantize(str(path), name, max_rows=MAX_ROWS)
        if array_digest(got) != want:
            expect_bit_identical(engine_binding, path, quantized_samples(path)[name])
            pytest.fail(f"{name}: equal to gguf-py's rows, but not to their kept digest")


@pytest.mark.parametrize("model", sorted(MODELS))
def test_map_rows_equal_the_converted_checkpoint(model: str, engine_binding: Any) -> None:
    """gguf_map.json's row orders turn the GGUF's matrices into the checkpoint's (bf16-rounded)."""
    import json

    import torch
    from safetensors import safe_open

    path = gguf_path(model)
    tensors = json.loads((path.parent / "gguf_map.json").read_text())["tensors"]
    with safe_open(str(path.parent / "model.safetensors"), "pt") as fh:
        for hf in (
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.0.self_attn.k_proj.weight",
            "model.layers.0.mlp.down_proj.weight",
        ):
            entry = tensors[hf]
            rows = engine_binding.gguf_dequantize(str(path), entry["gguf"])
            if "row_order" in entry:
                rows = rows[np.asarray(entry["row_order"])]
            got = torch.from_numpy(np.ascontiguousarray(rows)).to(torch.bfloat16)
            assert torch.equal(got, fh.get_tensor(hf)), hf


@pytest.mark.parametrize("model", sorted(MODELS))
def test_exact_checkpoint_holds_the_kernels_values(model: str, engine_binding: Any) -> None:
    """The GGUF deployment (<ckpt>/gguf/) is the gate's truth: HF loads there, in fp32, the very
    values our kernels multiply (bit for bit, rows in HF order), not a bf16 rounding of them."""
    import json

    from safetensors import safe_open

    path = gguf_path(model).parent / "gguf" / "model.gguf"
    if not path.is_file():
        missing_model(f"no {path}: run `make fetch`")
    assert json.loads((path.parent / "config.json").read_text())["torch_dtype"] == "float32"
    tensors = json.loads((path.parent / "gguf_map.json").read_text())["tensors"]
    with safe_open(str(path.parent / "model.safetensors"), "np") as fh:
        for hf in (
            "model.embed_tokens.weight",
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.0.self_attn.k_proj.weight",
            "model.layers.0.self_attn.v_proj.weight",
            "model.layers.0.mlp.down_proj.weight",
        ):
            entry = tensors[hf]
            limit = MAX_ROWS if "embed" in hf else 0  # Gemma's table: its first rows
            rows = engine_binding.gguf_dequantize(str(path), entry["gguf"], max_rows=limit)
            if "row_order" in entry:
                rows = rows[np.asarray(entry["row_order"])]
            want = fh.get_slice(hf)[:limit] if limit else fh.get_tensor(hf)
            assert want.dtype == np.float32, hf
            assert np.array_equal(rows.view(np.uint32), want.view(np.uint32)), hf


def test_gguf_writer_formats_dequantize_bit_identically(
    tmp_path: Path, engine_binding: Any
) -> None:
    from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
    from gguf.quants import quantize

    rng = np.random.default_rng(0)
    path = tmp_path / "formats.gguf"
    writer = GGUFWriter(path, "llama")
    kinds = ["Q4_0", "Q4_1", "Q5_0", "Q8_0", "MXFP4"]
    for kind in kinds:
        values = rng.standard_normal((5, 96)).astype(np.float32)
        qtype = GGMLQuantizationType[kind]
        writer.add_tensor(f"w_{kind}", quantize(values, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reader = GGUFReader(path)
    assert sorted(t.tensor_type.name for t in reader.tensors) == sorted(kinds)
    for t in reader.tensors:
        expect_bit_identical(engine_binding, path, t)


# ---------------------------------------------------------------------------- the CLI

# `make test` builds the program: absent is a failure (conftest's rule), never a skip.
needs_cli = pytest.mark.usefixtures("smollm2_run")


def run_cli(model: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*edgellm_cmd("run"), "--model", str(model), "--n-tokens", "8", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


@needs_cli
def test_cli_runs_the_gguf() -> None:
    proc = run_cli(gguf_path("smollm2-135m-instruct"))
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout, proc.stdout


@needs_cli
def test_cli_runs_the_gguf_deployment_key() -> None:
    """`--model gguf` is <dir>/gguf/model.gguf, beside its exact fp32 checkpoint."""
    if not (gguf_path("smollm2-135m-instruct").parent / "gguf" / "model.gguf").is_file():
        missing_model("no gguf/ deployment: run `make fetch`")
    proc = run_cli(Path("gguf"))
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout, proc.stdout


@pytest.fixture
def gguf_copy(tmp_path: Path) -> Path:
    """The smollm2 checkpoint with a private copy of model.gguf that tests may damage."""
    src = gguf_path("smollm2-135m-instruct").parent
    dst = tmp_path / "ckpt"
    dst.mkdir()
    for f in src.iterdir():
        if f.is_file() and f.name != "model.gguf":
            os.symlink(f, dst / f.name)
    shutil.copy(src / "model.gguf", dst / "model.gguf")
    return dst / "model.gguf"


@needs_cli
def test_cli_truncated_gguf(gguf_copy: Path) -> None:
    size = gguf_copy.stat().st_size
    with open(gguf_copy, "r+b") as f:
        f.truncate(size - 1000)
    assert_one_line_error(run_cli(gguf_copy), "model.gguf", "runs past the end")


@needs_cli
def test_cli_gguf_that_disagrees_with_config(gguf_copy: Path) -> None:
    # Rename llama.block_count's key (same length) so the metadata check finds it missing.
    data = bytearray(gguf_copy.read_bytes())
    at = data.find(b"llama.block_count")
    assert at > 0
    data[at : at + 17] = b"llama.block_cXXXX"
    gguf_copy.write_bytes(bytes(data))
    assert_one_line_error(run_cli(gguf_copy), "llama.block_count", "missing")


@needs_cli
def test_cli_weights_option_rejects_gguf() -> None:
    proc = run_cli(gguf_path("smollm2-135m-instruct"), "--weights", "q8_0")
    assert_one_line_error(proc, "--weights q8_0 applies to bf16 checkpoints")
