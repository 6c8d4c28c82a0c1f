#!/usr/bin/env python3
"""Where implementations land against the noise floor: the evidence behind TIER_MARGINS.

    calibrate.py --runner=<deployment>.verify_adapter [--model M] [--prompts-file F]
                 [--max-prompts N] [--json OUT]

Captures HF bf16 (the reference), HF fp32 (the truth, teacher-forced on the reference's
tokens) and then, on the same tokens, several implementations that are all correct:
our engine on the path this process runs (EDGELLM_ISA and --threads pick it), HF bf16 with
eager attention (another bf16 implementation) and HF fp32 under bf16 autocast (every matmul
in bf16 with fp32 accumulation: the precision of a bf16-activation engine). For each
prompt it prints the floor, KL(fp32 || bf16), and each implementation's mean and worst-step
KL from the truth as a multiple of that floor: the numbers llms/verify/README.md quotes.
Nothing here gates; it is run by hand when the method or a precision path changes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

_LLMS = Path(__file__).resolve().parents[1]
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(_LLMS)
for _p in (str(_LLMS), str(_LLMS.parent), str(_LLMS.parent / "build" / "python")):
    if _p not in sys.path:
        sys.path.append(_p)

from verify.comparators import calibrated_check  # noqa: E402
from verify.errors import VerifyError  # noqa: E402
from verify.phases import (  # noqa: E402
    build_context,
    run_capture,
    run_reference,
    run_truth,
)

PROXIES = (("bf16", "eager"), ("bf16-autocast", None))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runner", required=True)
    p.add_argument("--model")
    p.add_argument("--prompts-file", type=Path)
    p.add_argument("--prompt")
    p.add_argument("--max-prompts", type=int)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--hf-threads", type=int, default=1)
    p.add_argument("--no-proxies", action="store_true", help="only our engine")
    p.add_argument("--json", type=Path, help="write the per-prompt numbers here")
    args = p.parse_args(argv)
    args.prompts = "topk_token"
    try:
        ctx = build_context(args)
        reference = run_reference(ctx)
        truth = run_truth(ctx, reference)
        engine = run_capture(ctx, reference)
        sides = {
            f"engine ({engine.meta.get('precision_path')})": [
                p.forced_logits for p in engine.prompts
            ]
        }
        if not args.no_proxies:
            from verify.runners.hf_runner import HfRunner

            ref_dir = ctx.adapter.hf_reference(ctx.config.model_dir)
            for precision, attn in PROXIES:
                hf = HfRunner(ref_dir, ctx.config.max_context, args.hf_threads, precision, attn)
                sides[hf.name] = [
                    hf.forced_logits(p.prompt_ids, p.tokens) for p in reference.prompts
                ]
                hf.close()
    except VerifyError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows = []
    for i, (r, t) in enumerate(zip(reference.prompts, truth.prompts, strict=True)):
        row = {"prompt": r.prompt, "prompt_tokens": len(r.prompt_ids), "steps": len(r.tokens)}
        for name, logits in sides.items():
            c = calibrated_check(t.logits, r.logits, logits[i], tier="requantized")
            row["floor_mean"], row["floor_max"] = c.floor_mean, c.floor_max
            row[name] = {
                "kl_mean": c.kl_mean,
                "kl_max": c.kl_max,
                "ratio_mean": c.ratio_mean,
                "ratio_max": c.ratio_max,
                "top1_agreement": c.top1_agreement,
            }
        rows.append(row)
    print(
        f"{ctx.config.deployment} --model {ctx.config.model_choice}: KL from HF fp32 as a "
        "multiple of the floor KL(fp32 || bf16), mean / worst step"
    )
    for row in rows:
        cells = [f"floor {row['floor_mean']:.2e} / {row['floor_max']:.2e}"]
        cells += [f"{n}: {row[n]['ratio_mean']:.3g} / {row[n]['ratio_max']:.3g}" for n in sides]
        print(f"{row['prompt_tokens']:5d} tok | " + " | ".join(cells) + f" | {row['prompt'][:40]}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
