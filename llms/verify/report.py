"""The verify report: JSON for machines, Markdown for people, one summary line for the log.

Files go under the report dir (default llms/verify/reports/, git-ignored) with names unique
even when two runs start in the same second, and appear atomically: a reader sees a whole
report or none.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

from verify.comparators import TIER_MARGINS, PairStats
from verify.errors import VerifyError
from verify.gate import PromptResult

DEFAULT_REPORT_DIR = Path(__file__).resolve().parent / "reports"
MARKDOWN_META = (
    "mode", "model_choice", "model_dir", "hf_reference", "variant", "prompt_format",
    "prompt_source", "k", "n_tokens", "gate", "strict", "engine_isa", "precision_path",
    "precision_tier", "truth_runner", "hf_attn_implementation", "versions",
    "reference_eos_token_ids", "engine_eos_token_ids", "hf_cache", "started",
)  # fmt: skip


def ensure_writable(report_dir: Path) -> Path:
    """Fail before any model runs when the report could not be written afterwards."""
    try:
        report_dir.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=report_dir, prefix=".probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        reason = e.strerror or str(e)
        raise VerifyError(
            f"report dir {report_dir} is not writable ({reason}); pass --report-dir DIR"
        ) from None
    return report_dir


def _plain(obj: Any) -> Any:
    """JSON-ready copy: dataclasses, paths and NumPy scalars as plain values."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item") and callable(obj.item):
        return obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):  # NaN and inf are not JSON
        return None if obj != obj else str(obj)
    return obj


def _fmt(x: float) -> str:
    return f"{x:.2e}" if x and abs(x) < 1e-3 else f"{x:.4f}"


class Report:
    """Everything one verify run found; has_failure() decides the exit status."""

    def __init__(self, meta: dict[str, Any]) -> None:
        self.meta = dict(meta)
        self.records: list[PromptResult] = []
        self.errors: list[str] = []
        self.notes: list[str] = []  # run-level remarks (e.g. no plot), not failures
        self.paths: tuple[Path, Path] | None = None
        self.stage2: Any = None  # verify.stage2.Stage2Result, when stage 2 ran

    def stage1_failed(self) -> bool:
        return bool(self.errors) or any(r.failed for r in self.records)

    def add(self, record: PromptResult) -> None:
        self.records.append(record)

    def has_failure(self) -> bool:
        return self.stage1_failed() or (self.stage2 is not None and not self.stage2.passed)

    # --- numbers across prompts ---------------------------------------------------------------

    def teacher_forced_summary(self) -> dict[str, float] | None:
        tfs = [r.teacher_forced for r in self.records if r.teacher_forced is not None]
        if not tfs:
            return None
        kls = [x for tf in tfs for x in tf.kl]
        agree = [a for tf in tfs for a in tf.top1_agree]
        return {
            "kl_mean": sum(kls) / max(1, len(kls)),
            "kl_worst": max(kls, default=0.0),
            "top1_agreement_mean": sum(agree) / max(1, len(agree)),
            "top1_agreement_worst": min(tf.top1_agreement for tf in tfs),
            "failed_prompts": sum(not tf.passed for tf in tfs),
        }

    def calibrated_summary(self) -> dict[str, Any] | None:
        cals = [r.calibrated for r in self.records if r.calibrated is not None]
        if not cals:
            return None
        return {
            "tier": cals[0].tier,
            "margin": cals[0].margin,
            "kl_mean": sum(c.kl_mean for c in cals) / len(cals),
            "kl_worst": max(c.kl_max for c in cals),
            "floor_mean": sum(c.floor_mean for c in cals) / len(cals),
            "floor_worst": max(c.floor_max for c in cals),
            "ratio_mean_worst": max(c.ratio_mean for c in cals),  # the verdict's figures
            "ratio_max_worst": max(c.ratio_max for c in cals),
            "top1_agreement_worst": min(c.top1_agreement for c in cals),
            "failed_prompts": sum(not c.passed for c in cals),
        }

    def _is_diagnosis(self) -> bool:
        return self.meta.get("mode") == "single"

    def _gating(self, lens: str) -> str:
        gates = any(lens in r.gating for r in self.records)
        return "gating" if gates and not self._is_diagnosis() else "informational"

    def summary_line(self) -> str:
        n = len(self.records)
        fd_pass = sum(r.first_divergence.passed for r in self.records)
        verdict = "FAIL" if self.has_failure() else "PASS"
        what = "verify"
        if self._is_diagnosis():
            what, verdict = "diagnosis", "informational"
        parts = [
            f"{what} {self.meta.get('deployment')} --model {self.meta.get('model_choice')}: "
            f"{verdict}",
        ]
        if not self._is_diagnosis():
            parts.append(
                "stage 1 (logic: exact path vs HF): " + ("FAIL" if self.stage1_failed() else "PASS")
            )
        parts.append(f"first-divergence {fd_pass}/{n} ({self._gating('first-divergence')})")
        tf = self.teacher_forced_summary()
        if tf is not None:
            parts.append(
                f"teacher-forced {n - int(tf['failed_prompts'])}/{n} "
                f"({self._gating('teacher-forced')}; vs HF bf16 KL mean "
                f"{_fmt(tf['kl_mean'])} worst {_fmt(tf['kl_worst'])}; top-1 "
                f"{tf['top1_agreement_mean']:.3f} worst {tf['top1_agreement_worst']:.3f})"
            )
        cal = self.calibrated_summary()
        if cal is not None:
            margin = f", margin {cal['margin']:g}x" if cal["margin"] is not None else ""
            parts.append(
                f"calibrated {n - int(cal['failed_prompts'])}/{n} ({self._gating('calibrated')};"
                f" {cal['tier']} tier{margin}; KL vs HF fp32: ours mean {_fmt(cal['kl_mean'])} "
                f"worst {_fmt(cal['kl_worst'])}, bf16 floor mean {_fmt(cal['floor_mean'])} "
                f"worst {_fmt(cal['floor_worst'])}; ours/floor up to "
                f"{_fmt(max(cal['ratio_mean_worst'], cal['ratio_max_worst']))}x)"
            )
        flagged = sorted({lens for r in self.records for lens in r.lenses})
        if flagged:
            parts.append("flagged by " + ", ".join(flagged))
        if self.errors:
            parts.append("; ".join(self.errors))
        if self.stage2 is not None:
            from verify.stage2 import summary

            parts.append(summary(self.stage2))
        if self.paths:
            parts.append(f"report {self.paths[1]}")
        return " | ".join(parts)

    # --- rendering ------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return _plain(
            {
                "verdict": "fail" if self.has_failure() else "pass",
                "meta": self.meta,
                "errors": self.errors,
                "notes": self.notes,
                "teacher_forced_summary": self.teacher_forced_summary(),
                "calibrated_summary": self.calibrated_summary(),
                "tier_margins": TIER_MARGINS,
                "prompts": self.records,
                "stage2": self.stage2.to_dict() if self.stage2 is not None else None,
            }
        )

    def to_markdown(self) -> str:
        m = self.meta
        if self._is_diagnosis():
            title = f"# diagnosis {m.get('deployment')} (informational: per-layer closeness)"
        else:
            title = f"# verify {m.get('deployment')}: {'FAIL' if self.has_failure() else 'PASS'}"
        lines = [title, "", "| | |", "|---|---|"]
        for key in MARKDOWN_META:
            if key in m:
                lines.append(f"| {key} | {m[key]} |")
        lines += ["", self.summary_line(), ""]
        seconds = m.get("seconds")
        if isinstance(seconds, dict):
            lines += ["| phase | seconds |", "|---|---:|"]
            lines += [f"| {k} | {_secs(v)} |" for k, v in seconds.items()]
            lines.append("")
        if m.get("plot"):
            lines += [f"![per-layer closeness]({m['plot']})", ""]
        lines += [f"- note: {n}" for n in self.notes]
        if m.get("prompt_format") == "chat":
            lines += [
                "Prompts went through the model's chat template (as production feeds "
                "an instruct checkpoint).",
                "",
            ]
        elif m.get("prompt_format") == "raw":
            lines += ["Prompts were fed as raw text (a base checkpoint).", ""]
        for r in self.records:
            lines += self._prompt_markdown(r)
        return "\n".join(lines) + "\n"

    def _prompt_markdown(self, r: PromptResult) -> list[str]:
        fd = r.first_divergence
        status = "FAIL" if r.failed else "pass"
        out = [
            f"## prompt {r.index + 1}: {status}",
            "",
            f"> {r.prompt}",
            "",
            f"{r.prompt_tokens} prompt tokens; flagged by: {', '.join(r.lenses) or 'nothing'}",
        ]
        out += [f"- note: {n}" for n in r.notes]
        out += ["", f"**First divergence** ({'pass' if fd.passed else 'FAIL'}): {fd.reason}"]
        if fd.divergence_step is not None:
            out += [
                "",
                "| | token | rank on the other side | top-k |",
                "|---|---|---|---|",
                f"| ours | {fd.test_token} {_tok(fd.test_token, fd.test_topk, fd.test_topk_text)}"
                f" | {fd.test_rank_in_ref} | "
                f"{_list(fd.test_topk, fd.test_topk_text)} |",
                f"| reference | {fd.ref_token} {_tok(fd.ref_token, fd.ref_topk, fd.ref_topk_text)}"
                f" | {fd.ref_rank_in_test} | {_list(fd.ref_topk, fd.ref_topk_text)} |",
            ]
        out += [
            "",
            f"- ours: `{_one_line(fd.test_text)}`",
            f"- reference: `{_one_line(fd.ref_text)}`",
        ]
        tf = r.teacher_forced
        if tf is not None:
            gating = "gating" if "teacher-forced" in r.gating else "informational"
            out += [
                "",
                f"**Teacher-forced** ({'pass' if tf.passed else 'FAIL'}, {gating}): {tf.steps} "
                f"steps, KL vs HF bf16 mean {_fmt(tf.kl_mean)} max {_fmt(tf.kl_max)} (step "
                f"{tf.kl_max_step}), top-1 agreement {tf.top1_agreement:.3f}",
            ]
            if tf.failed_steps:
                out.append(
                    f"- top-{tf.k} inclusion fails at steps {tf.failed_steps}; first: "
                    f"{tf.first_failure}"
                )
        cal = r.calibrated
        if cal is not None:
            gating = "gating" if "calibrated" in r.gating else "informational"
            margin = f"margin {cal.margin:g}x the floor" if cal.margin is not None else "no margin"
            out += [
                "",
                f"**Calibrated** ({'pass' if cal.passed else 'FAIL'}, {gating}; {cal.tier} tier, "
                f"{margin}){': ' + cal.reason if cal.reason else ''}",
                "",
                "| KL from HF fp32 | mean | worst step | top-1 agreement |",
                "|---|---|---|---|",
                f"| ours | {_fmt(cal.kl_mean)} | {_fmt(cal.kl_max)} (step {cal.kl_max_step}) | "
                f"{cal.top1_agreement:.3f} |",
                f"| HF bf16 (the floor) | {_fmt(cal.floor_mean)} | {_fmt(cal.floor_max)} | "
                f"{cal.floor_top1_agreement:.3f} |",
                f"| ours / floor | {_fmt(cal.ratio_mean)} | {_fmt(cal.ratio_max)} | |",
            ]
        if r.layers:
            out += [
                "",
                "**Per-layer closeness** (informational; cosine 1-x means 1 minus x)",
                "",
                *layer_table(r.layers, r.layers_truth),
            ]
        out.append("")
        return out

    def write(self, report_dir: Path) -> tuple[Path, Path]:
        """Write <stem>.json and <stem>.md; the stem is unique among concurrent runs."""
        ensure_writable(report_dir)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        label = f"{self.meta.get('deployment', 'verify')}_{self.meta.get('mode', 'gate')}"
        data = json.dumps(self.to_dict(), indent=1, allow_nan=False, default=str)
        for _ in range(100):
            stem = f"{stamp}_{label}_{os.getpid()}-{secrets.token_hex(3)}"
            json_path = report_dir / f"{stem}.json"
            if _publish(report_dir, json_path, data):
                break
        else:
            raise VerifyError(f"could not find a free report name in {report_dir}")
        md_path = report_dir / f"{stem}.md"
        self.paths = (json_path, md_path)
        if self._write_plot(report_dir / f"{stem}.png"):
            data = json.dumps(self.to_dict(), indent=1, allow_nan=False, default=str)
            _publish(report_dir, json_path, data, overwrite=True)
        _publish(report_dir, md_path, self.to_markdown(), overwrite=True)
        return self.paths

    def _write_plot(self, path: Path) -> bool:
        """Diagnosis: the per-layer plot beside the report (a note, not a failure, if absent)."""
        record = next((r for r in self.records if r.layers), None)
        if record is None:
            return False
        from verify.plot import write_layer_plot

        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".png")
        os.close(fd)
        try:
            title = f"{self.meta.get('deployment')}: {record.prompt[:80]}"
            write_layer_plot(record.layers, record.layers_truth, Path(tmp), title)
            os.replace(tmp, path)
        except VerifyError as e:
            self.notes.append(str(e))
            return False
        finally:
            Path(tmp).unlink(missing_ok=True)
        self.meta["plot"] = path.name
        return True


def layer_table(layers: list[PairStats], truth: list[PairStats] | None = None) -> list[str]:
    """Markdown rows of the per-layer table: ours vs HF bf16, and vs HF fp32 beside it."""
    cols = ["cos min", "cos p5", "cos median", "max abs", "rel err"]
    head = ["tensor", "positions", *(f"bf16 {c}" for c in cols)]
    if truth:
        head += [f"fp32 {c}" for c in cols]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    by_name = {s.name: s for s in truth or []}
    for s in layers:
        cells = [s.name, str(s.positions), *_stat_cells(s)]
        if truth:
            t = by_name.get(s.name)
            cells += _stat_cells(t) if t is not None else [""] * len(cols)
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def _cos(x: float) -> str:
    """Cosines near 1 as 1-x, so that 1 - 1e-9 and 1 - 1e-4 read differently."""
    return f"1-{1 - x:.1e}" if 0.9999 < x < 1 else f"{x:.5f}"


def _stat_cells(s: PairStats) -> list[str]:
    return [
        _cos(s.cos_min),
        _cos(s.cos_p5),
        _cos(s.cos_median),
        f"{s.max_abs_err:.3g}",
        f"{s.rel_err:.3g}",
    ]


def _secs(value: Any) -> str:
    return f"{value:.1f}" if isinstance(value, int | float) else "-"


def _publish(report_dir: Path, path: Path, text: str, overwrite: bool = False) -> bool:
    """Write a temp file, then link it into place: atomic, and never over another run's file."""
    fd, tmp = tempfile.mkstemp(dir=report_dir, prefix=".tmp-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        if overwrite:
            os.replace(tmp, path)
            return True
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError:  # a file system without hard links: the random stem keeps it unique
            if path.exists():
                return False
            os.replace(tmp, path)
        return True
    except OSError as e:
        raise VerifyError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        Path(tmp).unlink(missing_ok=True)


def _tok(token: int | None, ids: list[int], texts: list[str]) -> str:
    if token in ids:
        return repr(texts[ids.index(token)])
    return ""


def _list(ids: list[int], texts: list[str]) -> str:
    return ", ".join(f"{i} {t!r}" for i, t in zip(ids, texts, strict=False))


def _one_line(text: str) -> str:
    return text.replace("\n", "\\n").replace("`", "'")
