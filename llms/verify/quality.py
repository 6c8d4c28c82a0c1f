#!/usr/bin/env python3
"""`make quality`: how far each fast configuration of a deployment sits from the exact path.

For each row the engine runs the stage-2 corpus (verify/stage2.py) twice, side by side in one
process: the row's configuration and an exact reference, and reports llama-perplexity's
KL-divergence statistics. Arithmetic rows (fast, each KV dtype, GGUF with fp32 or int8
activations) are measured against the exact path on the same weights: what stage 2 judges.
Weight rows (``--weights q8_0/q4_0``, quantized at setup) are measured against the exact path on
the checkpoint's own bf16 weights: the cost of the choice as a user sees it. The budget column
is the stored HF bf16 floor (stage2_budget.json): within = mean and p99 at most the floor's and
same-top-1 >= 99%.

    quality.py --runner smollm2_135m.verify_adapter [--markdown docs/quality.md] [--rows ...]
"""

from __future__ import annotations

import argparse
import importlib
import platform
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

_LLMS = Path(__file__).resolve().parents[1]
_REPO = _LLMS.parent
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(_LLMS)
for _p in (str(_LLMS), str(_REPO), str(_REPO / "build" / "python")):
    if _p not in sys.path:
        sys.path.insert(1, _p)

from verify import stage2  # noqa: E402
from verify.errors import EXIT_USAGE, VerifyError  # noqa: E402
from verify.runners.engine_runner import import_binding  # noqa: E402


@dataclass(frozen=True)
class Row:
    name: str
    model: str  # an adapter MODEL_CHOICES key
    options: tuple[tuple[str, str], ...]  # Session.setup keywords of the measured path
    reference: str  # "same weights" | "checkpoint bf16"
    weights: str = ""


def rows_for(adapter: Any) -> list[Row]:
    base = adapter.DEFAULT_MODEL
    rows = [
        Row("fast (default)", base, (), "same weights"),
        Row("fast + KV fp32", base, (("kv_cache", "fp32"),), "same weights"),
        Row("fast + KV q8_0", base, (("kv_cache", "q8_0"),), "same weights"),
        Row("fast + attention fp32", base, (("attn_precision", "fp32"),), "same weights"),
    ]
    if "gguf" in adapter.MODEL_CHOICES:
        rows += [
            Row("GGUF fast (default)", "gguf", (), "same weights"),
            Row(
                "GGUF + int8 activations (opt-in)",
                "gguf",
                (("quant_activations", "int8"),),
                "same weights",
            ),
        ]
    rows += [
        Row("--weights q8_0 (fast)", base, (), "checkpoint bf16", weights="q8_0"),
        Row("--weights q4_0 (fast)", base, (), "checkpoint bf16", weights="q4_0"),
    ]
    return rows


def measure(adapter: Any, rows: list[Row], threads: int) -> list[tuple[Row, Any, str]]:
    py = import_binding()
    sessions: dict[tuple[str, str], Any] = {}

    def session(model: str, weights: str, **options: str) -> Any:
        s = py.Session()
        path = adapter.resolve_model(model)
        s.setup(str(path), threads=threads, max_context=4096, weights=weights, **options)
        return s

    out = []
    for row in rows:
        start = time.monotonic()
        exact_key = (row.model, row.weights if row.reference == "same weights" else "")
        if exact_key not in sessions:
            sessions.clear()  # one exact model at a time keeps memory flat
            sessions[exact_key] = session(exact_key[0], exact_key[1], precision="exact")
        exact = sessions[exact_key]
        try:
            test = session(row.model, row.weights, **dict(row.options))
        except py.Error as e:
            out.append((row, None, f"not available: {e}"))
            continue
        docs = stage2.corpus_token_ids(partial(exact.tokenizer.encode, add_special_tokens=True))
        acc = stage2.engine_corpus(exact, test, docs)
        out.append((row, acc.stats(), test.exec_config["description"]))
        print(f"[quality] {row.name}: {time.monotonic() - start:.0f} s", file=sys.stderr)
    return out


def table(deployment: str, results: list[tuple[Row, Any, str]], floor: Any) -> str:
    lines = [
        f"### {deployment}",
        "",
        f"Corpus {results[0][1].n if results[0][1] else '?'} positions; HF bf16 floor: "
        + (f"mean {floor.mean:.3g}, p99 {floor.p99:.3g}." if floor else "not stored."),
        "",
        "| path | vs exact on | mean KLD | p99 | max | same top-1 | RMS dp | PPL ratio | "
        "within budget | arithmetic |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for row, s, what in results:
        if s is None:
            lines.append(f"| {row.name} | {row.reference} | | | | | | | | {what} |")
            continue
        within = "?"
        if floor is not None:
            ok = s.mean <= floor.mean and s.p99 <= floor.p99 and s.same_top1 >= 0.99
            within = "yes" if ok else "**no**"
        lines.append(
            f"| {row.name} | {row.reference} | {s.mean:.3g} | {s.p99:.3g} | {s.max:.3g} | "
            f"{100 * s.same_top1:.2f}% | {s.rms_dp:.3g} | {s.ppl_ratio:.4f} | {within} | "
            f"{what} |"
        )
    return "\n".join(lines) + "\n"


def replace_section(path: Path, deployment: str, text: str) -> None:
    """Replaces the deployment's `### name` section of the Markdown file (or appends it)."""
    old = path.read_text(encoding="utf-8") if path.exists() else "# Quality\n\n"
    head = f"### {deployment}\n"
    if head in old:
        start = old.index(head)
        end = old.find("\n### ", start + len(head))
        old = old[:start] + text + (old[end + 1 :] if end >= 0 else "")
    else:
        old = old.rstrip("\n") + "\n\n" + text
    path.write_text(old, encoding="utf-8")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--runner", required=True, help="adapter module, e.g. smollm2_135m.verify_adapter"
    )
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--markdown", type=Path, help="replace this deployment's section of the file")
    p.add_argument("--rows", help="comma-separated row names to run (default: all)")
    args = p.parse_args(argv)
    try:
        adapter = importlib.import_module(args.runner)
        rows = rows_for(adapter)
        if args.rows:
            wanted = {r.strip() for r in args.rows.split(",")}
            rows = [r for r in rows if r.name in wanted]
        results = measure(adapter, rows, args.threads)
        key = stage2.budget_key(adapter.hf_reference(adapter.resolve_model(adapter.DEFAULT_MODEL)))
        counts = [r[1].n for r in results if r[1] is not None]
        entry = None
        if counts:
            import json

            data = json.loads(stage2.BUDGET_FILE.read_text()) if stage2.BUDGET_FILE.exists() else {}
            entry = data.get("models", {}).get(key)
        floor = stage2.KlStats(**entry["floor"]) if entry else None
        text = table(adapter.DEPLOYMENT, results, floor)
        text += (
            f"\nMeasured {time.strftime('%Y-%m-%d')} on {cpu_name()} "
            f"({import_binding().detected_isa()} tier), `make -C llms/{adapter.DEPLOYMENT} "
            "quality`.\n"
        )
        print(text)
        if args.markdown:
            replace_section(args.markdown, adapter.DEPLOYMENT, text)
    except VerifyError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    return 0


if __name__ == "__main__":
    sys.exit(main())
