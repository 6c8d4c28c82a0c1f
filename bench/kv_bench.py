"""The KV cache dtype (EDGELLM_KV_CACHE=fp32|bf16): decode speed by position, and peak RSS.

SmolLM2-135M, 2 threads. For each KV dtype, fresh processes (one per repetition, medians
of --reps) time 32 greedy decode steps after a 512- and a 4096-token prompt on the bf16
deployment (the checkpoint), and measure the peak RSS of the bf16 and the GGUF deployment
set up at 1024 positions (a 512-token prompt and 32 decode steps run first). Run it under
the shared CPU lock:

    flock /tmp/edgellm-cpu.lock .venv/bin/python bench/kv_bench.py [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "build" / "python"))
MODEL_DIR = REPO / "models" / "smollm2-135m-instruct"
KV_DTYPES = ("fp32", "bf16")
POSITIONS = (512, 4096)
RSS_CONTEXT = 1024
THREADS = 2
STEPS = 32


def decode_tps(session, ids: list[int]) -> float:
    tok = int(session.prefill(ids).argmax())
    t0 = time.perf_counter()
    for pos in range(len(ids), len(ids) + STEPS):
        tok = int(session.decode_step(tok, pos).argmax())
    return STEPS / (time.perf_counter() - t0)


def worker(mode: str, model: Path, kv: str) -> dict:
    import edgellm_py
    from run_bench import prompt_ids

    s = edgellm_py.Session()
    context = max(POSITIONS) + STEPS if mode == "speed" else RSS_CONTEXT
    s.setup(str(model), threads=THREADS, max_context=context, kv_cache=kv)
    out: dict = {"kv_cache_dtype": s.kv_cache_dtype, "kv_cache_bytes": s.kv_cache_bytes}
    if mode == "speed":
        for n in POSITIONS:
            out[f"tps_{n}"] = decode_tps(s, prompt_ids(MODEL_DIR, n))
    else:
        decode_tps(s, prompt_ids(MODEL_DIR, 512))
        out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def run(mode: str, model: Path, kv: str, reps: int) -> list[dict]:
    env = {**os.environ}
    env.pop("EDGELLM_KV_CACHE", None)  # the option names the dtype
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "bench"), env.get("PYTHONPATH", "")])
    runs = []
    for _ in range(reps):  # a process per repetition: setup and paging included
        cmd = [sys.executable, __file__, "--worker", mode, str(model), kv]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
        runs.append(json.loads(proc.stdout.split("RESULT ", 1)[1]))
    return runs


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        mode, model, kv = args.worker
        print("RESULT " + json.dumps(worker(mode, Path(model), kv)))
        return 0
    gguf = MODEL_DIR / "gguf" / "model.gguf"
    for path in (MODEL_DIR / "config.json", gguf):
        if not path.is_file():
            print(f"error: {path}: missing (run `make fetch`)", file=sys.stderr)
            return 2
    print(f"SmolLM2-135M, {THREADS} threads, medians of {args.reps} processes")
    print("| KV cache | decode tok/s @512 (runs) | decode tok/s @4096 (runs) | @4096 / @512 |")
    print("|---|---|---|---|")
    for kv in KV_DTYPES:
        runs = run("speed", MODEL_DIR, kv, args.reps)
        med = {n: statistics.median(r[f"tps_{n}"] for r in runs) for n in POSITIONS}
        cells = []
        for n in POSITIONS:
            each = ", ".join(f"{r['tps_' + str(n)]:.1f}" for r in runs)
            cells.append(f"{med[n]:.1f} ({each})")
        print(f"| {kv} | {cells[0]} | {cells[1]} | {med[4096] / med[512]:.2f} |")
    print(f"\npeak RSS at {RSS_CONTEXT} positions (MB, median of {args.reps})")
    print("| KV cache | KV MB | bf16 deployment | GGUF deployment | GGUF / bf16 |")
    print("|---|---|---|---|---|")
    for kv in KV_DTYPES:
        rss = {}
        for name, model in (("bf16", MODEL_DIR), ("gguf", gguf)):
            runs = run("rss", model, kv, args.reps)
            rss[name] = statistics.median(r["peak_rss_mb"] for r in runs)
            kv_mb = runs[0]["kv_cache_bytes"] / 1e6
        print(
            f"| {kv} | {kv_mb:.1f} | {rss['bf16']:.0f} | {rss['gguf']:.0f} | "
            f"{100 * rss['gguf'] / rss['bf16']:.0f}% |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
