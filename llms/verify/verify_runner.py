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
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

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

from verify.errors import EXIT_OK, EXIT_USAGE, VerifyError  # noqa: E402
from verify.gate import (  # noqa: E402
    load_capture,
    save_capture,
)
from verify.options import parse_args  # noqa: E402
from verify.phases import (  # noqa: E402
    Context,
    build_context,
    cached_hf,
    needs_floor,
    run_capture,
    run_compare,
    run_deployed,
    run_floor,
    run_meta,
    run_reference,
    run_truth,
)
from verify.report import ensure_writable  # noqa: E402


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
    return sweep.run(args, jobs)


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
