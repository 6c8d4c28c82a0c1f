"""HF captures kept by content, so one (checkpoint, prompts, options) pair runs HF only once.

The gate's references (HF bf16 greedy, HF fp32 teacher-forced on its tokens) are a pure
function of what goes in: the checkpoint's files, the prompts, the gate's options, the torch
and transformers versions, and the code that captures them. The key hashes all of that, so a
capture is reused only where HF would produce the very same one, and anything that changes
misses. Our engine's side is never cached: every run measures it afresh.

Where: $EDGELLM_HF_CACHE, else ~/.cache/edgellm/hf-captures ("off" turns it off);
``verify_runner.py --fresh-reference`` recomputes and replaces the entry.
"""

from __future__ import annotations

import hashlib
import json
import os
from importlib import metadata
from pathlib import Path
from typing import Any

from verify.gate import Capture, load_capture, save_capture

_VERIFY = Path(__file__).resolve().parent
# The code a capture is made by: a change to any of it makes every old entry miss.
_CAPTURE_CODE = ("gate.py", "runners/hf_runner.py", "runners/records.py", "hf_cache.py")
# The files HF reads from a checkpoint directory.
_CHECKPOINT_SUFFIXES = (".json", ".safetensors", ".model", ".txt", ".jinja")


def cache_dir() -> Path | None:
    """The cache's folder, or None when $EDGELLM_HF_CACHE is "off"."""
    env = os.environ.get("EDGELLM_HF_CACHE", "")
    if env == "off":
        return None
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edgellm" / "hf-captures"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _file_digest(path: Path, index: dict[str, str]) -> str:
    """sha256 of a file, remembered per (path, size, mtime) so a 500 MB checkpoint is read once."""
    st = path.stat()
    stamp = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    if stamp not in index:
        index[stamp] = _sha256(path)
    return index[stamp]


def file_digests(paths: list[Path], root: Path) -> dict[str, str]:
    """{file name: sha256} of ``paths``, through the index of digests kept in ``root``."""
    index_path = root / "digests.json"
    try:
        index = json.loads(index_path.read_text())
    except (OSError, ValueError):
        index = {}
    known = len(index)
    digests = {p.name: _file_digest(p, index) for p in paths}
    if len(index) > known:  # a file read anew: remember it
        root.mkdir(parents=True, exist_ok=True)
        tmp = index_path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(index))
        tmp.replace(index_path)
    return digests


def checkpoint_digest(checkpoint: Path, root: Path) -> dict[str, str]:
    """{file name: sha256} of what HF reads from ``checkpoint`` (not its subfolders)."""
    files = [
        p for p in sorted(checkpoint.iterdir()) if p.is_file() and p.suffix in _CHECKPOINT_SUFFIXES
    ]
    return file_digests(files, root)


def capture_key(side: str, checkpoint: Path, options: dict[str, Any]) -> str | None:
    """The entry's name for one side's capture; None when the cache is off."""
    root = cache_dir()
    if root is None:
        return None
    material = {
        "side": side,
        "checkpoint": checkpoint_digest(checkpoint, root),
        "options": options,
        "versions": {p: metadata.version(p) for p in ("torch", "transformers")},
        "code": {f: _sha256(_VERIFY / f) for f in _CAPTURE_CODE},
    }
    blob = json.dumps(material, sort_keys=True, default=str).encode()
    return f"{side}-{hashlib.sha256(blob).hexdigest()[:32]}"


def lookup(key: str | None, side: str) -> Capture | None:
    """The stored capture under ``key``, or None (missing, unreadable or off)."""
    root = cache_dir()
    if key is None or root is None or not (root / f"{key}.pkl").is_file():
        return None
    try:
        capture = load_capture(root / f"{key}.pkl", side)
    except Exception:  # a torn or stale entry is a miss, and the run replaces it
        return None
    capture.meta["hf_cache"] = f"reused {key} (HF ran {capture.meta.get('seconds')} s then)"
    capture.meta["seconds"] = 0.0
    return capture


def store(key: str | None, capture: Capture) -> None:
    root = cache_dir()
    if key is None or root is None:
        return
    save_capture(capture, root / f"{key}.pkl")
    capture.meta["hf_cache"] = f"stored {key}"
