"""The size ladder: us and llama.cpp on real-shape GGUFs, in one run, on one machine.

Each rung is a random-weight GGUF of a published model's shape (scripts/make_shape_gguf.py
writes it on first use; speed does not depend on the values). Both engines run the same
file and the same token ids, each in its own subprocess (bench/run_bench.py's workers), so
peak RSS is each one's own. Reported per rung: TTFT and decode tokens/s (medians), the
ratios, and our decode against the bandwidth roofline over the bytes one token reads
(the weights a step streams, the routed experts' only for MoE, plus the KV cache up to
that position), measured in the same run.

    .venv/bin/python bench/size_ladder.py [--rung qwen2.5-1.5b:q4_k_m ...] [--reps 3]
        [--lengths 512,2048] [--decode-after 32,2048] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "build" / "python"))
sys.path.insert(0, str(REPO / "scripts"))
from make_shape_gguf import SHAPES, STORE  # noqa: E402
from run_bench import PEER_PYTHON, THREADS, lengths  # noqa: E402

# issue 40's ladder, then the MoE rung (Q4_0: our repacked Q4_K is 6 bits a weight, which
# would not fit a 30B model in 24 GiB; Q4_0 repacks at its file size).
DEFAULT_RUNGS = (
    "qwen2.5-1.5b:q4_k_m",
    "qwen2.5-1.5b:q8_0",
    "llama3.2-3b:q4_k_m",
    "llama3.2-3b:q8_0",
    "qwen3-4b:q4_k_m",
    "qwen3-30b-a3b:q4_0",
)


def rung_dir(rung: str) -> Path:
    shape, _, qtype = rung.partition(":")
    return STORE / "shapes" / f"{shape}-{qtype}"


def ensure_file(rung: str) -> Path:
    shape, _, qtype = rung.partition(":")
    if shape not in SHAPES:
        raise SystemExit(f"error: unknown shape {shape!r} (known: {', '.join(sorted(SHAPES))})")
    out = rung_dir(rung)
    if not (out / "model.gguf").is_file():
        cmd = [sys.executable, str(REPO / "scripts" / "make_shape_gguf.py"), shape]
        subprocess.run(cmd + ["--type", qtype, "--out", str(out)], check=True)
    return out


def run_worker(name: str, folder: Path, args: argparse.Namespace) -> dict | None:
    python = args.peer_python if name == "llamacpp" else sys.executable
    cmd = [python, str(REPO / "bench" / "run_bench.py"), "--worker", name]
    cmd += ["--model", str(folder), "--reps", str(args.reps)]
    cmd += ["--lengths", ",".join(map(str, args.lengths))]
    cmd += ["--decode-after", ",".join(map(str, args.decode_after))]
    cmd += ["--gguf", str(folder / "model.gguf")]
    print(f"[ladder] {folder.name}: {name} ...", flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line.removeprefix("RESULT "))
    print(f"[ladder] {name} failed: {proc.stderr.strip().splitlines()[-3:]}", flush=True)
    return None


def kv_bytes_per_position(rung: str) -> int:
    """Our default KV cache (bf16 keys and values) per position, every layer."""
    s = SHAPES[rung.partition(":")[0]]
    return s.layers * 2 * s.kv_heads * s.head_dim * 2


def render(results: dict, read_bw: float, args: argparse.Namespace) -> str:
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        "?",
    )
    ttft = [f"TTFT {n}" for n in args.lengths]
    dec = [f"decode @{n}" for n in args.decode_after]
    lines = [
        f"Size ladder, {THREADS} threads, {cpu}, {datetime.date.today()}: medians of {args.reps}; "
        f"TTFT in ms, decode in tokens/s; read bandwidth measured in this run {read_bw:.1f} GB/s. "
        "Ratios: ours / llama.cpp speed (>1: we are faster). Roofline: our decode as a fraction "
        "of read bandwidth / (weight bytes a step reads + KV bytes up to that position).",
        "",
        "| rung | file GB | engine | " + " | ".join(ttft + dec) + " | peak RSS GB |",
        "|---" * (len(ttft) + len(dec) + 4) + "|",
    ]
    notes = []
    for rung, (size, rows) in results.items():
        for name, r in rows.items():
            cells = [f"{r[f'ttft_{n}']:.0f}" for n in args.lengths]
            cells += [f"{r[f'tps_{n}']:.2f}" for n in args.decode_after]
            lines.append(
                f"| {rung} | {size / 1e9:.2f} | {name} | "
                + " | ".join(cells)
                + f" | {r['peak_rss_mb'] / 1e3:.2f} |"
            )
        ours, peer = rows.get("ours"), rows.get("llama.cpp")
        if ours and peer:
            cells = [f"{peer[f'ttft_{n}'] / ours[f'ttft_{n}']:.2f}x" for n in args.lengths]
            cells += [f"{ours[f'tps_{n}'] / peer[f'tps_{n}']:.2f}x" for n in args.decode_after]
            lines.append(f"| {rung} | | **ratio** | " + " | ".join(cells) + " | |")
        if ours:
            roof = []
            for n in args.decode_after:
                step = ours["weight_bytes"] + kv_bytes_per_position(rung) * n
                roof.append(f"@{n} {100 * ours[f'tps_{n}'] * step / (read_bw * 1e9):.0f}%")
            notes.append(
                f"- {rung}: a decode step reads {ours['weight_bytes'] / 1e6:.0f} MB of weights; "
                f"decode at {', '.join(roof)} of the roofline; our peak RSS is "
                f"{100 * ours['peak_rss_mb'] * 1e6 / size:.0f}% of the file."
            )
    return "\n".join(lines + [""] + notes) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rung", action="append", help="SHAPE:TYPE (repeatable); default: the whole ladder"
    )
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--lengths", type=lengths, default=(512, 2048))
    parser.add_argument("--decode-after", type=lengths, default=(32, 2048))
    parser.add_argument("--out", type=Path, help="also write the Markdown table here")
    parser.add_argument(
        "--peer-python",
        default=str(PEER_PYTHON),
        help="python with llama_cpp installed (default: .venv-peers from `make bench-peers`)",
    )
    args = parser.parse_args()
    import edgellm_py

    results: dict = {}
    bandwidths = [edgellm_py.measure_roofline(THREADS, "bf16")[0]]
    for rung in args.rung or DEFAULT_RUNGS:
        folder = ensure_file(rung)
        rows = {}
        for name, label in (("ours-gguf", "ours"), ("llamacpp", "llama.cpp")):
            if (res := run_worker(name, folder, args)) is not None:
                rows[label] = res
        results[rung] = ((folder / "model.gguf").stat().st_size, rows)
        bandwidths.append(edgellm_py.measure_roofline(THREADS, "bf16")[0])
    text = render(results, statistics.median(bandwidths), args)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0 if all("ours" in rows for _, rows in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
