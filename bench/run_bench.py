"""Side-by-side benchmark: our engine and its peers, in one run, on one machine.

Each engine runs in its own subprocess (so peak RSS is its own) on the same
token ids: TTFT for 32..4096-token prompts and decode tokens/s after a short and
a long prompt, medians of several repetitions. The roofline (read bandwidth,
the active ISA tier's matmul peak) is measured in the same run and the tables
report ratios to it and to each peer. One section per model.

    .venv/bin/python bench/run_bench.py [--model DIR ...] [--reps 5] [--out docs/benchmarks.md]
        [--lengths 32,128,512] [--decode-after 32,512] [--weights q8_0 ...]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "build" / "python"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROMPT_LENGTHS = (32, 128, 512, 2048, 4096)
# Decode speed is measured after a prompt of each of these lengths (position matters:
# attention reads the whole KV cache every step).
DECODE_AFTER = (32, 512, 4096)
DECODE_STEPS = 32
THREADS = 2
DEFAULT_MODELS = ("smollm2-135m-instruct", "gemma3-270m")
PEER_PYTHON = REPO / ".venv-peers" / "bin" / "python"


def prompt_ids(model_dir: Path, n: int) -> list[int]:
    """n real token ids from the shipped English paragraph, repeated as needed."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    text = (REPO / "tests" / "data" / "english_paragraph.txt").read_text()
    ids = tok.encode(text, add_special_tokens=False).ids
    return (ids * (n // len(ids) + 1))[:n]


def max_context() -> int:
    return max(PROMPT_LENGTHS) + DECODE_STEPS


def time_ours(
    model_dir: Path,
    reps: int,
    model: Path | None = None,
    weights: str = "",
    precision: str = "",
) -> dict:
    """Our engine on model_dir, or on `model` (its GGUF) with model_dir's tokenizer;
    `weights` q8_0|q4_0 quantizes the checkpoint at setup; `precision` exact runs the gate's
    fp32 tier, "" the deployed default (with the EDGELLM_* overrides, as `make run`)."""
    import edgellm_py

    session = edgellm_py.Session()
    session.setup(
        str(model or model_dir),
        threads=THREADS,
        max_context=max_context(),
        weights=weights,
        precision=precision,
        use_environment=True,
    )
    out: dict = {
        "weight_bytes": session.weight_bytes,
        "lm_head_params": session.vocab_size * session.hidden_size,
        "precision": session.exec_config["description"],
    }
    for n in PROMPT_LENGTHS:
        ids = prompt_ids(model_dir, n)
        samples = []
        for _ in range(reps):
            t0 = time.perf_counter()
            session.prefill(ids)
            samples.append(time.perf_counter() - t0)
        out[f"ttft_{n}"] = statistics.median(samples) * 1e3
    for n in DECODE_AFTER:
        ids = prompt_ids(model_dir, n)
        tps = []
        for _ in range(reps):
            # The programs' generate() loop and decode clock: greedy, DECODE_STEPS steps after
            # the prefill's token, past EOS unseen (--ignore-eos), timed in the engine. Plain
            # decoding: prompt lookup would draft from the synthetic prompt and time fewer
            # forwards than the peers run (bench/lookup_bench.py measures lookup).
            run = edgellm_py.generate_timed(
                session.context,
                ids,
                max_tokens=DECODE_STEPS + 1,
                decode_past_stop=True,
                lookup=False,
            )
            assert run.decode_steps == DECODE_STEPS, run.decode_steps
            tps.append(run.decode_steps / (run.decode_ms / 1e3))
        out[f"tps_{n}"] = statistics.median(tps)
    return out


def time_hf(model_dir: Path, reps: int, dtype_name: str) -> dict:
    import torch
    import transformers

    torch.set_num_threads(THREADS)
    dtype = getattr(torch, dtype_name)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    out: dict = {}
    with torch.inference_mode():
        for n in PROMPT_LENGTHS:
            ids = torch.tensor([prompt_ids(model_dir, n)])
            samples = []
            for _ in range(reps):
                t0 = time.perf_counter()
                # Logits for the last position only, as our prefill computes: the full
                # [n, vocab] projection would charge HF ~25% more flops at 4096 tokens.
                model(ids, use_cache=True, logits_to_keep=1)
                samples.append(time.perf_counter() - t0)
            out[f"ttft_{n}"] = statistics.median(samples) * 1e3
        for n in DECODE_AFTER:
            ids = torch.tensor([prompt_ids(model_dir, n)])
            tps = []
            for _ in range(reps):
                res = model(ids, use_cache=True, logits_to_keep=1)
                past, tok = res.past_key_values, res.logits[0, -1].argmax().view(1, 1)
                t0 = time.perf_counter()
                for _ in range(DECODE_STEPS):
                    res = model(tok, past_key_values=past, use_cache=True)
                    past, tok = res.past_key_values, res.logits[0, -1].argmax().view(1, 1)
                tps.append(DECODE_STEPS / (time.perf_counter() - t0))
            out[f"tps_{n}"] = statistics.median(tps)
    return out


def time_llamacpp(gguf: Path, model_dir: Path, reps: int) -> dict:
    import llama_cpp
    from llama_cpp import llama as llama_module

    # llama.cpp's AMX extra buffer type segfaults in ggml_backend_amx_mul_mat on these VMs:
    # load without extra buffer types (its AVX-512 kernels run instead), as the tables say.
    defaults = llama_cpp.llama_model_default_params

    def without_extra_bufts() -> object:
        params = defaults()
        params.use_extra_bufts = False
        return params

    llama_module.llama_cpp.llama_model_default_params = without_extra_bufts
    llm = llama_cpp.Llama(
        model_path=str(gguf), n_ctx=max_context(), n_threads=THREADS, n_batch=512, verbose=False
    )
    import numpy as np

    def last_logits() -> np.ndarray:
        """The newest position's logits (llm.scores holds them only with logits_all)."""
        ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),))

    out: dict = {}
    for n in PROMPT_LENGTHS:
        ids = prompt_ids(model_dir, n)
        samples = []
        for _ in range(reps):
            llm.reset()
            t0 = time.perf_counter()
            llm.eval(ids)
            samples.append(time.perf_counter() - t0)
        out[f"ttft_{n}"] = statistics.median(samples) * 1e3
    for n in DECODE_AFTER:
        tps = []
        for _ in range(reps):
            llm.reset()
            llm.eval(prompt_ids(model_dir, n))
            t0 = time.perf_counter()
            for _ in range(DECODE_STEPS):
                tok = int(last_logits().argmax())
                llm.eval([tok])
            tps.append(DECODE_STEPS / (time.perf_counter() - t0))
        out[f"tps_{n}"] = statistics.median(tps)
    return out


def gguf_deployment(model_dir: Path) -> Path:
    """The GGUF deployment (MODEL=gguf): <dir>/gguf/model.gguf, else an older <dir>/model.gguf."""
    exact = model_dir / "gguf" / "model.gguf"
    return exact if exact.is_file() else model_dir / "model.gguf"


def peak_rss_mb() -> float:
    """This process's own peak RSS: VmHWM belongs to its address space, while ru_maxrss
    survives fork + exec and would report the parent's (the roofline's buffers) as ours."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(args: argparse.Namespace) -> int:
    model_dir = Path(args.model)
    if args.worker == "ours":
        res = time_ours(model_dir, args.reps)
    elif args.worker == "ours-exact":
        res = time_ours(model_dir, args.reps, precision="exact")
    elif args.worker == "ours-gguf":
        res = time_ours(model_dir, args.reps, gguf_deployment(model_dir))
    elif args.worker.startswith("ours-"):  # ours-q8_0: quantized at setup
        res = time_ours(model_dir, args.reps, weights=args.worker.removeprefix("ours-"))
    elif args.worker.startswith("hf-"):
        res = time_hf(model_dir, args.reps, args.worker.removeprefix("hf-"))
    else:
        res = time_llamacpp(Path(args.gguf[-1]), model_dir, args.reps)
    res["peak_rss_mb"] = peak_rss_mb()
    print("RESULT " + json.dumps(res))
    return 0


def run_worker(
    name: str, model: str, args: argparse.Namespace, gguf: Path | None = None
) -> dict | None:
    # llama.cpp lives in its own venv (`make bench-peers`): its worker runs that venv's python.
    python = args.peer_python if name == "llamacpp" else sys.executable
    cmd = [
        python,
        __file__,
        "--worker",
        name,
        "--model",
        model,
        "--reps",
        str(args.reps),
        "--lengths",
        ",".join(map(str, PROMPT_LENGTHS)),
        "--decode-after",
        ",".join(map(str, DECODE_AFTER)),
    ]
    if gguf:
        cmd += ["--gguf", str(gguf)]
    print(f"[bench] {Path(model).name}: {name} ...", flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line.removeprefix("RESULT "))
    print(f"[bench] {name} failed: {proc.stderr.strip().splitlines()[-1:]}", flush=True)
    return None


def lengths(text: str) -> tuple[int, ...]:
    """'32,128,512' -> (32, 128, 512), each a positive token count."""
    try:
        values = tuple(sorted({int(v) for v in text.split(",")}))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated token counts: {text!r}"
        ) from None
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"token counts must be positive: {text!r}")
    return values


def main() -> int:
    global PROMPT_LENGTHS, DECODE_AFTER  # --lengths / --decode-after, in workers too
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model",
        action="append",
        help="checkpoint directory (repeatable); default: " + ", ".join(DEFAULT_MODELS),
    )
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", type=Path, help="also write the Markdown tables here")
    parser.add_argument(
        "--gguf", action="append", default=[], help="llama.cpp peer: LABEL=PATH.gguf"
    )
    parser.add_argument(
        "--no-hf-float32", action="store_true", help="skip the HF float32 row (saves time)"
    )
    parser.add_argument(
        "--peer-python",
        default=str(PEER_PYTHON if PEER_PYTHON.exists() else Path(sys.executable)),
        help="python with llama_cpp installed (default: .venv-peers from `make bench-peers`)",
    )
    parser.add_argument("--no-hf", action="store_true", help="skip the HF rows")
    parser.add_argument(
        "--lengths",
        type=lengths,
        default=PROMPT_LENGTHS,
        help="prompt lengths timed (comma-separated; must include 512; default: %(default)s)",
    )
    parser.add_argument(
        "--decode-after",
        type=lengths,
        default=DECODE_AFTER,
        help="prompt lengths decode is timed after (must include 32 and 512)",
    )
    parser.add_argument(
        "--weights",
        action="append",
        default=[],
        choices=("q8_0", "q4_0"),
        help="also time our engine with the checkpoint quantized at setup (repeatable)",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    PROMPT_LENGTHS, DECODE_AFTER = args.lengths, args.decode_after
    if args.worker:  # any lengths (bench/size_ladder.py runs these workers too)
        args.model = args.model[-1]
        return worker(args)
    if 512 not in PROMPT_LENGTHS or not {32, 512} <= set(DECODE_AFTER):
        parser.error("--lengths must include 512 and --decode-after 32 and 512 (the ratios)")
    models = args.model or [str(REPO / "models" / m) for m in DEFAULT_MODELS]
    for m in models:
        if not (Path(m) / "config.json").exists():
            print(f"error: {m}: no checkpoint (run `make fetch`)", file=sys.stderr)
            return 2

    import edgellm_py

    # The deployed path's GEMM instruction: vdpbf16ps / TDPBF16PS (bf16), FMA below avx512.
    read_bw, fma_peak = edgellm_py.measure_roofline(THREADS, "bf16")
    peers = ["ours", "ours-exact"]
    if not args.no_hf:
        peers += ["hf-bfloat16"] + ([] if args.no_hf_float32 else ["hf-float32"])
    sections: list[tuple[str, dict[str, dict]]] = []
    for m in models:
        rows: dict[str, dict] = {}
        for name in peers:
            if (res := run_worker(name, m, args)) is not None:
                rows[name.replace("-", " ") if name.startswith("ours") else name] = res
        if gguf_deployment(Path(m)).exists():  # the GGUF deployment (quantized blocks)
            if (res := run_worker("ours-gguf", m, args)) is not None:
                rows["ours gguf"] = res
        for w in args.weights:
            if (res := run_worker(f"ours-{w}", m, args)) is not None:
                rows[f"ours {w}"] = res
        for spec in args.gguf:
            label, _, path = spec.partition("=")
            if (res := run_worker("llamacpp", m, args, Path(path))) is not None:
                rows[f"llama.cpp {label}"] = res
        sections.append((m, rows))
    read_bw2, fma_peak2 = edgellm_py.measure_roofline(THREADS, "bf16")
    read_bw, fma_peak = max(read_bw, read_bw2), max(fma_peak, fma_peak2)
    text = "\n".join(render(Path(m).name, rows, read_bw, fma_peak, args) for m, rows in sections)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0 if all("ours" in rows for _, rows in sections) else 1


def render(
    name: str, rows: dict[str, dict], read_bw: float, peak: float, args: argparse.Namespace
) -> str:
    ours = rows.get("ours", {})
    roof_tps = read_bw * 1e9 / ours["weight_bytes"] if ours else 0.0
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.processor(),
    )
    ttft_cols = " | ".join(f"TTFT {n}" for n in PROMPT_LENGTHS)
    tps_cols = " | ".join(f"decode @{n}" for n in DECODE_AFTER)
    ncols = len(PROMPT_LENGTHS) + len(DECODE_AFTER)
    lines = [
        f"# Benchmark: {name}, {THREADS} threads",
        "",
        f"- date: {datetime.date.today()}; machine: {cpu}, {os.cpu_count()} cores; "
        f"medians of {args.reps} repetitions; TTFT in ms; decode in tokens/s over "
        f"{DECODE_STEPS} greedy steps after a prompt of the given length",
        f"- our precision path (ours): {ours.get('precision', '?')}; ours exact: "
        f"{rows.get('ours exact', {}).get('precision', 'not run')}",
        f"- roofline measured in this run: read bandwidth {read_bw:.1f} GB/s, "
        f"matmul peak {peak:.1f} GFLOP/s (the active tier's GEMM instruction); "
        f"decode reads {ours.get('weight_bytes', 0) / 1e6:.0f} MB of weights per token -> "
        f"roofline {roof_tps:.1f} tokens/s",
        "",
        f"| engine | {ttft_cols} | {tps_cols} | peak RSS (MB) |",
        "|---" * (ncols + 2) + "|",
    ]
    for peer, r in rows.items():
        lines.append(
            f"| {peer} | "
            + " | ".join(f"{r[f'ttft_{n}']:.1f}" for n in PROMPT_LENGTHS)
            + " | "
            + " | ".join(f"{r[f'tps_{n}']:.1f}" for n in DECODE_AFTER)
            + f" | {r['peak_rss_mb']:.0f} |"
        )
    if ours:
        lines += [
            "",
            "Ratios (ours vs peer: >1 means we are faster):",
            "",
            f"| peer | {ttft_cols} | {tps_cols} |",
            "|---" * (ncols + 1) + "|",
        ]
        for peer, r in rows.items():
            if peer == "ours":
                continue
            lines.append(
                f"| {peer} | "
                + " | ".join(f"{r[f'ttft_{n}'] / ours[f'ttft_{n}']:.2f}x" for n in PROMPT_LENGTHS)
                + " | "
                + " | ".join(f"{ours[f'tps_{n}'] / r[f'tps_{n}']:.2f}x" for n in DECODE_AFTER)
                + " |"
            )
        # 2 flops per weight per token; prefill runs the LM head for the last position only.
        layer_params = ours["weight_bytes"] / 2 - ours["lm_head_params"]
        flops512 = 2 * layer_params * 512 + 2 * ours["lm_head_params"]
        gflops512 = flops512 / (ours["ttft_512"] / 1e3) / 1e9
        long_short = ours[f"tps_{DECODE_AFTER[-1]}"] / ours["tps_512"]
        at_long = (
            f"decode at {DECODE_AFTER[-1]} runs at {100 * long_short:.0f}% of its speed at 512; "
            if DECODE_AFTER[-1] > 512
            else ""
        )
        lines += [
            "",
            f"Ours vs roofline: decode after 32 tokens {100 * ours['tps_32'] / roof_tps:.0f}% "
            f"of the bandwidth roofline; {at_long}"
            f"prefill-512 {gflops512:.1f} GFLOP/s over the whole prefill = "
            f"{100 * gflops512 / peak:.0f}% of the matmul peak (counts the weight matmuls' "
            "flops only, over the whole TTFT including attention: a lower bound for the "
            "projections; `make profile` gives them per kernel).",
        ]
    if "ours gguf" in rows:
        lines += render_gguf(rows, read_bw)
    for name, q in rows.items():
        if ours and name.startswith("ours q"):
            lines.append(
                f"\n`{name}` (the checkpoint quantized at setup, `--weights "
                f"{name.removeprefix('ours ')}`): decode {q['tps_32']:.1f} tok/s = "
                f"{q['tps_32'] / ours['tps_32']:.2f}x the bf16 deployment, "
                f"{100 * q['tps_32'] / (read_bw * 1e9 / q['weight_bytes']):.0f}% of the roofline "
                f"for its {q['weight_bytes'] / 1e6:.0f} MB per token; TTFT 512 "
                f"{ours['ttft_512'] / q['ttft_512']:.2f}x bf16's; peak RSS "
                f"{q['peak_rss_mb']:.0f} MB."
            )
    return "\n".join(lines) + "\n"


def render_gguf(rows: dict[str, dict], read_bw: float) -> list[str]:
    """The GGUF deployment against its own roofline, the bf16 deployment and llama.cpp."""
    q, ours = rows["ours gguf"], rows.get("ours", {})
    roof = read_bw * 1e9 / q["weight_bytes"]
    lines = [
        "",
        f"GGUF deployment (`ours gguf`: the file's blocks run as stored): decode "
        f"{q['tps_32']:.1f} tok/s = {100 * q['tps_32'] / roof:.0f}% of the roofline for the "
        f"{q['weight_bytes'] / 1e6:.1f} MB it streams per token ({roof:.1f} tok/s).",
    ]
    if ours:
        lines.append(
            f"vs the bf16 deployment: decode {q['tps_32'] / ours['tps_32']:.2f}x, TTFT 512 "
            f"{ours['ttft_512'] / q['ttft_512']:.2f}x, peak RSS {q['peak_rss_mb']:.0f} MB = "
            f"{100 * q['peak_rss_mb'] / ours['peak_rss_mb']:.0f}% of {ours['peak_rss_mb']:.0f} MB."
        )
    for name, r in rows.items():
        if name.startswith("llama.cpp"):
            lines.append(
                f"vs {name}: decode {q['tps_32'] / r['tps_32']:.2f}x, TTFT "
                + "/".join(map(str, PROMPT_LENGTHS))
                + " "
                + "/".join(f"{r[f'ttft_{n}'] / q[f'ttft_{n}']:.2f}x" for n in PROMPT_LENGTHS)
                + "."
            )
    return lines


if __name__ == "__main__":
    sys.exit(main())
