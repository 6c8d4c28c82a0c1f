"""Bad input to an inference program: one clear line on stderr, non-zero exit.

Each case damages a copy of the real checkpoint in a temp dir (truncation,
bit flips, shape/config disagreements) or passes a bad option.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import assert_one_line_error

REPO = Path(__file__).resolve().parents[1]
BIN = REPO / "build" / "smollm2_135m_inference"
STORE = Path(os.environ.get("EDGELLM_MODELS", REPO / "models"))
CKPT = STORE / "smollm2-135m-instruct"

# Skipped only without the checkpoint; a missing binary fails (conftest.smollm2_bin).
pytestmark = pytest.mark.usefixtures("smollm2_bin")


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN), "--n-tokens", "2", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def ckpt_copy(tmp_path: Path) -> Path:
    """A copy of the checkpoint whose files can be damaged (weights symlinked until replaced)."""
    dst = tmp_path / "ckpt"
    dst.mkdir()
    for f in CKPT.iterdir():
        if f.is_file():
            if f.suffix == ".safetensors":
                os.symlink(f, dst / f.name)
            else:
                shutil.copy(f, dst / f.name)
    return dst


def materialize(path: Path) -> None:
    if path.is_symlink():
        target = path.resolve()
        path.unlink()
        shutil.copy(target, path)


def test_missing_model_store(tmp_path: Path) -> None:
    assert_one_line_error(run(env={"EDGELLM_MODELS": str(tmp_path / "nowhere")}), "not found")


def test_missing_checkpoint_dir(tmp_path: Path) -> None:
    assert_one_line_error(run("--model", str(tmp_path / "absent")), "absent")


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "model.safetensors"])
def test_missing_file(ckpt_copy: Path, name: str) -> None:
    (ckpt_copy / name).unlink()
    assert_one_line_error(run("--model", str(ckpt_copy)), name)


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "model.safetensors"])
def test_truncated_file(ckpt_copy: Path, name: str) -> None:
    path = ckpt_copy / name
    materialize(path)
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    assert_one_line_error(run("--model", str(ckpt_copy)), name)


def test_bitflipped_safetensors_header(ckpt_copy: Path) -> None:
    path = ckpt_copy / "model.safetensors"
    materialize(path)
    with open(path, "r+b") as f:
        f.seek(8 + 40)  # inside the JSON header
        byte = f.read(1)
        f.seek(8 + 40)
        f.write(bytes([byte[0] ^ 0x80]))
    assert_one_line_error(run("--model", str(ckpt_copy)), "model.safetensors")


def test_bitflipped_weight_exponent(ckpt_copy: Path) -> None:
    """Setting a bf16 exponent to all ones makes inf/NaN: caught at load, not at run."""
    path = ckpt_copy / "model.safetensors"
    materialize(path)
    with open(path, "r+b") as f:
        header_len = int.from_bytes(f.read(8), "little")
        f.seek(8 + header_len + 1001)  # high byte of one bf16 value
        f.write(b"\x7f")
        f.seek(8 + header_len + 1000)
        f.write(b"\x80")
    assert_one_line_error(run("--model", str(ckpt_copy)), "non-finite")


def test_shape_disagrees_with_config(ckpt_copy: Path) -> None:
    cfg = json.loads((ckpt_copy / "config.json").read_text())
    cfg["intermediate_size"] += 64
    (ckpt_copy / "config.json").write_text(json.dumps(cfg))
    assert_one_line_error(run("--model", str(ckpt_copy)), "gate_proj", "config.json implies")


def test_unsupported_architecture(ckpt_copy: Path) -> None:
    cfg = json.loads((ckpt_copy / "config.json").read_text())
    cfg["architectures"] = ["FalconForCausalLM"]
    (ckpt_copy / "config.json").write_text(json.dumps(cfg))
    assert_one_line_error(run("--model", str(ckpt_copy)), "FalconForCausalLM", "architectures")


def test_prompt_longer_than_context() -> None:
    assert_one_line_error(run("--max-context", "16", "--prompt", "word " * 40), "context")


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_bad_n_tokens(value: str) -> None:
    proc = subprocess.run(
        [str(BIN), "--n-tokens", value], capture_output=True, text=True, timeout=60
    )
    assert_one_line_error(proc, "--n-tokens")


def test_unknown_option() -> None:
    assert_one_line_error(run("--frobnicate"), "frobnicate")
