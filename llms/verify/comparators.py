"""The gate's comparisons: top-k token sets, KL calibrated on a measured noise floor, and
per-layer cosine (informs).

Why token sets against the bf16 reference: it differs from us by rounding, and near-ties
between the top candidates flip one way or the other. A correct engine keeps each side's
choice inside the other's top-5; a KV-cache, position or weight bug does not, unless it is
small. Why a KL threshold only against the fp32 reference: there the noise is measured, not
guessed. HF bf16's own KL from the fp32 truth on the same tokens is the floor, and our
figure is judged as a multiple of it (``calibrated_check``).

Ties everywhere are broken toward the smaller token id, as ``argmax`` does, so one logits
vector always yields one ranking.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

GATE_K = 5
GATE_N_TOKENS = 32


def _clean(logits: np.ndarray) -> np.ndarray:
    """1-D float view with NaN ranked last (a NaN must never win a top-k slot)."""
    x = np.asarray(logits).reshape(-1)
    if x.dtype != np.float32 and x.dtype != np.float64:
        x = x.astype(np.float32)
    if np.isnan(x).any():
        x = np.where(np.isnan(x), -np.inf, x)
    return x


def topk_token_ids(logits: np.ndarray, k: int) -> list[int]:
    """The k highest-scoring ids, best first; equal scores ordered by smaller id (argmax's rule)."""
    x = _clean(logits)
    k = max(0, min(int(k), x.size))
    if k == 0:
        return []
    kth_value = np.partition(x, x.size - k)[x.size - k]
    candidates = np.flatnonzero(x >= kth_value)  # every id tied at the boundary, ascending
    order = np.lexsort((candidates, -x[candidates]))  # primary: score desc, then id asc
    return [int(i) for i in candidates[order[:k]]]


def token_rank(logits: np.ndarray, token: int) -> int:
    """1-based rank of ``token`` under the same ordering as topk_token_ids."""
    x = _clean(logits)
    value = x[token]
    return int(np.count_nonzero(x > value) + np.count_nonzero(x[:token] == value) + 1)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """float64 log-probabilities (KL of near-equal distributions needs the precision)."""
    x = np.asarray(logits, dtype=np.float64).reshape(-1)
    m = np.max(x)
    return x - (m + np.log(np.sum(np.exp(x - m))))


def kl_divergence(ref_logits: np.ndarray, test_logits: np.ndarray) -> float:
    """KL(P_ref || P_test) in nats: how much of the reference's belief our engine loses."""
    lp_ref = log_softmax(ref_logits)
    lp_test = log_softmax(test_logits)
    p_ref = np.exp(lp_ref)
    mask = p_ref > 0
    return float(max(0.0, np.sum(p_ref[mask] * (lp_ref[mask] - lp_test[mask]))))


# ---------------------------------------------------------------------------------------------
# Lens 1: first divergence of the two greedy sequences (the spec's gate)
# ---------------------------------------------------------------------------------------------


@dataclass
class TopkCheck:
    """Outcome of the first-divergence walk over one prompt.

    Ranks are 1-based: ``test_rank_in_ref`` is where our chosen token stands in the
    reference's ranking at the divergence step (None when only the top-k lists were known
    and it is outside them).
    """

    passed: bool
    k: int
    steps_compared: int  # steps walked in lockstep, including the divergence step
    divergence_step: int | None = None
    test_token: int | None = None
    ref_token: int | None = None
    test_rank_in_ref: int | None = None
    ref_rank_in_test: int | None = None
    test_topk: list[int] = field(default_factory=list)
    ref_topk: list[int] = field(default_factory=list)
    test_topk_text: list[str] = field(default_factory=list)
    ref_topk_text: list[str] = field(default_factory=list)
    test_text: str = ""  # decoded continuation, ours
    ref_text: str = ""  # decoded continuation, reference
    reason: str = ""


def _rank(token: int, topk: Sequence[int], logits: np.ndarray | None) -> int | None:
    if logits is not None:
        return token_rank(logits, token)
    return list(topk).index(token) + 1 if token in topk else None


def compute_topk_set_check(
    test_chosen: Sequence[int],
    test_topk: Sequence[Sequence[int]],
    ref_chosen: Sequence[int],
    ref_topk: Sequence[Sequence[int]],
    k: int = GATE_K,
    *,
    test_logits: Sequence[np.ndarray] | None = None,
    ref_logits: Sequence[np.ndarray] | None = None,
    token_text: Callable[[int], str] | None = None,
    test_text: str = "",
    ref_text: str = "",
) -> TopkCheck:
    """Walk both greedy sequences in lockstep; at the first divergence each side's chosen token
    must be in the other's top-k. Checking stops there: after it the contexts differ.

    ``*_topk[i]`` is that side's top-k list at step i (at least k long; only the first k
    count). The optional full logits only sharpen the reported ranks.
    """
    n = min(len(test_chosen), len(ref_chosen))
    base = {"k": k, "test_text": test_text, "ref_text": ref_text}
    for step in range(n):
        t, r = int(test_chosen[step]), int(ref_chosen[step])
        if t == r:
            continue
        t_top = [int(i) for i in test_topk[step][:k]]
        r_top = [int(i) for i in ref_topk[step][:k]]
        t_in_r, r_in_t = t in r_top, r in t_top
        passed = t_in_r and r_in_t
        if passed:
            reason = f"benign flip at step {step}: each choice is in the other's top-{k}"
        else:
            missing = []
            if not t_in_r:
                missing.append(f"our token {t} not in the reference's top-{k}")
            if not r_in_t:
                missing.append(f"the reference's token {r} not in our top-{k}")
            reason = f"step {step}: " + " and ".join(missing)
        text = token_text or str
        t_logits = test_logits[step] if test_logits is not None else None
        r_logits = ref_logits[step] if ref_logits is not None else None
        return TopkCheck(
            passed=passed,
            steps_compared=step + 1,
            divergence_step=step,
            test_token=t,
            ref_token=r,
            test_rank_in_ref=_rank(t, r_top, r_logits),
            ref_rank_in_test=_rank(r, t_top, t_logits),
            test_topk=t_top,
            ref_topk=r_top,
            test_topk_text=[text(i) for i in t_top],
            ref_topk_text=[text(i) for i in r_top],
            reason=reason,
            **base,
        )
    if len(test_chosen) != len(ref_chosen):
        # Same choices, yet one side stopped: token n-1 ends the sequence for one side only.
        stopped = "we" if len(test_chosen) < len(ref_chosen) else "the reference"
        return TopkCheck(
            passed=False,
            steps_compared=n,
            reason=f"sequences agree for {n} tokens ({len(test_chosen)} vs {len(ref_chosen)}), "
            f"then {stopped} stopped: the two sides disagree on the EOS ids",
            **base,
        )
    return TopkCheck(passed=True, steps_compared=n, reason="identical greedy sequences", **base)


# ---------------------------------------------------------------------------------------------
# Lens 2: teacher forcing (beyond the spec): both sides fed the reference's tokens
# ---------------------------------------------------------------------------------------------


@dataclass
class TeacherForcedCheck:
    """Every step with identical contexts: mutual top-k inclusion, KL and top-1 agreement.

    Why: the first-divergence walk stops at the first benign flip, so a cache or position bug
    that only bites later would go unseen. Here nothing stops early.
    """

    passed: bool
    k: int
    steps: int
    kl: list[float]
    top1_agree: list[bool]
    kl_mean: float
    kl_max: float
    kl_max_step: int
    top1_agreement: float  # fraction of steps whose argmax agrees
    failed_steps: list[int] = field(default_factory=list)
    first_failure: str = ""


def _mutual_topk(a: np.ndarray, b: np.ndarray, k: int) -> tuple[list[int], list[int], bool]:
    a_top, b_top = topk_token_ids(a, k), topk_token_ids(b, k)
    return a_top, b_top, a_top[0] in b_top and b_top[0] in a_top


def teacher_forced_check(
    ref_logits: Sequence[np.ndarray],
    test_logits: Sequence[np.ndarray],
    k: int = GATE_K,
    token_text: Callable[[int], str] | None = None,
    truth_logits: Sequence[np.ndarray] | None = None,
) -> TeacherForcedCheck:
    """Compare step i of both sides, where both were fed the reference's tokens before step i.

    The token the reference chose at step i is its argmax; ours is our argmax. Each must be in
    the other's top-k at every step. With ``truth_logits`` (HF fp32 on the same tokens) a step
    also passes when our top-k agrees that way with the truth instead: where bf16 rounding
    alone reorders near-ties (random-weight checkpoints do it at most steps), the bf16
    reference is not the one to be agreed with.
    """
    steps = min(len(ref_logits), len(test_logits))
    text = token_text or str
    kl: list[float] = []
    agree: list[bool] = []
    failed: list[int] = []
    first_failure = ""
    for i in range(steps):
        r_top, t_top, ok = _mutual_topk(ref_logits[i], test_logits[i], k)
        kl.append(kl_divergence(ref_logits[i], test_logits[i]))
        agree.append(r_top[0] == t_top[0])
        if not ok and truth_logits is not None and i < len(truth_logits):
            ok = _mutual_topk(truth_logits[i], test_logits[i], k)[2]
        if not ok:
            failed.append(i)
            if not first_failure:
                first_failure = (
                    f"step {i}: ours {t_top[0]} {text(t_top[0])!r} (rank "
                    f"{token_rank(ref_logits[i], t_top[0])} for the reference), reference "
                    f"{r_top[0]} {text(r_top[0])!r} (rank {token_rank(test_logits[i], r_top[0])} "
                    f"for us); our top-{k} {t_top}, reference top-{k} {r_top}"
                )
    if len(ref_logits) != len(test_logits):
        failed.append(steps)
        first_failure = first_failure or (
            f"{len(test_logits)} teacher-forced steps for us vs {len(ref_logits)} for the reference"
        )
    kl_arr = np.asarray(kl) if kl else np.zeros(1)
    return TeacherForcedCheck(
        passed=not failed,
        k=k,
        steps=steps,
        kl=kl,
        top1_agree=agree,
        kl_mean=float(kl_arr.mean()),
        kl_max=float(kl_arr.max()),
        kl_max_step=int(kl_arr.argmax()),
        top1_agreement=float(np.mean(agree)) if agree else 1.0,
        failed_steps=failed,
        first_failure=first_failure,
    )


# ---------------------------------------------------------------------------------------------
# Lens 3, calibrated: KL from the fp32 truth, judged against the bf16 reference's own KL
# ---------------------------------------------------------------------------------------------

# How far from the fp32 truth a precision tier may be, as a multiple of the bf16 floor (mean
# and worst step alike). Measured and argued in llms/verify/README.md ("Choosing the margin").
TIER_MARGINS = {"fp32": 1e-5, "reduced": 4.0}
TIERS = (*TIER_MARGINS, "requantized")  # requantized: weights HF never saw; informational


@dataclass
class CalibratedCheck:
    """Our KL from the fp32 truth beside HF bf16's, per step, with the verdict.

    ``kl[i]`` = KL(P_fp32 || P_ours) and ``floor[i]`` = KL(P_fp32 || P_bf16) at teacher-forced
    step i, the same tokens on all three sides. Passing means mean and worst-step KL are both
    within ``margin`` times the floor's mean and worst step.
    """

    passed: bool
    gating: bool
    tier: str
    margin: float | None
    steps: int
    kl: list[float]
    floor: list[float]
    kl_mean: float
    kl_max: float
    kl_max_step: int
    floor_mean: float
    floor_max: float
    ratio_mean: float  # kl_mean / floor_mean
    ratio_max: float  # kl_max / floor_max
    top1_agreement: float  # our argmax vs the truth's
    floor_top1_agreement: float  # HF bf16's argmax vs the truth's
    reason: str = ""


def _ratio(x: float, floor: float) -> float:
    if floor > 0:
        return x / floor
    return 0.0 if x == 0 else float("inf")


def calibrated_check(
    truth_logits: Sequence[np.ndarray],
    ref_logits: Sequence[np.ndarray],
    test_logits: Sequence[np.ndarray],
    tier: str = "fp32",
) -> CalibratedCheck:
    """Judge our KL from the fp32 truth against the bf16 reference's, on the same steps.

    Why mean and worst step: the mean catches a bug spread thinly over every step, the worst
    step one that bites once (a KV entry overwritten late). Why relative to the floor: it is
    measured per prompt in the same run, so it carries that prompt's sensitivity (a flat or
    a peaked distribution) and that model's (random weights are chaotic), and needs no
    per-model constant. The tier sets the margin: an fp32 engine must sit orders of
    magnitude below bf16's noise; a bf16-activation or quantized path near it.
    """
    if tier not in TIERS:
        raise ValueError(f"precision tier {tier!r}: expected one of {', '.join(TIERS)}")
    steps = min(len(truth_logits), len(ref_logits), len(test_logits))
    kl = [kl_divergence(truth_logits[i], test_logits[i]) for i in range(steps)]
    floor = [kl_divergence(truth_logits[i], ref_logits[i]) for i in range(steps)]
    truth_top1 = [topk_token_ids(truth_logits[i], 1)[0] for i in range(steps)]
    ours_agree = [topk_token_ids(test_logits[i], 1)[0] == t for i, t in enumerate(truth_top1)]
    ref_agree = [topk_token_ids(ref_logits[i], 1)[0] == t for i, t in enumerate(truth_top1)]
    kl_arr = np.asarray(kl) if kl else np.zeros(1)
    floor_arr = np.asarray(floor) if floor else np.zeros(1)
    kl_mean, kl_max = float(kl_arr.mean()), float(kl_arr.max())
    floor_mean, floor_max = float(floor_arr.mean()), float(floor_arr.max())
    ratio_mean, ratio_max = _ratio(kl_mean, floor_mean), _ratio(kl_max, floor_max)
    margin = TIER_MARGINS.get(tier)
    gating = margin is not None
    reasons = []
    if steps != max(len(truth_logits), len(ref_logits), len(test_logits)):
        reasons.append(
            f"step counts differ: truth {len(truth_logits)}, reference {len(ref_logits)}, "
            f"ours {len(test_logits)}"
        )
    if not np.isfinite(kl_arr).all():
        reasons.append("non-finite KL")
    if margin is not None:
        if not ratio_mean <= margin:
            reasons.append(f"mean KL {ratio_mean:.3g}x the floor (margin {margin:g}x)")
        if not ratio_max <= margin:
            reasons.append(f"worst-step KL {ratio_max:.3g}x the floor (margin {margin:g}x)")
    return CalibratedCheck(
        passed=not reasons,
        gating=gating,
        tier=tier,
        margin=margin,
        steps=steps,
        kl=kl,
        floor=floor,
        kl_mean=kl_mean,
        kl_max=kl_max,
        kl_max_step=int(kl_arr.argmax()),
        floor_mean=floor_mean,
        floor_max=floor_max,
        ratio_mean=ratio_mean,
        ratio_max=ratio_max,
        top1_agreement=float(np.mean(ours_agree)) if steps else 1.0,
        floor_top1_agreement=float(np.mean(ref_agree)) if steps else 1.0,
        reason="; ".join(reasons),
    )


# ---------------------------------------------------------------------------------------------
# Diagnosis: per-layer closeness (informational, no thresholds)
# ---------------------------------------------------------------------------------------------


@dataclass
class PairStats:
    """Closeness of one captured tensor, per position: cosine and absolute / relative error."""

    name: str
    layer: int | None
    positions: int
    cos_min: float
    cos_p5: float
    cos_median: float
    cos_mean: float
    worst_position: int
    max_abs_err: float
    mean_abs_err: float
    rel_err: float  # ||ours - ref|| / ||ref|| over the whole tensor


def compare_pair(name: str, ours: np.ndarray, ref: np.ndarray, layer: int | None) -> PairStats:
    """Per-position cosine (min / p5 / median / mean) and abs / rel error; no pass/fail."""
    a = np.asarray(ours, dtype=np.float64)
    b = np.asarray(ref, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"{name}: shape {a.shape} (ours) vs {b.shape} (reference)")
    a = a.reshape(-1, a.shape[-1]) if a.ndim else a.reshape(1, 1)
    b = b.reshape(-1, b.shape[-1]) if b.ndim else b.reshape(1, 1)
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    denom = na * nb
    cos = np.where(denom > 0, np.sum(a * b, axis=1) / np.where(denom > 0, denom, 1.0), 0.0)
    cos = np.where(np.isfinite(cos), cos, -1.0)  # a non-finite side is as far as it gets
    cos = np.where((na == 0) & (nb == 0), 1.0, cos)
    diff = np.abs(a - b)
    ref_norm = float(np.linalg.norm(b))
    return PairStats(
        name=name,
        layer=layer,
        positions=int(a.shape[0]),
        cos_min=float(cos.min()),
        cos_p5=float(np.percentile(cos, 5)),
        cos_median=float(np.median(cos)),
        cos_mean=float(cos.mean()),
        worst_position=int(cos.argmin()),
        max_abs_err=float(np.nanmax(diff)) if np.isfinite(diff).any() else float("inf"),
        mean_abs_err=float(np.mean(diff)),
        rel_err=float(np.linalg.norm(a - b) / ref_norm) if ref_norm > 0 else float("inf"),
    )
