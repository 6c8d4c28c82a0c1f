"""What each phase of a gate run computes, from the run's Context: the HF references, our
engine's captures, stage 2's deployed path and corpus floor, and the judging. verify_runner.py
runs them in processes of its own, verify/sweep.py as Ray tasks; both call these functions."""

from __future__ import annotations

import argparse
import importlib
import re
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from verify.comparators import GATE_K, GATE_N_TOKENS
from verify.errors import EXIT_GATE_FAILED, EXIT_OK, VerifyError
from verify.gate import (
    Capture,
    GatePolicy,
    capture_side,
    capture_truth,
    encode_prompts,
    evaluate,
)
from verify.report import Report, layer_table

PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"
ADAPTER_CONTRACT = (
    "MODEL_CHOICES",
    "DEFAULT_MODEL",
    "resolve_model",
    "hf_reference",
    "build_config",
    "build_runner",
)

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


def needs_floor(ctx: Context, token_counts: list[int]) -> bool:
    from verify import stage2

    key = stage2.budget_key(ctx.adapter.hf_reference(ctx.config.model_dir))
    return stage2.load_budget(key, token_counts) is None
