"""Running both sides over the prompts, and judging the captures.

Capture and judgement are separate so that each side can run in its own process (no two
models ever sit in memory together) and so that tests can capture the references once and
judge many engine variants (the mutant suite) against them. The order is the bf16 reference
first: the fp32 truth and the engine's teacher-forced pass are fed its tokens.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from verify.comparators import (
    GATE_K,
    GATE_N_TOKENS,
    CalibratedCheck,
    PairStats,
    TeacherForcedCheck,
    TopkCheck,
    calibrated_check,
    compare_pair,
    compute_topk_set_check,
    teacher_forced_check,
    topk_token_ids,
)
from verify.errors import VerifyError
from verify.runners.records import PrefillRecord, Runner

CAPTURE_FORMAT = 2
LENSES = ("tokenizer", "non-finite", "first-divergence", "teacher-forced", "calibrated")


@dataclass
class SideCapture:
    """One side's run of one prompt."""

    prompt: str
    prompt_ids: list[int]
    tokens: list[int]  # greedy choices, at most n_tokens, ending early after EOS
    logits: np.ndarray  # [len(tokens), vocab] float32: the logits each choice came from
    # [len(reference tokens), vocab]: fed the reference's tokens (ours only; the reference's
    # teacher-forced logits are its greedy ones)
    forced_logits: np.ndarray | None
    text: str  # decoded continuation
    token_texts: dict[int, str]  # decoded single tokens seen in choices and top-k lists
    prefill: PrefillRecord | None = None  # with per-layer capture (diagnosis only)
    nonfinite: str = ""  # where the logits first stopped being finite, if they did


@dataclass
class Capture:
    """A side's captures over the prompt set, plus how they were made."""

    side: str  # reference (HF bf16) | truth (HF fp32, teacher-forced) | engine
    runner: str
    meta: dict[str, Any]
    prompts: list[SideCapture]
    format: int = CAPTURE_FORMAT


@dataclass(frozen=True)
class GatePolicy:
    """Which lenses gate. The default gates every lens; ``spec`` is the seed's gate exactly
    (first divergence, top-5, HF bf16); ``tier`` is our engine's precision tier, which sets
    the calibrated lens' margin (comparators.TIER_MARGINS) or makes it informational."""

    spec: bool = False
    tier: str = "fp32"

    def gates(self, lens: str) -> bool:
        if self.spec:
            return lens == "first-divergence"
        return lens != "calibrated" or self.tier != "requantized"


@dataclass
class PromptResult:
    """The verdict on one prompt, with everything a reader needs to localize a failure."""

    index: int
    prompt: str
    prompt_tokens: int
    tokens_match: bool
    first_divergence: TopkCheck
    teacher_forced: TeacherForcedCheck | None
    calibrated: CalibratedCheck | None
    gating: list[str]  # the lenses that decide (the others are reported only)
    failed: bool
    lenses: list[str]  # which checks flagged this prompt (empty when clean)
    notes: list[str] = field(default_factory=list)
    layers: list[PairStats] = field(default_factory=list)  # vs HF bf16
    layers_truth: list[PairStats] = field(default_factory=list)  # vs HF fp32


# ---------------------------------------------------------------------------------------------
# capture
# ---------------------------------------------------------------------------------------------


def encode_prompts(
    runner: Runner, prompts: Sequence[str], chat: bool, n_tokens: int, max_context: int
) -> list[list[int]]:
    """Token ids of every prompt, checked to leave room for n_tokens in the context."""
    encoded = []
    for i, text in enumerate(prompts):
        ids = runner.encode_prompt(text, chat)
        if not ids:
            raise VerifyError(f"prompt {i + 1} encodes to no tokens")
        if len(ids) + n_tokens > max_context:
            raise VerifyError(
                f"prompt {i + 1} is {len(ids)} tokens ({runner.name}); with {n_tokens} generated "
                f"tokens it does not fit the context of {max_context} tokens (shorten it)"
            )
        encoded.append(ids)
    return encoded


def greedy(
    runner: Runner, prompt_ids: list[int], n_tokens: int, capture: bool = False
) -> tuple[list[int], np.ndarray, PrefillRecord]:
    """Greedy prefill, then KV-cached decode steps until n_tokens or EOS (inclusive).

    A runner with its own ``greedy`` (our engine: its one generate() loop) runs it; the HF
    reference and the test-side mutant wrappers are driven step by step here."""
    own = getattr(runner, "greedy", None)
    if own is not None:
        return own(prompt_ids, n_tokens, capture)
    record = runner.prefill(prompt_ids, capture=capture)
    logits = [np.asarray(record.logits, dtype=np.float32)]
    tokens = [topk_token_ids(logits[0], 1)[0]]
    pos = len(prompt_ids)
    eos = set(runner.eos_token_ids)
    while len(tokens) < n_tokens and tokens[-1] not in eos:
        step = runner.decode_step(tokens[-1], pos)
        pos += 1
        logits.append(np.asarray(step.logits, dtype=np.float32))
        tokens.append(topk_token_ids(logits[-1], 1)[0])
    return tokens, np.stack(logits), record


def teacher_forced(
    runner: Runner,
    prompt_ids: list[int],
    tokens: list[int],
    logits: np.ndarray,
    forced: list[int],
) -> np.ndarray:
    """Logits for every step when the context is the prompt plus ``forced``.

    Up to and including the first step where our greedy choice differs from ``forced`` the
    contexts are the same, so those greedy logits are reused; from there on the decode steps
    are replayed over the reference's tokens, rewriting the KV entries they pass.
    """
    same = _common_prefix(tokens, forced)
    reuse = min(same + 1, len(tokens), len(forced))
    out = [logits[i] for i in range(reuse)]
    n = len(prompt_ids)
    for i in range(reuse, len(forced)):
        step = runner.decode_step(forced[i - 1], n + i - 1)
        out.append(np.asarray(step.logits, dtype=np.float32))
    return np.stack(out) if out else np.zeros((0, logits.shape[-1]), dtype=np.float32)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _first_nonfinite(name: str, logits: np.ndarray | None) -> str:
    if logits is None or not len(logits):
        return ""
    bad = ~np.isfinite(logits).all(axis=-1)
    return f"non-finite {name} logits at step {int(np.argmax(bad))}" if bad.any() else ""


def capture_side(
    side: str,
    runner: Runner,
    prompts: Sequence[str],
    prompt_ids: Sequence[list[int]],
    n_tokens: int = GATE_N_TOKENS,
    forced: Sequence[list[int]] | None = None,
    capture_layers: bool = False,
    k: int = GATE_K,
    meta: dict[str, Any] | None = None,
) -> Capture:
    """Run one side over every prompt: greedy, then (ours) teacher-forced on ``forced``."""
    captures = []
    for i, (text, ids) in enumerate(zip(prompts, prompt_ids, strict=True)):
        tokens, logits, record = greedy(runner, ids, n_tokens, capture=capture_layers)
        forced_logits = None
        if forced is not None:
            forced_logits = teacher_forced(runner, ids, tokens, logits, forced[i])
        seen = set(tokens)
        for block in (logits, forced_logits if forced_logits is not None else ()):
            for row in block:
                seen.update(topk_token_ids(row, k))
        if not capture_layers:
            record = None
        captures.append(
            SideCapture(
                prompt=text,
                prompt_ids=list(ids),
                tokens=tokens,
                logits=logits,
                forced_logits=forced_logits,
                text=runner.decode(tokens),
                token_texts={t: runner.decode([t]) for t in sorted(seen)},
                prefill=record,
                nonfinite=_first_nonfinite("greedy", logits)
                or _first_nonfinite("teacher-forced", forced_logits),
            )
        )
    meta = {**(meta or {}), f"{side}_eos_token_ids": list(runner.eos_token_ids)}
    return Capture(side=side, runner=runner.name, meta=meta, prompts=captures)


def capture_truth(runner: Any, reference: Capture, capture_layers: bool = False) -> Capture:
    """The fp32 truth, teacher-forced on the bf16 reference's tokens (one pass per prompt).

    ``runner`` is an HfRunner in fp32: it needs ``forced_logits`` besides the Runner protocol.
    """
    captures = []
    for p in reference.prompts:
        logits = runner.forced_logits(p.prompt_ids, p.tokens)
        record = runner.prefill(p.prompt_ids, capture=True) if capture_layers else None
        captures.append(
            SideCapture(
                prompt=p.prompt,
                prompt_ids=list(p.prompt_ids),
                tokens=list(p.tokens),
                logits=logits,
                forced_logits=None,
                text=p.text,
                token_texts={},
                prefill=record,
                nonfinite=_first_nonfinite("fp32 reference", logits),
            )
        )
    return Capture(side="truth", runner=runner.name, meta=dict(reference.meta), prompts=captures)


# ---------------------------------------------------------------------------------------------
# judgement
# ---------------------------------------------------------------------------------------------


def layer_stats(ours: PrefillRecord, ref: PrefillRecord, positions: int) -> list[PairStats]:
    """Per-layer block output, final norm and last-position logits: ours vs the reference."""
    stats = []
    n_layers = min(len(ours.layer_outputs), len(ref.layer_outputs))
    for layer in range(n_layers):
        stats.append(
            compare_pair(
                f"layer {layer} block out",
                ours.layer_outputs[layer][:positions],
                ref.layer_outputs[layer][:positions],
                layer,
            )
        )
    if ours.final_hidden is not None and ref.final_hidden is not None:
        stats.append(
            compare_pair(
                "final norm", ours.final_hidden[:positions], ref.final_hidden[:positions], None
            )
        )
    stats.append(compare_pair("logits (last position)", ours.logits, ref.logits, None))
    return stats


def evaluate(
    ours: Capture,
    ref: Capture,
    truth: Capture | None = None,
    k: int = GATE_K,
    policy: GatePolicy = GatePolicy(),
) -> list[PromptResult]:
    """Judge every prompt: tokenization, first divergence, teacher-forced top-k, the
    calibrated KL lens (when the fp32 truth was captured), per-layer closeness."""
    for other in (ref, truth):
        if other is not None and len(other.prompts) != len(ours.prompts):
            raise VerifyError(
                f"captures disagree: {len(ours.prompts)} prompts (engine) vs "
                f"{len(other.prompts)} ({other.side}); rerun every phase into one --work-dir"
            )
    results = []
    for i, (o, r) in enumerate(zip(ours.prompts, ref.prompts, strict=True)):
        t = truth.prompts[i] if truth is not None else None
        texts = {**o.token_texts, **r.token_texts}

        def token_text(t: int, texts: dict[int, str] = texts) -> str:
            return texts.get(t, f"<{t}>")

        notes: list[str] = []
        lenses: list[str] = []
        tokens_match = o.prompt_ids == r.prompt_ids
        if not tokens_match:
            at = _common_prefix(o.prompt_ids, r.prompt_ids)
            notes.append(
                f"prompt tokens differ from index {at}: ours {o.prompt_ids[at : at + 4]} vs "
                f"reference {r.prompt_ids[at : at + 4]} ({len(o.prompt_ids)} vs "
                f"{len(r.prompt_ids)} tokens)"
            )
            lenses.append("tokenizer")
        if o.nonfinite:
            notes.append(o.nonfinite)
            lenses.append("non-finite")
        check = compute_topk_set_check(
            o.tokens,
            [topk_token_ids(x, k) for x in o.logits],
            r.tokens,
            [topk_token_ids(x, k) for x in r.logits],
            k,
            test_logits=o.logits,
            ref_logits=r.logits,
            token_text=token_text,
            test_text=o.text,
            ref_text=r.text,
        )
        tf = cal = None
        if t is not None and t.nonfinite:
            notes.append(t.nonfinite + " (the truth itself: the calibrated lens is skipped)")
        truth_logits = t.logits if t is not None and not t.nonfinite else None
        if not check.passed and not policy.spec and truth_logits is not None:
            _excuse_by_truth(check, o.logits, truth_logits, k)
        if not check.passed:
            lenses.append("first-divergence")
        if o.forced_logits is not None:
            tf = teacher_forced_check(r.logits, o.forced_logits, k, token_text, truth_logits)
            if not tf.passed:
                lenses.append("teacher-forced")
            if truth_logits is not None:
                cal = calibrated_check(truth_logits, r.logits, o.forced_logits, policy.tier)
                if not cal.passed:
                    lenses.append("calibrated")
        gating = [lens for lens in LENSES if policy.gates(lens)]
        layers = _layers(o, r, notes)
        layers_truth = _layers(o, t, notes) if t is not None else []
        results.append(
            PromptResult(
                index=i,
                prompt=o.prompt,
                prompt_tokens=len(r.prompt_ids),
                tokens_match=tokens_match,
                first_divergence=check,
                teacher_forced=tf,
                calibrated=cal,
                gating=gating,
                failed=any(lens in gating for lens in lenses),
                lenses=lenses,
                notes=notes,
                layers=layers,
                layers_truth=layers_truth,
            )
        )
    return results


def _excuse_by_truth(check: TopkCheck, ours: np.ndarray, truth: np.ndarray, k: int) -> None:
    """A divergence where only the bf16 reference disagrees is benign (not under --spec-gate).

    Up to the first divergence our context is the reference's, so the fp32 truth's logits at
    that step (teacher-forced on the reference's tokens) judge the same context. Where our
    top-k and the truth's agree both ways, bf16 rounding alone moved the reference's choice:
    on random-weight checkpoints it does at most steps.
    """
    step = check.divergence_step
    if step is None or step >= len(truth) or step >= len(ours):
        return
    t_top, o_top = topk_token_ids(truth[step], k), topk_token_ids(ours[step], k)
    if t_top[0] in o_top and o_top[0] in t_top:
        check.passed = True
        check.reason += f"; but mutual top-{k} with the HF fp32 truth at that step: benign"


def _layers(o: SideCapture, r: SideCapture, notes: list[str]) -> list[PairStats]:
    """Per-layer closeness of our prefill capture to one reference's (diagnosis only)."""
    if o.prefill is None or r.prefill is None or not o.prefill.layer_outputs:
        return []
    try:
        return layer_stats(o.prefill, r.prefill, _common_prefix(o.prompt_ids, r.prompt_ids))
    except ValueError as e:
        notes.append(f"layer comparison skipped: {e}")
        return []


# ---------------------------------------------------------------------------------------------
# files between phases
# ---------------------------------------------------------------------------------------------


def save_capture(capture: Capture, path: Path) -> None:
    """Atomically: a phase that dies half-way leaves no file a later phase could trust."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump(capture, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_capture(path: Path, side: str) -> Capture:
    """A capture this subsystem wrote into its own work dir (pickle: never from elsewhere)."""
    if not path.is_file():
        phase = "capture" if side == "engine" else side
        raise VerifyError(f"{path}: no {side} capture (run --gate-phase {phase} first)")
    try:
        with open(path, "rb") as f:
            capture = pickle.load(f)
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError) as e:
        raise VerifyError(f"{path}: unreadable capture ({e})") from None
    if not isinstance(capture, Capture) or capture.side != side:
        raise VerifyError(f"{path}: not a {side} capture")
    if capture.format != CAPTURE_FORMAT:
        raise VerifyError(f"{path}: capture format {capture.format}, expected {CAPTURE_FORMAT}")
    return capture
