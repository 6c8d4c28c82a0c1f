"""Verify sweeps on Ray: many (deployment, model, prompt set) jobs as distributed tasks.

    verify_runner.py --ray [ADDRESS] --job smollm2_135m:instruct:instruct \\
                     --job gemma3_270m:base:heldout_base --max-prompts 2

Each job is the gate `make verify` runs, split into the same phases: ``reference`` (HF bf16)
first, then ``truth`` (HF fp32), ``capture`` (our exact engine) and ``deployed`` (stage 2: the
fast engine and the corpus, plus the corpus floor where none is stored) in parallel, all fed
the reference's tokens through Ray's object store. An HF phase whose capture the cache holds
is read by the driver instead, as the local run reads it. Every other phase is a Ray task in
a fresh worker process (``max_calls=1``: no two models share a process, as in the local run),
calling the very functions the local phases call with the same options, so the verdicts and
KL figures are the local ones. The driver judges each job (compare) as its captures arrive,
writes its report where the local run would, and prints one table.

Faults: a task whose worker dies is retried once (``max_retries=1``); a second death, an
exception or the sweep's deadline marks that job failed with the reason, and the other jobs
go on. The sweep never waits past ``--sweep-timeout``.

No ADDRESS: a local cluster of ``--ray-cpus`` CPUs (default: all cores), dashboard off.
ADDRESS (``ray://host:10001`` or ``host:6379``): an existing cluster whose nodes hold this
repository and its model store at the same paths (see docs/scale_out.md).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verify import phases
from verify.errors import VerifyError
from verify.options import parse_args
from verify.report import ensure_writable

_LLMS = Path(__file__).resolve().parents[1]
_REPO = _LLMS.parent
RAY_PHASES = ("reference", "truth", "capture", "deployed")


@dataclass
class Job:
    """One (deployment, model, prompt set) gate run: its own verify_runner command line."""

    spec: str
    argv: list[str]
    refs: dict[str, Any] = field(default_factory=dict)  # phase -> ObjectRef
    status: str = "pending"  # pending, PASS, FAIL, failed (the job could not be judged)
    detail: str = ""
    report: Path | None = None
    figures: dict[str, Any] = field(default_factory=dict)


def parse_job(spec: str, common: list[str]) -> Job:
    """DEPLOYMENT[:MODEL[:PROMPT_SET]] -> the job's verify_runner arguments."""
    parts = spec.split(":")
    if len(parts) > 3 or not parts[0]:
        raise VerifyError(f"--job {spec!r}: expected DEPLOYMENT[:MODEL[:PROMPT_SET]]")
    deployment = parts[0]
    if not (_LLMS / deployment / "verify_adapter.py").is_file():
        raise VerifyError(f"--job {spec!r}: no deployment llms/{deployment}/ with a verify adapter")
    argv = ["--runner", f"{deployment}.verify_adapter", *common]
    if len(parts) > 1 and parts[1]:
        argv += ["--model", parts[1]]
    if len(parts) > 2 and parts[2]:
        prompts = _LLMS / "verify" / "prompts" / f"{parts[2]}.txt"
        if not prompts.is_file():
            sets = sorted(p.stem for p in prompts.parent.glob("*.txt"))
            raise VerifyError(
                f"--job {spec!r}: no prompt set {parts[2]!r} (have {', '.join(sets)})"
            )
        argv += ["--prompts-file", str(prompts)]
    return Job(spec, argv)


def worker_env() -> dict[str, str]:
    """What the make targets give verify_runner.py, for every Ray worker."""
    paths = [str(_REPO / "build" / "python"), str(_LLMS), str(_REPO)]
    if os.environ.get("PYTHONPATH"):
        paths.insert(0, os.environ["PYTHONPATH"])
    env = {"PYTHONPATH": os.pathsep.join(paths), "HF_HUB_OFFLINE": "1"}
    env["TRANSFORMERS_OFFLINE"] = "1"
    # The deployed path's front-end defaults travel with the job, as in a local run.
    for name in (
        "EDGELLM_MODELS",
        "EDGELLM_ISA",
        "EDGELLM_PRECISION",
        "EDGELLM_KV_CACHE",
        "EDGELLM_GEMM_PRECISION",
        "EDGELLM_ATTN_PRECISION",
        "EDGELLM_QUANT_PRECISION",
    ):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def run_phase(argv: list[str], phase: str, reference: Any = None) -> Any:
    """One phase of one job, in a Ray worker: the local phase functions on the same options."""
    ctx = phases.build_context(parse_args(argv))
    if phase == "reference":
        return phases.run_reference(ctx)
    if phase == "truth":
        return phases.run_truth(ctx, reference)
    if phase == "capture":
        return phases.run_capture(ctx, reference)
    if phase == "deployed":  # stage 2's engine side (the corpus and the prompt set)
        deployed = phases.run_deployed(ctx, reference)
        floor = phases.run_floor(ctx) if phases.needs_floor(ctx, deployed["token_counts"]) else None
        return deployed, floor
    raise VerifyError(f"unknown phase {phase}")


def _reason(error: BaseException) -> str:
    """One line: why a task failed (Ray wraps the worker's exception)."""
    import ray.exceptions as rex

    cause = error
    if isinstance(error, rex.RayTaskError) and error.cause is not None:
        cause = error.cause
    if isinstance(cause, rex.WorkerCrashedError | rex.RayActorError | rex.NodeDiedError):
        return "its worker died twice (retried once): " + str(cause).strip().splitlines()[0]
    if isinstance(cause, rex.TaskCancelledError):
        return "cancelled at the sweep's deadline"
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[-1] if text else ''}"


def start_ray(address: str | None, cpus: int | None) -> None:
    import ray

    runtime_env = {"env_vars": worker_env()}
    if address:
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
    else:
        os.environ.setdefault("RAY_worker_niceness", "0")  # as the serial run (Ray's default: 15)
        ray.init(
            num_cpus=cpus or os.cpu_count(),
            include_dashboard=False,
            runtime_env=runtime_env,
            log_to_driver=False,
            configure_logging=False,
        )


def submit(job: Job, ctx: Any) -> None:
    """The job's phases as tasks: truth, capture and deployed wait on the reference's object.
    An HF capture the cache holds (verify/hf_cache.py) goes straight into the object store, as
    the local run reads it: no worker process starts (and imports torch) to read a file."""
    import ray

    task = ray.remote(num_cpus=1, max_calls=1, max_retries=1)(run_phase)
    hit = phases.cached_hf(ctx, "reference")
    job.refs["reference"] = ray.put(hit) if hit is not None else task.remote(job.argv, "reference")
    if ctx.wants_truth:
        hit = phases.cached_hf(ctx, "truth")
        job.refs["truth"] = (
            ray.put(hit)
            if hit is not None
            else task.remote(job.argv, "truth", job.refs["reference"])
        )
    job.refs["capture"] = task.remote(job.argv, "capture", job.refs["reference"])
    if ctx.wants_stage2:
        job.refs["deployed"] = task.remote(job.argv, "deployed", job.refs["reference"])


def judge(job: Job, ctx: Any) -> None:
    """compare on the driver, exactly as the local run's last phase."""
    import ray

    ref = ray.get(job.refs["reference"])
    truth = ray.get(job.refs["truth"]) if "truth" in job.refs else None
    engine = ray.get(job.refs["capture"])
    stage2 = seconds = None
    if "deployed" in job.refs:
        deployed, floor = ray.get(job.refs["deployed"])
        stage2 = phases.judge_stage2(ctx, ref, engine, truth, deployed, floor)
        seconds = deployed.get("seconds")
    report = phases.judge(ctx, ref, engine, truth, stage2, seconds)
    job.status = "FAIL" if report.has_failure() else "PASS"
    job.report = report.paths[1] if report.paths else None
    cal = report.calibrated_summary()
    if cal is not None:
        job.figures["kl_ratio"] = max(cal["ratio_mean_worst"], cal["ratio_max_worst"])
    n = len(report.records)
    job.figures["first_div"] = f"{sum(r.first_divergence.passed for r in report.records)}/{n}"
    job.detail = ""


def summary_table(jobs: list[Job], seconds: float) -> str:
    rows = [("job", "verdict", "first-div", "KL/floor", "report or reason")]
    for j in jobs:
        ratio = j.figures.get("kl_ratio")
        rows.append(
            (
                j.spec,
                j.status,
                j.figures.get("first_div", "-"),
                f"{ratio:.3g}" if ratio is not None else "-",
                str(j.report) if j.report else j.detail,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4]
        for r in rows
    ]
    passed = sum(j.status == "PASS" for j in jobs)
    lines.append(f"sweep: {passed}/{len(jobs)} jobs passed in {seconds:.1f} s")
    return "\n".join(lines)


def run(args: Any, jobs: list[Job]) -> int:
    """Fan the jobs out, judge each as it completes, print the table; the exit status."""
    import ray

    contexts = {}
    for job in jobs:  # bad input fails here, before any cluster starts
        contexts[job.spec] = phases.build_context(parse_args(job.argv))
    ensure_writable(args.report_dir)
    start = time.monotonic()
    start_ray(args.ray, args.ray_cpus)
    try:
        for job in jobs:
            submit(job, contexts[job.spec])
        deadline = start + args.sweep_timeout
        open_jobs = list(jobs)
        while open_jobs:
            refs = [r for j in open_jobs for r in j.refs.values()]
            left = deadline - time.monotonic()
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=max(0.0, min(left, 1.0)))
            ready_set = set(ready)
            for job in list(open_jobs):
                done = all(r in ready_set for r in job.refs.values())
                if not done and time.monotonic() < deadline:
                    continue
                open_jobs.remove(job)
                if not done:
                    for r in job.refs.values():
                        ray.cancel(r, force=True)
                    job.status, job.detail = (
                        "failed",
                        (f"timed out after {args.sweep_timeout:g} s (--sweep-timeout)"),
                    )
                    continue
                try:
                    judge(job, contexts[job.spec])
                except Exception as e:  # noqa: BLE001 - the job fails, the sweep goes on
                    job.status, job.detail = "failed", _reason(e)
                why = "" if job.status in ("PASS", "FAIL") else f": {job.detail}"
                print(f"[sweep] {job.spec}: {job.status}{why}", file=sys.stderr)
    finally:
        ray.shutdown()
    print(summary_table(jobs, time.monotonic() - start))
    if all(j.status == "PASS" for j in jobs) or args.no_strict:
        return 0
    return 1
