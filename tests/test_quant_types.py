"""Every GGUF block format the engine runs decodes bit-identically to gguf-py; one runs end to end.

Each format is written into a GGUF file by gguf-py's GGUFWriter on odd shapes (7 rows, an odd
number of blocks or several super-blocks per row), the engine repacks it into its kernel layout
(kernels/quant.h) and dequantizes it (edgellm_py.gguf_dequantize), and every fp32 value must
equal gguf.quants.dequantize's bit for bit. The blocks come from gguf-py's own quantizer where
it has one, and from random valid block bytes (random quants, random finite fp16 scales) for
every format, so all bit patterns of the quants are exercised. The expected values are computed
here, at test time, by gguf-py. End to end: SmolLM2's GGUF re-quantized to Q5_1 or MXFP4 by
gguf-py still answers through the CLI, and an MXFP4 exponent that overflows is refused by name.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import STORE

# Block layout facts (ggml-common.h): elements, bytes, and the byte offsets of its fp16 fields.
FORMATS: dict[str, tuple[int, int, tuple[int, ...]]] = {
    "Q4_0": (32, 18, (0,)),
    "Q4_1": (32, 20, (0, 2)),
    "Q5_0": (32, 22, (0,)),
    "Q5_1": (32, 24, (0, 2)),
    "Q8_0": (32, 34, (0,)),
    "Q2_K": (256, 84, (80, 82)),
    "Q3_K": (256, 110, (108,)),
    "Q4_K": (256, 144, (0, 2)),
    "Q5_K": (256, 176, (0, 2)),
    "Q6_K": (256, 210, (208,)),
    "IQ4_NL": (32, 18, (0,)),
    "IQ4_XS": (256, 136, (0,)),
    "MXFP4": (32, 17, ()),  # byte 0 is an E8M0 exponent (mxfp4_exponents)
}
ROWS = 7
SMOLLM2_GGUF = STORE / "smollm2-135m-instruct" / "model.gguf"


def blocks_per_row(kind: str) -> int:
    return 5 if FORMATS[kind][0] == 32 else 3  # an odd count of blocks, several super-blocks


def random_halves(rng: np.random.Generator, n: int) -> np.ndarray:
    """Finite fp16 values of both signs over many binades, with zeros and subnormals."""
    mag = np.exp2(rng.uniform(-26.0, 4.0, n)) * rng.choice([-1.0, 1.0], n)
    mag[rng.random(n) < 0.05] = 0.0
    return mag.astype(np.float16)


def random_blocks(kind: str, rng: np.random.Generator) -> np.ndarray:
    """ROWS rows of random bytes, each fp16 field replaced by a random finite half."""
    _, nbytes, halves = FORMATS[kind]
    n_blocks = ROWS * blocks_per_row(kind)
    raw = rng.integers(0, 256, (n_blocks, nbytes), dtype=np.uint8)
    for offset in halves:
        raw[:, offset : offset + 2] = random_halves(rng, n_blocks).view(np.uint8).reshape(-1, 2)
    if kind == "MXFP4":
        raw[:, 0] = mxfp4_exponents(rng, n_blocks)
    return raw.reshape(ROWS, -1)


def mxfp4_exponents(rng: np.random.Generator, n: int) -> np.ndarray:
    """E8M0 bytes the engine takes (0..252): the subnormal half-scales 0 and 1, the largest
    (252, whose code 12 still fits fp32), and random ones between."""
    e = rng.integers(0, 253, n, dtype=np.uint8)
    e[:4] = [0, 1, 2, 252]
    return e


def quantized_blocks(kind: str, rng: np.random.Generator) -> np.ndarray | None:
    """gguf-py's own quantization of random rows, where gguf-py can quantize the format."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    cols = FORMATS[kind][0] * blocks_per_row(kind)
    values = (rng.standard_normal((ROWS, cols)) * rng.uniform(0.01, 3.0, (ROWS, 1))).astype(
        np.float32
    )
    try:
        return quantize(values, GGMLQuantizationType[kind])
    except NotImplementedError:
        return None


def write_gguf(path: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    from gguf import GGMLQuantizationType, GGUFWriter

    writer = GGUFWriter(path, "llama")
    for name, (kind, raw) in tensors.items():
        writer.add_tensor(name, raw, raw_dtype=GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("kind", sorted(FORMATS))
def test_format_dequantizes_bit_identically(kind: str, tmp_path: Path, engine_binding: Any) -> None:
    from gguf import GGUFReader
    from gguf.quants import dequantize

    rng = np.random.default_rng(sorted(FORMATS).index(kind))
    tensors = {"random": (kind, random_blocks(kind, rng))}
    quantized = quantized_blocks(kind, rng)
    if quantized is not None:
        tensors["quantized"] = (kind, quantized)
    path = tmp_path / f"{kind}.gguf"
    write_gguf(path, tensors)
    reader = GGUFReader(path)
    assert sorted(t.name for t in reader.tensors) == sorted(tensors)
    for t in reader.tensors:
        assert t.tensor_type.name == kind
        want = dequantize(t.data, t.tensor_type).astype(np.float32)
        assert want.shape == (ROWS, FORMATS[kind][0] * blocks_per_row(kind))
        assert np.isfinite(want).all(), "the generated blocks must decode to finite values"
        got = engine_binding.gguf_dequantize(str(path), t.name)
        assert got.shape == want.shape, (t.name, got.shape, want.shape)
        diff = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
        assert diff.size == 0, (
            f"{kind} {t.name}: {diff.size} of {want.size} values differ, first at {diff[0]}: "
            f"{got.flat[diff[0]]!r} vs {want.flat[diff[0]]!r}"
        )


@pytest.mark.parametrize("exponent", [253, 255])
def test_mxfp4_exponent_that_overflows_is_refused_naming_the_tensor(
    exponent: int, tmp_path: Path, engine_binding: Any
) -> None:
    """253 and up (255 is NaN in the OCP MX spec) would make code 12 overflow fp32."""
    raw = random_blocks("MXFP4", np.random.default_rng(exponent))
    raw[3, 17 * 2] = exponent  # row 3, block 2
    path = tmp_path / "mxfp4.gguf"
    write_gguf(path, {"blk.0.ffn_up_exps.weight": ("MXFP4", raw)})
    with pytest.raises(engine_binding.Error) as e:
        engine_binding.gguf_dequantize(str(path), "blk.0.ffn_up_exps.weight")
    assert str(e.value) == (
        f"GGUF tensor 'blk.0.ffn_up_exps.weight': MXFP4 block 2 of row 3 has exponent byte "
        f"{exponent}, above 252 (its weights would overflow fp32)"
    )


def test_unsupported_type_lists_every_supported_one(tmp_path: Path, engine_binding: Any) -> None:
    path = tmp_path / "q8_k.gguf"
    write_gguf(path, {"blk.0.attn_q.weight": ("Q8_K", np.zeros((2, 292), dtype=np.uint8))})
    with pytest.raises(engine_binding.Error) as e:
        engine_binding.gguf_dequantize(str(path), "blk.0.attn_q.weight")
    message = str(e.value)
    assert "\n" not in message
    assert "'blk.0.attn_q.weight' has type Q8_K" in message
    supported = message.split("supported: ", 1)[1].rstrip(")").split(", ")
    assert sorted(supported) == sorted([*FORMATS, "F16", "BF16", "F32"])


def smollm2_retyped(tmp_path: Path, kind: str, exponent: int | None = None) -> Path:
    """SmolLM2's GGUF with every Q4_1 projection re-quantized to `kind` by gguf-py, beside
    its checkpoint's files; `exponent` (MXFP4): the first such tensor's first block takes it."""
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
    from gguf.quants import dequantize, quantize

    if not SMOLLM2_GGUF.is_file():
        pytest.skip(f"no {SMOLLM2_GGUF}: run `make fetch`")
    src = SMOLLM2_GGUF.parent
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for f in src.iterdir():
        if f.is_file() and f.name != "model.gguf":
            (ckpt / f.name).symlink_to(f)
    reader = GGUFReader(SMOLLM2_GGUF)
    writer = GGUFWriter(ckpt / "model.gguf", reader.fields["general.architecture"].contents())
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        sub = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub)
    retyped = 0
    for t in reader.tensors:
        if t.tensor_type == GGMLQuantizationType.Q4_1:
            values = dequantize(t.data, t.tensor_type).astype(np.float32)
            blocks = quantize(values, GGMLQuantizationType[kind])
            if exponent is not None and retyped == 0:
                blocks[0, 0] = exponent
            writer.add_tensor(t.name, blocks, raw_dtype=GGMLQuantizationType[kind])
            retyped += 1
        else:
            writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert retyped > 100, "SmolLM2's GGUF should hold its projections as Q4_1"
    return ckpt / "model.gguf"


@pytest.mark.parametrize("kind", ["Q5_1", "MXFP4"])
def test_cli_runs_a_gguf_retyped(kind: str, smollm2_run: list[str], tmp_path: Path) -> None:
    """End to end through a new format: SmolLM2's GGUF with every Q4_1 projection re-quantized
    by gguf-py to Q5_1 (u5 layout with mins) or MXFP4 (c4 layout, E8M0 scales) still answers."""
    proc = subprocess.run(
        [*smollm2_run, "--model", str(smollm2_retyped(tmp_path, kind)), "--n-tokens", "8"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout, proc.stdout


def test_cli_refuses_an_mxfp4_exponent_that_overflows(
    smollm2_run: list[str], tmp_path: Path
) -> None:
    """The loader names the tensor (its HF name: the one the GGUF map gives it)."""
    proc = subprocess.run(
        [*smollm2_run, "--model", str(smollm2_retyped(tmp_path, "MXFP4", 255)), "--n-tokens", "8"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: GGUF tensor for 'model.layers."), proc.stderr
    assert "': MXFP4 block 0 of row 0 has exponent byte 255, above 252" in proc.stderr
