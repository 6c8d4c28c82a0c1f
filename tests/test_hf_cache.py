"""The HF capture cache (llms/verify/hf_cache.py): reused only where HF would give the same.

A stale hit would let the gate judge our engine against a reference made from other weights,
prompts or options, so every piece of the key must change it, and a torn entry is a miss.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from verify import hf_cache
from verify.gate import Capture

OPTIONS = {"prompts": ["Hi"], "n_tokens": 32, "chat": True, "k": 5, "max_context": 2048}


@pytest.fixture
def checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EDGELLM_HF_CACHE", str(tmp_path / "cache"))
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text('{"hidden_size": 8}')
    (ckpt / "model.safetensors").write_bytes(b"\x00" * 64)
    (ckpt / "notes.bin").write_bytes(b"HF never reads this")
    return ckpt


def capture(side: str = "reference") -> Capture:
    return Capture(side=side, runner="hf-transformers-bf16", meta={"seconds": 3.5}, prompts=[])


def test_each_input_changes_the_key(checkpoint: Path) -> None:
    base = hf_cache.capture_key("reference", checkpoint, OPTIONS)
    assert base is not None and base == hf_cache.capture_key("reference", checkpoint, OPTIONS)
    assert hf_cache.capture_key("truth", checkpoint, OPTIONS) != base
    for field, value in (("prompts", ["Hi!"]), ("n_tokens", 33), ("chat", False)):
        assert hf_cache.capture_key("reference", checkpoint, {**OPTIONS, field: value}) != base
    # One byte of the weights (same size: the digest index must not serve the old hash).
    weights = checkpoint / "model.safetensors"
    weights.write_bytes(b"\x00" * 63 + b"\x01")
    changed = hf_cache.capture_key("reference", checkpoint, OPTIONS)
    assert changed != base
    # A file HF does not read leaves it alone.
    (checkpoint / "notes.bin").write_bytes(b"edited")
    assert hf_cache.capture_key("reference", checkpoint, OPTIONS) == changed


def test_round_trip_and_misses(checkpoint: Path) -> None:
    key = hf_cache.capture_key("reference", checkpoint, OPTIONS)
    assert hf_cache.lookup(key, "reference") is None
    stored = capture()
    hf_cache.store(key, stored)
    assert stored.meta["hf_cache"] == f"stored {key}"
    hit = hf_cache.lookup(key, "reference")
    assert hit is not None and hit.runner == stored.runner
    assert hit.meta["hf_cache"].startswith(f"reused {key}") and hit.meta["seconds"] == 0.0
    assert hf_cache.lookup(key, "truth") is None  # an entry is only ever the side it holds
    # A torn entry is a miss, never an error.
    entry = hf_cache.cache_dir() / f"{key}.pkl"
    entry.write_bytes(entry.read_bytes()[:20])
    assert hf_cache.lookup(key, "reference") is None


def test_off_turns_it_off(checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGELLM_HF_CACHE", "off")
    assert hf_cache.cache_dir() is None
    assert hf_cache.capture_key("reference", checkpoint, OPTIONS) is None
    hf_cache.store(None, capture())
    assert hf_cache.lookup(None, "reference") is None
