"""The gate's command line, parsed the same way wherever a phase runs: verify_runner.py,
the phase processes it spawns, and the sweep's Ray tasks (verify/sweep.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

from verify.comparators import TIERS
from verify.errors import EXIT_USAGE
from verify.report import DEFAULT_REPORT_DIR

DESCRIPTION = "The verify gate: our engine against HF transformers (bf16 and fp32), one checkpoint"
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
    p = _Parser(prog="verify_runner.py", description=DESCRIPTION)
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
