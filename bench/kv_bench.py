"""The KV cache dtype (EDGELLM_KV_CACHE=fp32|bf16|q8_0): decode speed by position, and peak RSS.

SmolLM2-135M, 2 threads. For each KV dtype, fresh processes (one per repetition, medians
of --reps) time 32 greedy decode steps after a 512- and a 4096-token prompt on the bf16
deployment (the checkpoint), and measure the peak RSS of the inference program
(build/edgellm run, as `make run` runs it: default prompt, 32 tokens) on the bf16
and on the GGUF deployment at --max-context 1024. Run it under the shared CPU lock:

    flock /tmp/edgellm-cpu.lock .venv/bin/python bench/kv_bench.py [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "build" / "python"))
MODEL_DIR = REPO / "models" / "smollm2-135m-instruct"
KV_DTYPES = ("fp32", "bf16", "q8_0")
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


def worker(model: Path, kv: str) -> dict:
    import edgellm_py
    from run_bench import prompt_ids

    s = edgellm_py.Session()
    s.setup(str(model), threads=THREADS, max_context=max(POSITIONS) + STEPS, kv_cache=kv)
    return {f"tps_{n}": decode_tps(s, prompt_ids(MODEL_DIR, n)) for n in POSITIONS}


def env_without_kv() -> dict:
    env = {**os.environ}
    env.pop("EDGELLM_KV_CACHE", None)  # the option names the dtype
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "bench"), env.get("PYTHONPATH", "")])
    return env


def speed(kv: str, reps: int) -> list[dict]:
    runs = []
    for _ in range(reps):  # a process per repetition: setup and paging included
        cmd = [sys.executable, __file__, "--worker", str(MODEL_DIR), kv]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env_without_kv(), check=True)
        runs.append(json.loads(proc.stdout.split("RESULT ", 1)[1]))
    return runs


def peak_rss_mb(model: Path, kv: str) -> tuple[float, str]:
    """(peak RSS in MB, the program's KV cache line) of one inference run."""
    cmd = [str(REPO / "build" / "edgellm"), "run", "--model", str(model), "--threads",
           str(THREADS), "--max-context", str(RSS_CONTEXT), "--n-tokens", str(STEPS),
           "--ignore-eos", "--kv-cache", kv]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=env_without_kv())  # fmt: skip
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd}: exit {proc.returncode}: {err.strip()}")
    kv_line = next((ln for ln in err.splitlines() if ln.startswith("KV cache:")), "")
    return usage.ru_maxrss / 1024, kv_line.removeprefix("KV cache:").strip()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        model, kv = args.worker
        print("RESULT " + json.dumps(worker(Path(model), kv)))
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
        runs = speed(kv, args.reps)
        med = {n: statistics.median(r[f"tps_{n}"] for r in runs) for n in POSITIONS}
        cells = []
        for n in POSITIONS:
            each = ", ".join(f"{r['tps_' + str(n)]:.1f}" for r in runs)
            cells.append(f"{med[n]:.1f} ({each})")
        print(f"| {kv} | {cells[0]} | {cells[1]} | {med[4096] / med[512]:.2f} |")
    print(
        f"\npeak RSS of the inference program at --max-context {RSS_CONTEXT} "
        f"(MB, median of {args.reps})"
    )
    print("| KV cache | bf16 deployment | GGUF deployment | GGUF / bf16 |")
    print("|---|---|---|---|")
    rss: dict[tuple[str, str], float] = {}
    for kv in KV_DTYPES:
        for name, model in (("bf16", MODEL_DIR), ("gguf", gguf)):
            runs = [peak_rss_mb(model, kv) for _ in range(args.reps)]
            rss[(kv, name)] = statistics.median(r[0] for r in runs)
        print(
            f"| {runs[0][1]} | {rss[(kv, 'bf16')]:.0f} | {rss[(kv, 'gguf')]:.0f} | "
            f"{100 * rss[(kv, 'gguf')] / rss[(kv, 'bf16')]:.0f}% |"
        )
    print(
        f"GGUF with a bf16 KV cache / bf16 deployment as shipped (fp32 KV cache): "
        f"{100 * rss[('bf16', 'gguf')] / rss[('fp32', 'bf16')]:.0f}%"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
