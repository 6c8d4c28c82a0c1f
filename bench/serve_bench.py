"""Serving throughput: 1 stream vs 8 concurrent streams through `edgellm serve` (not a test).

Starts the server on SmolLM2, then per repetition runs one streaming request alone and then 8 at
once (greedy, ignore_eos so every stream decodes the same number of tokens). Reports medians of the
repetitions: aggregate tokens/s (all streams' tokens over the wall time from the first request to
the last token), per-stream tokens/s, TTFT and inter-token latency. Holds the shared CPU lock for
the whole run so other timed work does not overlap.

    .venv/bin/python bench/serve_bench.py [--reps 3] [--tokens 64] [--out docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import datetime
import fcntl
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO

import openai

REPO = Path(__file__).resolve().parents[1]
SERVER = REPO / "build" / "edgellm"  # `edgellm serve`
LOCK = "/tmp/edgellm-cpu.lock"
BEGIN, END = "<!-- serve-bench:begin -->", "<!-- serve-bench:end -->"
PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how rain forms.",
    "Describe a busy market in the morning.",
    "Tell me about the history of bicycles.",
    "Write a letter to a friend about a trip.",
    "Explain why the sky is blue.",
    "Describe your favourite meal.",
    "Write a poem about winter.",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_and_lock(ap: argparse.ArgumentParser) -> tuple[argparse.Namespace, IO[str]]:
    """The serving benches' common options parsed, with `ap`'s own, and the shared CPU lock
    taken (unless --no-lock); exits with one line if `edgellm` is not built."""
    ap.add_argument("--model", default=str(REPO / "models" / "smollm2-135m-instruct"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-lock", action="store_true", help=f"the caller already holds {LOCK}")
    args = ap.parse_args()
    if not SERVER.is_file():
        raise SystemExit(f"error: {SERVER} not built (make build)")
    lock = open(LOCK, "w")  # noqa: SIM115 - held for the whole run
    if not args.no_lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
    return args, lock


def start_server(args: list[str]) -> tuple[subprocess.Popen, openai.OpenAI]:
    """`edgellm serve` with `args` on a free port, once /health answers, and its client."""
    port = free_port()
    proc = subprocess.Popen([str(SERVER), "serve", "--port", str(port), *args])
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
            break
        except OSError:
            time.sleep(0.2)
    return proc, openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")


def one_stream(client: openai.OpenAI, name: str, prompt: str, tokens: int) -> dict:
    start = time.perf_counter()
    stamps: list[float] = []
    count = 0
    for chunk in client.chat.completions.create(
        model=name,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=tokens,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            stamps.append(time.perf_counter())
        if chunk.usage:
            count = chunk.usage.completion_tokens
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    return {
        "start": start,
        "end": stamps[-1],
        "tokens": count,
        "ttft": stamps[0] - start,
        "itl": statistics.median(gaps),
        "tps": (count - 1) / (stamps[-1] - stamps[0]),
    }


def scenario(client: openai.OpenAI, name: str, streams: int, tokens: int) -> dict:
    with ThreadPoolExecutor(streams) as pool:
        runs = list(pool.map(lambda p: one_stream(client, name, p, tokens), PROMPTS[:streams] * 1))
    wall = max(r["end"] for r in runs) - min(r["start"] for r in runs)
    return {
        "aggregate": sum(r["tokens"] for r in runs) / wall,
        "per_stream": statistics.median(r["tps"] for r in runs),
        "ttft": statistics.median(r["ttft"] for r in runs),
        "itl": statistics.median(r["itl"] for r in runs),
    }


def model_label(model: str) -> str:
    """The model as the store names it: smollm2-135m-instruct, or .../gguf/model.gguf."""
    path = Path(model).resolve()
    store = (REPO / "models").resolve()
    return str(path.relative_to(store)) if path.is_relative_to(store) else str(path)


def measure(args: argparse.Namespace, model: str) -> dict[int, list[dict]]:
    """1 stream, then 8 at once, args.reps times, on one `edgellm serve` of `model`."""
    proc, client = start_server(
        ["--model", model, "--threads", str(args.threads), "--max-context", "512"]
        # Batching alone: a lone greedy stream would otherwise draft by prompt lookup.
        + ["--parallel", "8", "--no-lookup"]
    )
    try:
        name = client.models.list().data[0].id
        one_stream(client, name, PROMPTS[0], 8)  # warm the contexts' pages, not timed
        results: dict[int, list[dict]] = {1: [], 8: []}
        for rep in range(args.reps):
            for streams in (1, 8):
                results[streams].append(scenario(client, name, streams, args.tokens))
                r = results[streams][-1]
                print(
                    f"{model_label(model)} rep {rep} streams {streams}: {r['aggregate']:.1f} tok/s"
                )
    finally:
        proc.terminate()
        proc.wait()
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", type=Path, help="replace the serving section of this markdown file")
    ap.add_argument("--no-gguf", action="store_true", help="not also the model's gguf/model.gguf")
    args, lock = parse_and_lock(ap)
    models = [args.model]
    gguf = Path(args.model) / "gguf" / "model.gguf"
    if not args.no_gguf and gguf.is_file():
        models.append(str(gguf))
    try:
        runs = {m: measure(args, m) for m in models}
    finally:
        lock.close()

    rows = [
        "| model | streams | aggregate tok/s | per-stream tok/s | TTFT ms | inter-token ms |",
        "|---|---|---|---|---|---|",
    ]
    ratios = []
    for model, results in runs.items():

        def med(streams: int, key: str, results: dict = results) -> float:
            return statistics.median(r[key] for r in results[streams])

        for s in (1, 8):
            rows.append(
                f"| {model_label(model)} | {s} | {med(s, 'aggregate'):.1f} | "
                f"{med(s, 'per_stream'):.1f} | {med(s, 'ttft') * 1e3:.0f} | "
                f"{med(s, 'itl') * 1e3:.1f} |"
            )
        ratios.append(
            f"**{med(8, 'aggregate') / med(1, 'aggregate'):.2f}x** ({model_label(model)})"
        )
    section = "\n".join(
        [
            BEGIN,
            "## Serving: continuous batching (bench/serve_bench.py)",
            "",
            f"{datetime.date.today()}, {cpu_name()}, edgellm serve --threads {args.threads} "
            f"--parallel 8 --no-lookup, chat requests of {args.tokens} greedy tokens "
            f"(ignore_eos), streaming through the openai client; medians of {args.reps} "
            "repetitions, run under the shared CPU lock (absolute numbers drift with the "
            "machine's load; the ratio is the measure).",
            "",
            *rows,
            "",
            f"8 streams give {' and '.join(ratios)} the aggregate tokens/s of 1 stream (target "
            ">= 4x): one decode step serves every running sequence, reading each weight once "
            "(decode_batch / kernels::matmul_rows, quant_matmul_rows).",
            END,
        ]
    )
    print(section)
    if args.out:
        text = args.out.read_text() if args.out.exists() else ""
        if BEGIN in text and END in text:
            text = text[: text.index(BEGIN)] + section + text[text.index(END) + len(END) :]
        else:
            text = text.rstrip() + "\n\n" + section + "\n"
        args.out.write_text(text)
    return 0


def cpu_name() -> str:
    """lscpu's model name: the figures are this CPU's."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


if __name__ == "__main__":
    sys.exit(main())
