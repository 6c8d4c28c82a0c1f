#!/usr/bin/env python3
"""The verify gate: our engine against HF transformers (bf16 and fp32) on the same checkpoint.

    verify_runner.py --runner=<deployment>.verify_adapter --prompts topk_token|single
                     --model instruct|base|<checkpoint dir> [--max-prompts N] [--spec-gate]

``topk_token`` greedy-decodes 32 tokens per prompt on both sides and gates on every lens:
first divergence (top-5 vs HF bf16), teacher-forced top-5, and the calibrated lens (KL from
HF fp32 against HF bf16's own KL). ``--spec-gate`` is the seed's gate exactly: first
divergence vs HF bf16 alone. ``single`` is diagnosis: one prompt, per-layer cosine against
both references, never fails on values.
Exit status: 0 when nothing failed (or --no-strict / diagnosis), 1 when the gate failed,
2 for bad input (one ``error:`` line).

Phases (--gate-phase): ``reference`` runs HF bf16, ``truth`` HF fp32 teacher-forced on the
reference's tokens, ``capture`` our engine (teacher-forced likewise), ``compare`` judges the
captures and writes the report. ``auto`` (default) runs each model phase in a process of its
own, so no two models sit in memory together, then compares; ``both`` does everything in
this process. See llms/verify/README.md.

``--ray [ADDRESS]`` (with ``--job DEPLOYMENT[:MODEL[:PROMPT_SET]]`` repeated, or this one
``--runner``) runs the model phases of every job as Ray tasks and prints one table: see
verify/sweep.py and docs/scale_out.md.
"""

from __future__ import annotations

import argparse
import importlib
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import numpy as np

_LLMS = Path(__file__).resolve().parents[1]
_REPO = _LLMS.parent
# Run as a script, sys.path[0] is this folder; import the package as `verify.*` instead so no
# module exists twice under two names.
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(_LLMS)
for _p in (str(_LLMS), str(_REPO)):
    if _p not in sys.path:
        sys.path.insert(1, _p)
if str(_REPO / "build" / "python") not in sys.path:
    sys.path.append(str(_REPO / "build" / "python"))  # the binding, when PYTHONPATH lacks it

from verify.comparators import GATE_K, GATE_N_TOKENS, TIERS  # noqa: E402
from verify.errors import EXIT_GATE_FAILED, EXIT_OK, EXIT_USAGE, VerifyError  # noqa: E402
from verify.gate import (  # noqa: E402
    Capture,
    GatePolicy,
    capture_side,
    capture_truth,
    encode_prompts,
    evaluate,
    load_capture,
    save_capture,
)
from verify.report import DEFAULT_REPORT_DIR, Report, ensure_writable, layer_table  # noqa: E402

PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"
ADAPTER_CONTRACT = (
    "MODEL_CHOICES",
    "DEFAULT_MODEL",
    "resolve_model",
    "hf_reference",
    "build_config",
    "build_runner",
)
PHASES = ("auto", "both", "reference", "truth", "capture", "deployed", "floor", "compare")


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line, like every other bad input."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message} (see --help)", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = _Parser(prog="verify_runner.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--runner", help="adapter module, e.g. smollm2_135m.verify_adapter")
    p.add_argument(
        "--prompts",
        choices=("topk_token", "single"),
        default="topk_token",
        help="topk_token: the gate over the prompt set; single: diagnosis, one prompt",
    )
    p.add_argument("--model", help="a MODEL_CHOICES key of the adapter or a checkpoint directory")
    p.add_argument("--max-prompts", type=_positive, help="use the first N prompts")
    p.add_argument(
        "--prompts-file",
        type=Path,
        help="one prompt per line, # comments (default: prompts/<variant>.txt)",
    )
    p.add_argument("--prompt", help="this one prompt instead of the file (diagnosis)")
    p.add_argument("--report-dir", type=Path, default=DEFAULT_REPORT_DIR)
    p.add_argument("--no-strict", action="store_true", help="report failures but exit 0")
    p.add_argument(
        "--spec-gate",
        action="store_true",
        help="the seed's gate exactly: first divergence, top-5, HF bf16 (no fp32 run)",
    )
    p.add_argument(
        "--precision",
        choices=("auto", *TIERS),
        default="auto",
        help="our engine's precision tier for the calibrated lens (auto: what the binding "
        "reports; requantized: weights HF never saw, the lens is informational)",
    )
    p.add_argument(
        "--all-steps", action="store_true", help="accepted for old scripts: every lens gates now"
    )
    p.add_argument("--gate-phase", choices=PHASES, default="auto")
    p.add_argument(
        "--stage",
        choices=("1", "both"),
        default="both",
        help="both (default): stage 1, the logic (exact path vs HF), and stage 2, the deployed "
        "arithmetic vs the exact path (verify/stage2.py); 1: stage 1 alone",
    )
    p.add_argument(
        "--write-budget",
        action="store_true",
        help="with --gate-phase floor: store the measured corpus floor in stage2_budget.json",
    )
    p.add_argument(
        "--work-dir", type=Path, help="where phases leave their captures (auto: a fresh temp dir)"
    )
    p.add_argument("--threads", type=int, default=0, help="engine threads (0: all cores)")
    p.add_argument(
        "--weights",
        choices=("q8_0", "q4_0"),
        help="quantize the checkpoint's matrices at setup (weights HF never saw: the "
        "calibrated lens reports at the requantized tier, the token lenses still gate)",
    )
    p.add_argument(
        "--fresh-reference",
        action="store_true",
        help="run HF even where verify/hf_cache.py holds this very capture, and replace it",
    )
    p.add_argument(
        "--hf-threads",
        type=int,
        default=1,
        help="torch threads for the reference (default 1: see README)",
    )
    ray = p.add_argument_group("Ray (a sweep of jobs as distributed tasks, see verify/sweep.py)")
    ray.add_argument(
        "--ray",
        nargs="?",
        const="",
        metavar="ADDRESS",
        help="run the phases as Ray tasks: on a local cluster, or the one at ADDRESS",
    )
    ray.add_argument(
        "--job",
        action="append",
        default=[],
        metavar="DEPLOYMENT[:MODEL[:PROMPT_SET]]",
        help="one gate run of the sweep (repeatable; implies --ray); PROMPT_SET names "
        "prompts/<set>.txt",
    )
    ray.add_argument("--ray-cpus", type=_positive, help="CPUs of the local cluster (all cores)")
    ray.add_argument(
        "--sweep-timeout", type=float, default=3600.0, help="seconds the sweep may take in all"
    )
    args = p.parse_args(argv)
    if args.job and args.ray is None:
        args.ray = ""
    if not args.job and not args.runner:
        p.error("--runner is required (or --job for a sweep)")
    if args.job and args.runner:
        p.error("--runner and --job exclude each other: name the deployment in each --job")
    if args.ray is not None and (args.gate_phase != "auto" or args.prompts == "single"):
        p.error("--ray runs the gate (--prompts topk_token) with --gate-phase auto")
    if args.gate_phase not in ("auto", "both") and args.work_dir is None:
        p.error(f"--gate-phase {args.gate_phase} needs --work-dir")
    return args


# ---------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------


def load_adapter(name: str) -> ModuleType:
    """Import --runner and check it offers the whole adapter contract."""
    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", name):
        raise VerifyError(
            f"--runner {name!r}: not a dotted module path (e.g. smollm2_135m.verify_adapter)"
        )
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and (name == e.name or name.startswith(e.name + ".")):
            raise VerifyError(
                f"--runner {name}: no such module (an adapter is "
                "llms/<deployment>/verify_adapter.py; llms/ must be on "
                "PYTHONPATH)"
            ) from None
        raise VerifyError(f"--runner {name}: importing it failed: {e}") from None
    except VerifyError:
        raise
    except Exception as e:  # an adapter that does not even import: say where, in one line
        raise VerifyError(
            f"--runner {name}: importing it failed: {type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}"
        ) from None
    missing = [a for a in ADAPTER_CONTRACT if not hasattr(module, a)]
    if missing:
        raise VerifyError(
            f"--runner {name}: not a verify adapter, it lacks "
            f"{', '.join(missing)} (see llms/verify/README.md)"
        )
    choices = module.MODEL_CHOICES
    if not isinstance(choices, dict) or module.DEFAULT_MODEL not in choices:
        raise VerifyError(f"--runner {name}: MODEL_CHOICES must be a dict holding DEFAULT_MODEL")
    not_callable = [a for a in ADAPTER_CONTRACT[2:] if not callable(getattr(module, a))]
    if not_callable:
        raise VerifyError(f"--runner {name}: {', '.join(not_callable)} must be callable")
    return module


def load_prompts(path: Path) -> list[str]:
    """One prompt per line; blank lines and lines starting with # are skipped."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise VerifyError(f"prompts file {path}: not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise VerifyError(f"prompts file {path}: unreadable ({e})") from None
    prompts = [ln.strip() for ln in text.splitlines()]
    prompts = [p for p in prompts if p and not p.startswith("#")]
    if not prompts:
        raise VerifyError(
            f"prompts file {path}: no prompts in it (only blank lines and # comments)"
        )
    return prompts


@dataclass
class Context:
    """Everything every phase agrees on, derived the same way in each process."""

    args: argparse.Namespace
    adapter: ModuleType
    config: Any
    prompts: list[str]
    prompt_source: str
    n_tokens: int = GATE_N_TOKENS
    k: int = GATE_K

    @property
    def diagnose(self) -> bool:
        return self.args.prompts == "single"

    @property
    def chat(self) -> bool:
        return self.config.prompt_format == "chat"

    @property
    def wants_truth(self) -> bool:
        return not self.args.spec_gate

    @property
    def wants_stage2(self) -> bool:
        return not self.diagnose and self.args.stage == "both"


def build_context(args: argparse.Namespace) -> Context:
    adapter = load_adapter(args.runner)
    choice = args.model or adapter.DEFAULT_MODEL
    model_dir = adapter.resolve_model(choice)
    config = adapter.build_config(model_dir, choice)
    if args.prompt is not None:
        if not args.prompt.strip():
            raise VerifyError("--prompt is empty")
        prompts, source = [args.prompt], "--prompt"
    else:
        path = args.prompts_file or PROMPTS_DIR / f"{config.variant}.txt"
        prompts, source = load_prompts(path), str(path)
    if args.prompts == "single":
        prompts = prompts[:1]
    elif args.max_prompts:
        prompts = prompts[: args.max_prompts]
    return Context(args, adapter, config, prompts, source)


# ---------------------------------------------------------------------------------------------
# phases
# ---------------------------------------------------------------------------------------------


def run_meta(ctx: Context) -> dict[str, Any]:
    """What a capture must agree on with the phases that read it."""
    return {"model_dir": str(ctx.config.model_dir), "diagnose": ctx.diagnose}


def check_matches(ctx: Context, capture: Capture) -> None:
    """A capture left in --work-dir by a run with other options must not be judged."""
    same = [p.prompt for p in capture.prompts] == ctx.prompts and all(
        capture.meta.get(k) == v for k, v in run_meta(ctx).items()
    )
    if not same:
        raise VerifyError(
            f"the {capture.side} capture in --work-dir was made with other prompts, model or "
            "mode; rerun its phase with the same options"
        )


def _hf(ctx: Context, precision: str) -> Any:
    from verify.runners.hf_runner import HfRunner

    ref = ctx.adapter.hf_reference(ctx.config.model_dir)
    return HfRunner(ref, ctx.config.max_context, threads=ctx.args.hf_threads, precision=precision)


def hf_key(ctx: Context, side: str) -> str | None:
    """The HF capture cache's key for this run's reference or truth (verify/hf_cache.py)."""
    from verify import hf_cache

    options = {
        **run_meta(ctx),
        "prompts": ctx.prompts,
        "chat": ctx.chat,
        "n_tokens": ctx.n_tokens,
        "k": ctx.k,
        "max_context": ctx.config.max_context,
        "hf_threads": ctx.args.hf_threads,
    }
    checkpoint = Path(ctx.adapter.hf_reference(ctx.config.model_dir))
    return hf_cache.capture_key(side, checkpoint, options)


def cached_hf(ctx: Context, side: str) -> Capture | None:
    """This run's HF capture from the cache, unless --fresh-reference asks for a new one."""
    from verify import hf_cache

    return None if ctx.args.fresh_reference else hf_cache.lookup(hf_key(ctx, side), side)


def run_reference(ctx: Context) -> Capture:
    """HF transformers bf16 on the checkpoint the adapter names (or its cached capture)."""
    from verify import hf_cache

    if (hit := cached_hf(ctx, "reference")) is not None:
        return hit
    start = time.monotonic()
    ref = ctx.adapter.hf_reference(ctx.config.model_dir)
    hf = _hf(ctx, "bf16")
    ids = encode_prompts(hf, ctx.prompts, ctx.chat, ctx.n_tokens, ctx.config.max_context)
    import torch
    import transformers

    capture = capture_side(
        "reference",
        hf,
        ctx.prompts,
        ids,
        ctx.n_tokens,
        capture_layers=ctx.diagnose,
        k=ctx.k,
        meta={
            **run_meta(ctx),
            "hf_reference": str(ref),
            "hf_attn_implementation": hf.attn_implementation,
            "versions": f"torch {torch.__version__}, transformers {transformers.__version__}",
        },
    )
    hf.close()
    capture.meta["seconds"] = round(time.monotonic() - start, 1)
    hf_cache.store(hf_key(ctx, "reference"), capture)
    return capture


def run_truth(ctx: Context, reference: Capture) -> Capture:
    """HF transformers fp32 on the same checkpoint, fed the bf16 reference's tokens (or its
    cached capture: the reference is a function of the same key material)."""
    from verify import hf_cache

    check_matches(ctx, reference)
    if (hit := cached_hf(ctx, "truth")) is not None:
        return hit
    start = time.monotonic()
    hf = _hf(ctx, "fp32")
    capture = capture_truth(hf, reference, capture_layers=ctx.diagnose)
    hf.close()
    capture.meta["seconds"] = round(time.monotonic() - start, 1)
    hf_cache.store(hf_key(ctx, "truth"), capture)
    return capture


def run_capture(ctx: Context, reference: Capture) -> Capture:
    """Our engine through the adapter's runner, teacher-forced on the reference's tokens."""
    check_matches(ctx, reference)
    start = time.monotonic()
    # Only a --weights run passes the keyword: adapters written before it keep working.
    extra = {"weights": ctx.args.weights} if ctx.args.weights else {}
    runner = ctx.adapter.build_runner(ctx.config, threads=ctx.args.threads, **extra)
    ids = encode_prompts(runner, ctx.prompts, ctx.chat, ctx.n_tokens, ctx.config.max_context)
    capture = capture_side(
        "engine",
        runner,
        ctx.prompts,
        ids,
        ctx.n_tokens,
        forced=[p.tokens for p in reference.prompts],
        capture_layers=ctx.diagnose,
        k=ctx.k,
        meta={
            **run_meta(ctx),
            "engine_isa": getattr(runner, "isa", "?"),
            "precision_path": getattr(runner, "precision_path", "?"),
            "precision_tier": getattr(runner, "precision_tier", "reduced"),
        },
    )
    runner.close()
    capture.meta["seconds"] = round(time.monotonic() - start, 1)
    return capture


def _engine(ctx: Context, precision: str) -> Any:
    # Only a --weights run passes the keyword: adapters written before it keep working.
    extra = {"weights": ctx.args.weights} if ctx.args.weights else {}
    return ctx.adapter.build_runner(
        ctx.config, threads=ctx.args.threads, precision=precision, **extra
    )


def run_floor(ctx: Context) -> dict[str, Any]:
    """Stage 2's budget on the corpus: KL(HF fp32 || HF bf16), the same text both sides."""
    from verify import stage2

    start = time.monotonic()
    hf32, hf16 = _hf(ctx, "fp32"), _hf(ctx, "bf16")
    docs = stage2.corpus_token_ids(
        lambda text: hf32.tokenizer(text, add_special_tokens=True)["input_ids"]
    )
    acc = stage2.KlAccumulator()
    for _name, ids in docs:
        pos = 0
        for base, test in zip(
            hf32.document_logits(ids, stage2.CHUNK),
            hf16.document_logits(ids, stage2.CHUNK),
            strict=True,
        ):
            keep = min(base.shape[0], len(ids) - 1 - pos)
            acc.add(base[:keep], test[:keep], ids[pos + 1 : pos + 1 + keep])
            pos += base.shape[0]
    import torch
    import transformers

    key = stage2.budget_key(ctx.adapter.hf_reference(ctx.config.model_dir))
    entry = stage2.floor_entry(
        acc.stats(),
        [len(ids) for _, ids in docs],
        {
            "measured": time.strftime("%Y-%m-%d"),
            "versions": f"torch {torch.__version__}, transformers {transformers.__version__}",
            "seconds": round(time.monotonic() - start, 1),
        },
    )
    if ctx.args.write_budget:
        stage2.write_budget(key, entry)
        print(
            f"stage 2 budget for {key}: floor mean {entry['floor']['mean']:.3g} p99 "
            f"{entry['floor']['p99']:.3g} written to {stage2.BUDGET_FILE}"
        )
    return entry


def run_deployed(ctx: Context, reference: Capture) -> dict[str, Any]:
    """Stage 2's engine side: the deployed path teacher-forced on the reference's tokens, and
    the exact and deployed paths side by side over the corpus."""
    from verify import stage2

    check_matches(ctx, reference)
    start = time.monotonic()
    exact = _engine(ctx, "exact")
    deployed = _engine(ctx, "deployed")
    forced = []
    for p in reference.prompts:
        rows = [deployed.prefill(p.prompt_ids).logits]
        pos = len(p.prompt_ids)
        for t in p.tokens[:-1]:
            rows.append(deployed.decode_step(t, pos).logits)
            pos += 1
        forced.append(np.stack(rows))
    docs = stage2.corpus_token_ids(lambda text: exact.session.tokenizer.encode(text, True))
    corpus = stage2.engine_corpus(exact.session, deployed.session, docs)
    out = {
        "meta": run_meta(ctx),
        "deployed": deployed.exec_config.get("description", "?"),
        "deployed_exact": bool(deployed.exec_config.get("exact")),
        "forced": forced,
        "corpus": corpus,
        "token_counts": [len(ids) for _, ids in docs],
        "seconds": round(time.monotonic() - start, 1),
    }
    exact.close()
    deployed.close()
    return out


def judge_stage2(
    ctx: Context,
    reference: Capture,
    engine: Capture,
    truth: Capture | None,
    deployed: dict[str, Any],
    floor: dict[str, Any] | None,
) -> Any:
    """Stage 2's verdict from the captures (verify/stage2.py)."""
    from verify import stage2

    key = stage2.budget_key(ctx.adapter.hf_reference(ctx.config.model_dir))
    stored = stage2.load_budget(key, deployed["token_counts"])
    if stored is not None:
        source = f"{stage2.BUDGET_FILE.name}[{key}] (measured {stored.get('measured', '?')})"
    elif floor is not None:
        stored, source = floor, "measured in this run (no stored budget for this model)"
    else:
        raise VerifyError(f"stage 2: no stored corpus floor for {key} and none measured")
    corpus_floor = stage2.KlStats(**stored["floor"])
    prompts = prompts_floor = None
    if truth is not None:
        prompts, prompts_floor = stage2.KlAccumulator(), stage2.KlAccumulator()
        for ref, eng, tru, dep in zip(
            reference.prompts, engine.prompts, truth.prompts, deployed["forced"], strict=True
        ):
            n = min(len(ref.tokens), len(eng.forced_logits), len(tru.logits), len(dep))
            prompts.add(eng.forced_logits[:n], dep[:n], ref.tokens[:n])
            prompts_floor.add(tru.logits[:n], ref.logits[:n], ref.tokens[:n])
    return stage2.judge(
        deployed["deployed"], deployed["corpus"], corpus_floor, source, prompts, prompts_floor
    )


def run_compare(
    ctx: Context,
    reference: Capture,
    engine: Capture,
    truth: Capture | None = None,
    deployed: dict[str, Any] | None = None,
    floor: dict[str, Any] | None = None,
) -> int:
    """Judge, write the report, print the summary; the exit status."""
    stage2 = (
        judge_stage2(ctx, reference, engine, truth, deployed, floor)
        if deployed is not None
        else None
    )
    report = judge(ctx, reference, engine, truth, stage2, deployed and deployed.get("seconds"))
    if ctx.diagnose or ctx.args.no_strict or not report.has_failure():
        return EXIT_OK
    return EXIT_GATE_FAILED


def judge(
    ctx: Context,
    reference: Capture,
    engine: Capture,
    truth: Capture | None = None,
    stage2: Any = None,
    stage2_seconds: float | None = None,
) -> Report:
    """The compare phase: judge the captures, write the report, print its summary."""
    for capture in (reference, engine, truth):
        if capture is not None:
            check_matches(ctx, capture)
    args = ctx.args
    tier = engine.meta.get("precision_tier", "reduced")
    if args.precision != "auto":
        tier = args.precision
    policy = GatePolicy(spec=args.spec_gate, tier=tier)
    results = evaluate(engine, reference, truth, ctx.k, policy)
    meta = {
        "deployment": ctx.config.deployment,
        "mode": args.prompts,
        "model_choice": ctx.config.model_choice,
        "model_dir": str(ctx.config.model_dir),
        "variant": ctx.config.variant,
        "prompt_format": ctx.config.prompt_format,
        "prompt_source": ctx.prompt_source,
        "k": ctx.k,
        "n_tokens": ctx.n_tokens,
        "gate": "spec (first divergence vs HF bf16)" if args.spec_gate else "every lens",
        "strict": not args.no_strict,
        "gate_phase": args.gate_phase,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        **reference.meta,
        **engine.meta,
        "precision_tier": tier,
        "truth_runner": truth.runner if truth is not None else "not run (--spec-gate)",
        "hf_cache": ", ".join(
            f"{c.side} {c.meta.get('hf_cache', 'not cached')}" for c in (reference, truth) if c
        ),
        "seconds": {
            "reference (HF bf16)": reference.meta.get("seconds"),
            "truth (HF fp32)": truth.meta.get("seconds") if truth is not None else None,
            "engine": engine.meta.get("seconds"),
            "stage 2 (deployed and exact path, corpus + prompts)": stage2_seconds,
        },
    }
    report = Report(meta)
    for r in results:
        report.add(r)
    report.stage2 = stage2
    report.write(args.report_dir)
    if ctx.diagnose:
        for r in results:
            print(f"prompt: {r.prompt}")
            for note in r.notes:
                print(f"note: {note}")
            print("\n".join(layer_table(r.layers, r.layers_truth)))
        for note in report.notes:
            print(f"note: {note}")
    print(report.summary_line())
    return report


class PhaseFailed(Exception):
    """A child phase already said what went wrong; exit with its status and nothing more."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def spawn(argv: list[str], phase: str, work_dir: Path) -> None:
    """Run one phase of this same command line in a process of its own."""
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        *argv,
        "--gate-phase",
        phase,
        "--work-dir",
        str(work_dir),
    ]
    rc = subprocess.run(cmd, check=False).returncode
    if rc < 0:
        raise VerifyError(f"the {phase} phase died with signal {-rc}")
    if rc != 0:
        raise PhaseFailed(rc)


def run(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.ray is not None:
        return run_on_ray(args, argv)
    ctx = build_context(args)
    phase = args.gate_phase
    if phase in ("auto", "both", "compare"):
        ensure_writable(args.report_dir)
    work = args.work_dir
    if work is not None:
        work.mkdir(parents=True, exist_ok=True)
    if phase == "reference":
        save_capture(run_reference(ctx), work / "reference.pkl")
        return EXIT_OK
    if phase == "truth":
        reference = load_capture(work / "reference.pkl", "reference")
        save_capture(run_truth(ctx, reference), work / "truth.pkl")
        return EXIT_OK
    if phase == "capture":
        reference = load_capture(work / "reference.pkl", "reference")
        save_capture(run_capture(ctx, reference), work / "engine.pkl")
        return EXIT_OK
    if phase == "deployed":
        reference = load_capture(work / "reference.pkl", "reference")
        _save(run_deployed(ctx, reference), work / "deployed.pkl")
        return EXIT_OK
    if phase == "floor":
        _save(run_floor(ctx), work / "floor.pkl")
        return EXIT_OK
    if phase == "compare":
        return compare_saved(ctx, work)
    if phase == "both":
        reference = run_reference(ctx)
        truth = run_truth(ctx, reference) if ctx.wants_truth else None
        engine = run_capture(ctx, reference)
        deployed = floor = None
        if ctx.wants_stage2:
            deployed = run_deployed(ctx, reference)
            if needs_floor(ctx, deployed["token_counts"]):
                floor = run_floor(ctx)
        return run_compare(ctx, reference, engine, truth, deployed, floor)
    with tempfile.TemporaryDirectory(prefix="edgellm-verify-", dir=work) as tmp:
        spawn_or_reuse(ctx, argv, "reference", Path(tmp))
        if ctx.wants_truth:
            spawn_or_reuse(ctx, argv, "truth", Path(tmp))
        spawn(argv, "capture", Path(tmp))
        if ctx.wants_stage2:
            spawn(argv, "deployed", Path(tmp))
            counts = _load(Path(tmp) / "deployed.pkl")["token_counts"]
            if needs_floor(ctx, counts):
                print(
                    "stage 2: no stored corpus floor for this model: measuring it (HF fp32 "
                    "and bf16 over the corpus)",
                    file=sys.stderr,
                )
                spawn(argv, "floor", Path(tmp))
        return compare_saved(ctx, Path(tmp))


def spawn_or_reuse(ctx: Context, argv: list[str], side: str, work: Path) -> None:
    """An HF phase in a process of its own, unless its capture is cached (no torch import)."""
    hit = cached_hf(ctx, side)
    if hit is None:
        spawn(argv, side, work)
    else:
        save_capture(hit, work / f"{side}.pkl")


def needs_floor(ctx: Context, token_counts: list[int]) -> bool:
    from verify import stage2

    key = stage2.budget_key(ctx.adapter.hf_reference(ctx.config.model_dir))
    return stage2.load_budget(key, token_counts) is None


def _save(obj: Any, path: Path) -> None:
    import pickle

    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
    tmp.replace(path)


def _load(path: Path) -> Any:
    import pickle

    try:
        return pickle.loads(path.read_bytes())
    except FileNotFoundError:
        raise VerifyError(f"{path}: missing (run its phase first)") from None


def run_on_ray(args: argparse.Namespace, argv: list[str]) -> int:
    """--ray: every --job (or this one command line) as Ray tasks; one summary table."""
    from verify import sweep

    common = _strip_ray_options(argv)
    jobs = [sweep.parse_job(spec, common) for spec in args.job]
    if not jobs:
        jobs = [sweep.Job(f"{args.runner}:{args.model or ''}", common)]
    return sweep.run(sys.modules[__name__], args, jobs)


def _strip_ray_options(argv: list[str]) -> list[str]:
    """The options every job shares: argv without the sweep's own."""
    out, skip = [], False
    takes_value = {"--job", "--ray-cpus", "--sweep-timeout"}
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in takes_value:
            skip = "=" not in a
            continue
        if name == "--ray":
            # --ray takes an optional ADDRESS: the next word unless it is an option.
            nxt = argv[i + 1] if i + 1 < len(argv) else "-"
            skip = "=" not in a and not nxt.startswith("-")
            continue
        out.append(a)
    return out


def compare_saved(ctx: Context, work: Path) -> int:
    """The compare phase over the captures the other phases left in ``work``."""
    reference = load_capture(work / "reference.pkl", "reference")
    engine = load_capture(work / "engine.pkl", "engine")
    truth = load_capture(work / "truth.pkl", "truth") if ctx.wants_truth else None
    deployed = floor = None
    if ctx.wants_stage2:
        deployed = _load(work / "deployed.pkl")
        if deployed["meta"] != run_meta(ctx):
            raise VerifyError("the deployed capture in --work-dir was made for another run")
        if (work / "floor.pkl").exists():
            floor = _load(work / "floor.pkl")
    return run_compare(ctx, reference, engine, truth, deployed, floor)


def main(argv: list[str] | None = None) -> int:
    try:
        return run(sys.argv[1:] if argv is None else argv)
    except VerifyError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except PhaseFailed as e:
        return e.code
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
