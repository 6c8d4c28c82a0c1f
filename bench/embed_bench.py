"""Embedding throughput: a batch of short inputs vs one prefill of the same total tokens.

SmolLM2-135M, 2 threads, the fast (deployed) arithmetic. embed() runs its 64 inputs packed
side by side in one forward pass (Context::prefill_packed); the reference is one prefill of
their concatenation (same token count); for scale, the same inputs one embed() call each.
Medians of --reps alternating runs. Run it under the shared CPU lock:

    flock /tmp/edgellm-cpu.lock .venv/bin/python bench/embed_bench.py [--reps 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "build" / "python"))
MODEL_DIR = REPO / "models" / "smollm2-135m-instruct"
THREADS = 2


def cpu_name() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    return next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if "Model name" in ln), "?")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--inputs", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=8, help="tokens per input")
    args = ap.parse_args()
    import edgellm_py as e

    model = e.Model()
    model.setup(str(MODEL_DIR), threads=THREADS, max_context=4096)
    ctx = e.Context(model)
    inputs = [[1000 + 37 * i + j for j in range(args.tokens)] for i in range(args.inputs)]
    joined = [t for ids in inputs for t in ids]
    e.embed(ctx, inputs)  # warm-up: scratch grown, pages touched
    ctx.prefill(joined)
    batch, single, alone = [], [], []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        for ids in inputs:  # what packing saves: a forward pass (and a weight read) per input
            e.embed(ctx, [ids])
        alone.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        e.embed(ctx, inputs)
        batch.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        ctx.prefill(joined)
        single.append(time.perf_counter() - t0)
    b, s, a = statistics.median(batch), statistics.median(single), statistics.median(alone)
    result = {
        "cpu": cpu_name(),
        "threads": THREADS,
        "inputs": args.inputs,
        "tokens_per_input": args.tokens,
        "total_tokens": len(joined),
        "embed_batch_tok_s": round(len(joined) / b, 1),
        "one_prefill_tok_s": round(len(joined) / s, 1),
        "ratio": round(s / b, 3),
        "one_input_per_call_tok_s": round(len(joined) / a, 1),
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
