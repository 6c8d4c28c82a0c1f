"""Slow reference results, computed once per content and kept across sessions.

Some checks compare our output with an independent implementation that is slow to run:
transformers' GGUF loader and gguf-py dequantize in Python, and the test's own SentencePiece
encoder merges pair by pair. Their results are pure functions of what goes in: the input
files, the library versions, the arguments and the code that computes them. The key hashes
all of that, so a stored result is reused only where the reference would produce the very
same one; anything that changes misses, and a new machine just computes it. Our side of
every comparison runs afresh each time.

Where: beside the HF captures (verify/hf_cache.py), under references/; EDGELLM_HF_CACHE=off
turns it off.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import pickle
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

from verify import hf_cache

T = TypeVar("T")


def computed_once(
    kind: str,
    compute: Callable[[], T],
    *,
    files: list[Path],
    packages: tuple[str, ...],
    code: tuple[Callable[..., Any], ...] = (),
    **inputs: Any,
) -> T:
    """compute(), or its stored result for the same files, package versions, code and inputs.

    ``code`` names the functions compute() relies on beyond its own body (their source is
    part of the key); ``inputs`` are the arguments it closes over (JSON-able)."""
    root = hf_cache.cache_dir()
    if root is None:
        return compute()
    material = {
        "kind": kind,
        "files": hf_cache.file_digests(files, root),
        "packages": {p: metadata.version(p) for p in packages},
        "code": [inspect.getsource(f) for f in (compute, *code)],
        "inputs": inputs,
    }
    digest = hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode())
    path = root / "references" / f"{kind}-{digest.hexdigest()[:32]}.pkl"
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except (OSError, pickle.UnpicklingError, EOFError):  # missing or torn: compute anew
        pass
    result = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        pickle.dump(result, f)
    tmp.replace(path)
    return result


def array_digest(values: Any) -> str:
    """sha256 of an array's dtype, shape and bytes (numpy, or torch through .numpy())."""
    if hasattr(values, "detach"):  # a torch tensor; bf16 has no numpy dtype: its bits
        import torch

        t = values.detach().contiguous()
        kind = str(t.dtype)
        values = t.view(torch.int16).numpy() if t.dtype == torch.bfloat16 else t.numpy()
    else:
        kind = str(values.dtype)
    h = hashlib.sha256(f"{kind}{tuple(values.shape)}".encode())
    h.update(values.tobytes())
    return h.hexdigest()
