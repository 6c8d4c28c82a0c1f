"""Unit tests of the gate's comparators, gate bookkeeping and report, on synthetic arrays.

Why: the gate decides whether a deployment ships; its own logic (tie-breaking, the first-
divergence walk, the teacher-forced replay, unique atomic report files) must be right before
any model is involved. No checkpoint or engine needed.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
from verify.comparators import (
    GATE_K,
    GATE_N_TOKENS,
    TIER_MARGINS,
    calibrated_check,
    compare_pair,
    compute_topk_set_check,
    kl_divergence,
    teacher_forced_check,
    token_rank,
    topk_token_ids,
)
from verify.errors import VerifyError
from verify.gate import Capture, GatePolicy, SideCapture, evaluate, greedy, teacher_forced
from verify.report import Report, ensure_writable
from verify.runners.records import DecodeStepRecord, PrefillRecord

VOCAB = 50


def test_gate_constants() -> None:
    assert (GATE_K, GATE_N_TOKENS) == (5, 32)


def test_topk_ties_toward_smaller_id_like_argmax() -> None:
    x = np.zeros(10, dtype=np.float32)
    x[[7, 3, 9]] = 2.0
    x[5] = 1.0
    assert topk_token_ids(x, 1)[0] == int(np.argmax(x)) == 3
    assert topk_token_ids(x, 4) == [3, 7, 9, 5]
    assert topk_token_ids(np.ones(6), 3) == [0, 1, 2]
    assert token_rank(x, 9) == 3 and token_rank(x, 3) == 1 and token_rank(x, 0) == 5


def test_topk_boundary_ties_and_nan() -> None:
    x = np.array([0.0, 5.0, 4.0, 4.0, 4.0, 1.0], dtype=np.float32)
    assert topk_token_ids(x, 2) == [1, 2]  # the tie at the boundary resolves by id
    x[1] = np.nan  # a NaN never wins a slot
    assert topk_token_ids(x, 2) == [2, 3]
    assert topk_token_ids(x, 100) == [2, 3, 4, 5, 0, 1]


def test_topk_matches_full_sort_on_random_bf16_like_values() -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        x = np.round(rng.normal(size=300) * 4) / 4  # many ties, like bf16 logits
        want = sorted(range(300), key=lambda i: (-x[i], i))[:7]
        assert topk_token_ids(x, 7) == want


def test_identical_sequences_pass() -> None:
    tokens = [1, 2, 3]
    topk = [[t, 9, 8, 7, 6] for t in tokens]
    r = compute_topk_set_check(tokens, topk, tokens, topk, 5)
    assert r.passed and r.divergence_step is None and r.steps_compared == 3


def test_benign_flip_passes_and_stops_there() -> None:
    ours = [1, 2, 4, 40]
    ref = [1, 2, 3, 30]
    ours_topk = [[1], [2], [4, 3, 10, 11, 12], [40]]
    ref_topk = [[1], [2], [3, 4, 13, 14, 15], [30]]
    r = compute_topk_set_check(ours, ours_topk, ref, ref_topk, 5, token_text=lambda t: f"t{t}")
    assert r.passed and r.divergence_step == 2 and r.steps_compared == 3
    assert (r.test_token, r.ref_token) == (4, 3)
    assert (r.test_rank_in_ref, r.ref_rank_in_test) == (2, 2)
    assert r.test_topk == [4, 3, 10, 11, 12] and r.ref_topk_text[0] == "t3"


@pytest.mark.parametrize("ours_has_ref,ref_has_ours", [(False, True), (True, False)])
def test_divergence_outside_topk_fails_on_either_side(
    ours_has_ref: bool, ref_has_ours: bool
) -> None:
    ours_topk = [[4, 3 if ours_has_ref else 20, 10, 11, 12]]
    ref_topk = [[3, 4 if ref_has_ours else 21, 13, 14, 15]]
    r = compute_topk_set_check([4], ours_topk, [3], ref_topk, 5)
    assert not r.passed and r.divergence_step == 0
    assert ("not in the reference's top-5" in r.reason) == (not ref_has_ours)
    assert ("not in our top-5" in r.reason) == (not ours_has_ref)


def test_only_first_k_entries_count() -> None:
    r = compute_topk_set_check([4], [[4, 1, 2, 5, 6, 3]], [3], [[3, 4, 6, 7, 8]], 5)
    assert not r.passed  # 3 is 6th in our list


def test_ranks_from_full_logits() -> None:
    ours = np.arange(VOCAB, dtype=np.float32)  # id 49 best
    ref = np.arange(VOCAB, dtype=np.float32)[::-1].copy()  # id 0 best
    r = compute_topk_set_check(
        [49],
        [topk_token_ids(ours, 5)],
        [0],
        [topk_token_ids(ref, 5)],
        5,
        test_logits=[ours],
        ref_logits=[ref],
    )
    assert not r.passed and r.test_rank_in_ref == VOCAB and r.ref_rank_in_test == VOCAB


def test_equal_prefix_but_unequal_length_fails() -> None:
    r = compute_topk_set_check([1, 2], [[1], [2]], [1], [[1]], 5)
    assert not r.passed and "(2 vs 1)" in r.reason and "EOS" in r.reason


def test_kl() -> None:
    x = np.array([1.0, 2.0, 3.0])
    assert kl_divergence(x, x) == pytest.approx(0.0, abs=1e-12)
    assert kl_divergence(x, x + 7.0) == pytest.approx(0.0, abs=1e-12)  # shift invariant
    p = np.exp(x) / np.exp(x).sum()
    y = np.array([3.0, 2.0, 1.0])
    q = np.exp(y) / np.exp(y).sum()
    assert kl_divergence(x, y) == pytest.approx(float(np.sum(p * np.log(p / q))))


def _peaked(best: int, second: int | None = None, vocab: int = VOCAB) -> np.ndarray:
    x = np.zeros(vocab, dtype=np.float32)
    x[best] = 10.0
    if second is not None:
        x[second] = 9.9
    return x


def test_teacher_forced_check_flags_a_late_step() -> None:
    ref = [_peaked(i) for i in range(6)]
    ours = [x.copy() for x in ref]
    ours[4] = _peaked(40)  # the reference's token 4 is not in our top-5 at step 4
    tf = teacher_forced_check(ref, ours, 5, token_text=str)
    assert not tf.passed and tf.failed_steps == [4] and "step 4" in tf.first_failure
    assert tf.top1_agree == [True] * 4 + [False, True]
    assert tf.kl_max_step == 4 and tf.kl[0] == pytest.approx(0.0, abs=1e-9)
    assert tf.top1_agreement == pytest.approx(5 / 6)
    benign = [x.copy() for x in ref]
    benign[2] = _peaked(9, second=2)
    benign_ref = [x.copy() for x in ref]
    benign_ref[2] = _peaked(2, second=9)  # flipped, but each in the other's top-5
    assert teacher_forced_check(benign_ref, benign).passed


def test_compare_pair_stats() -> None:
    rng = np.random.default_rng(1)
    ref = rng.normal(size=(8, 16))
    s = compare_pair("layer 3", ref.copy(), ref, 3)
    assert s.cos_min == pytest.approx(1.0) and s.max_abs_err == 0.0 and s.rel_err == 0.0
    ours = ref.copy()
    ours[5] = -ours[5]
    s = compare_pair("layer 3", ours, ref, 3)
    assert s.cos_min == pytest.approx(-1.0) and s.worst_position == 5
    assert s.cos_median == pytest.approx(1.0) and s.positions == 8
    assert 0.0 < s.rel_err < 1.0
    with pytest.raises(ValueError, match="shape"):
        compare_pair("x", ours[:4], ref, None)
    s = compare_pair("logits", ref[0], ref[0], None)  # 1-D: one position
    assert s.positions == 1


# --- gate bookkeeping with a toy runner -------------------------------------------------------


class ToyRunner:
    """A deterministic 'model': next token = (sum of the context + bias) % VOCAB.

    Its KV cache is a dict from position to token, so a replay that rewrites positions is
    visible exactly as in the engine.
    """

    name = "toy"
    max_context = 64
    eos_token_ids = (0,)

    def __init__(self, bias: int = 0, late_bias_from: int | None = None) -> None:
        self.bias, self.late = bias, late_bias_from
        self.cache: dict[int, int] = {}
        self.calls = 0

    def _logits(self, pos: int) -> np.ndarray:
        ctx = sum(self.cache[p] for p in range(pos + 1))
        bias = self.bias if self.late is None or pos >= self.late else 0
        nxt = (ctx + bias) % (VOCAB - 1) + 1  # never EOS
        return _peaked(nxt, second=(nxt % (VOCAB - 1)) + 1)

    def encode_prompt(self, text: str, chat: bool) -> list[int]:
        return [ord(c) % VOCAB for c in text]

    def decode(self, ids: list[int]) -> str:
        return " ".join(map(str, ids))

    def prefill(self, tokens: list[int], capture: bool = False) -> PrefillRecord:
        for p, t in enumerate(tokens):
            self.cache[p] = t
        x = self._logits(len(tokens) - 1)
        return PrefillRecord(logits=x, top1=topk_token_ids(x, 1)[0])

    def decode_step(self, token: int, pos: int) -> DecodeStepRecord:
        self.calls += 1
        self.cache[pos] = token
        x = self._logits(pos)
        return DecodeStepRecord(logits=x, top1=topk_token_ids(x, 1)[0])

    def close(self) -> None:
        pass


def test_teacher_forced_replay_equals_fresh_forced_run() -> None:
    prompt = [3, 4, 5]
    ref = ToyRunner()
    ref_tokens, ref_logits, _ = greedy(ref, prompt, 10)
    ours = ToyRunner(bias=1, late_bias_from=len(prompt) + 4)  # diverges at step 5
    tokens, logits, _ = greedy(ours, prompt, 10)
    assert tokens[:5] == ref_tokens[:5] and tokens[5] != ref_tokens[5]
    calls_before = ours.calls
    forced = teacher_forced(ours, prompt, tokens, logits, ref_tokens)
    assert ours.calls - calls_before == 10 - 6  # steps 0..5 reused, 6..9 replayed
    fresh = ToyRunner(bias=1, late_bias_from=len(prompt) + 4)
    fresh.prefill(prompt)
    want = [fresh._logits(len(prompt) - 1)]
    for i in range(1, 10):
        want.append(fresh.decode_step(ref_tokens[i - 1], len(prompt) + i - 1).logits)
    np.testing.assert_array_equal(forced, np.stack(want))


def _side(
    tokens: list[int],
    logits: list[np.ndarray],
    forced: list[np.ndarray] | None,
    ids: list[int] | None = None,
) -> SideCapture:
    return SideCapture(
        prompt="p",
        prompt_ids=ids or [1, 2],
        tokens=tokens,
        logits=np.stack(logits),
        forced_logits=None if forced is None else np.stack(forced),
        text="",
        token_texts={},
    )


def test_evaluate_lenses_and_gating_policy() -> None:
    ref_logits = [_peaked(5), _peaked(6, second=9), _peaked(7), _peaked(8)]
    ref = Capture("reference", "toy", {}, [_side([5, 6, 7, 8], ref_logits, None)])
    late = [x.copy() for x in ref_logits]
    late[3] = _peaked(30)
    # Greedy run flips benignly at step 1, so the first-divergence lens stops there and
    # never sees the late bug at step 3; the teacher-forced lens does.
    greedy_logits = [ref_logits[0], _peaked(9, second=6), _peaked(11), _peaked(12)]
    ours = Capture("engine", "toy", {}, [_side([5, 9, 11, 12], greedy_logits, late)])
    (r,) = evaluate(ours, ref, policy=GatePolicy(spec=True))  # the seed's gate
    assert r.first_divergence.passed and r.first_divergence.divergence_step == 1
    assert not r.teacher_forced.passed and r.lenses == ["teacher-forced"] and not r.failed
    assert r.gating == ["first-divergence"]
    (r,) = evaluate(ours, ref)  # the default: every lens gates
    assert r.failed and "teacher-forced" in r.gating
    mismatched = Capture(
        "engine", "toy", {}, [_side([5, 6, 7, 8], ref_logits, ref_logits, ids=[1, 3])]
    )
    (r,) = evaluate(mismatched, ref)
    assert r.failed and r.lenses == ["tokenizer"] and "index 1" in r.notes[0]


def test_evaluate_flags_non_finite_logits() -> None:
    ref_logits = [_peaked(5), _peaked(6)]
    ref = Capture("reference", "toy", {}, [_side([5, 6], ref_logits, None)])
    broken = [ref_logits[0], np.full(VOCAB, np.nan, dtype=np.float32)]
    ours = Capture("engine", "toy", {}, [_side([5, 0], broken, broken)])
    ours.prompts[0].nonfinite = "non-finite greedy logits at step 1"  # as capture_side sets it
    (r,) = evaluate(ours, ref)
    assert r.failed and "non-finite" in r.lenses and "first-divergence" in r.lenses


# --- report -----------------------------------------------------------------------------------


def _report(failed: bool) -> Report:
    ref_logits = [_peaked(t) for t in (5, 6)]
    ref = Capture("reference", "toy", {}, [_side([5, 6], ref_logits, None)])
    ours_logits = ref_logits if not failed else [_peaked(40), _peaked(6)]
    ours = Capture(
        "engine",
        "toy",
        {},
        [_side([topk_token_ids(x, 1)[0] for x in ours_logits], ours_logits, ours_logits)],
    )
    report = Report({"deployment": "toy", "mode": "topk_token", "model_choice": "instruct"})
    for r in evaluate(ours, ref):
        report.add(r)
    return report


def test_report_pass_fail_and_files(tmp_path: Path) -> None:
    good, bad = _report(False), _report(True)
    assert not good.has_failure() and bad.has_failure()
    json_path, md_path = bad.write(tmp_path)
    data = json.loads(json_path.read_text())
    assert (
        data["verdict"] == "fail" and data["prompts"][0]["first_divergence"]["divergence_step"] == 0
    )
    assert "FAIL" in md_path.read_text() and "first-divergence" in bad.summary_line()
    # One line; the run's verdict and stage 1's (no stage 2 ran here).
    line = good.summary_line()
    assert "\n" not in line and line.count("PASS") == 2 and "stage 2" not in line, line
    assert "stage 1 (logic: exact path vs HF): FAIL" in bad.summary_line()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp leftovers


def test_report_names_unique_when_runs_start_together(tmp_path: Path) -> None:
    reports = [_report(False) for _ in range(16)]
    threads = [threading.Thread(target=r.write, args=(tmp_path,)) for r in reports]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({r.paths for r in reports}) == 16
    assert len(list(tmp_path.glob("*.json"))) == 16 and len(list(tmp_path.glob("*.md"))) == 16


def test_unwritable_report_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(VerifyError, match="not writable"):
        ensure_writable(blocker / "reports")


# --- the calibrated lens ----------------------------------------------------------------------


def _noisy(base: np.ndarray, scale: float, seed: int) -> np.ndarray:
    return base + np.random.default_rng(seed).normal(scale=scale, size=base.shape)


def _three_sides(steps: int = 6) -> tuple[list[np.ndarray], list[np.ndarray]]:
    rng = np.random.default_rng(1)
    truth = [rng.normal(size=VOCAB) * 3 for _ in range(steps)]
    bf16 = [_noisy(x, 0.05, 100 + i) for i, x in enumerate(truth)]  # the floor's noise
    return truth, bf16


def test_calibrated_lens_passes_rounding_and_fails_above_the_margin() -> None:
    truth, bf16 = _three_sides()
    fp32_like = [_noisy(x, 1e-5, i) for i, x in enumerate(truth)]  # KL ~4e-8 of the floor
    c = calibrated_check(truth, bf16, fp32_like, "fp32")
    assert c.passed and c.gating and c.ratio_mean < TIER_MARGINS["fp32"], c
    assert c.top1_agreement == 1.0 and c.steps == 6
    # bf16-level noise: far above the fp32 tier's margin, within the reduced tier's.
    bf16_like = [_noisy(x, 0.05, 200 + i) for i, x in enumerate(truth)]
    assert not calibrated_check(truth, bf16, bf16_like, "fp32").passed
    assert calibrated_check(truth, bf16, bf16_like, "reduced").passed
    # A bug 5x the floor's noise fails even the reduced tier, on the mean and the worst step.
    broken = [_noisy(x, 0.25, 300 + i) for i, x in enumerate(truth)]
    c = calibrated_check(truth, bf16, broken, "reduced")
    assert not c.passed and "mean KL" in c.reason and "worst-step KL" in c.reason
    # requantized: the same figures, reported, never gating.
    c = calibrated_check(truth, bf16, broken, "requantized")
    assert c.passed and not c.gating and c.margin is None and c.ratio_mean > 4


def test_calibrated_lens_sees_one_bad_step() -> None:
    """A bug that bites once (a late KV overwrite): the mean hardly moves, the worst step does."""
    truth, bf16 = _three_sides(steps=32)
    ours = [x.copy() for x in truth]
    ours[27] = _noisy(truth[27], 0.2, 7)
    c = calibrated_check(truth, bf16, ours, "reduced")
    assert not c.passed and c.kl_max_step == 27
    assert "worst-step" in c.reason and "mean KL" not in c.reason


def test_calibrated_lens_degenerate_inputs() -> None:
    truth, _ = _three_sides(steps=3)
    same = calibrated_check(truth, truth, truth, "fp32")  # a floor of 0 and ours 0: pass
    assert same.passed and same.ratio_mean == 0.0
    off = [x + np.eye(VOCAB)[0] for x in truth]
    c = calibrated_check(truth, truth, off, "fp32")  # a floor of 0 and ours above: fail
    assert not c.passed and c.ratio_mean == float("inf")
    c = calibrated_check(truth, truth[:2], truth, "fp32")  # a side with fewer steps
    assert not c.passed and "step counts differ" in c.reason
    with pytest.raises(ValueError, match="tier"):
        calibrated_check(truth, truth, truth, "bf17")


def test_teacher_forced_excuses_steps_where_only_the_bf16_reference_disagrees() -> None:
    """Where bf16 rounding alone reorders near-ties, agreeing with the fp32 truth is enough."""
    truth = [_peaked(5, second=6), _peaked(7)]
    bf16 = [_peaked(20), _peaked(7)]  # step 0: bf16 far from its own truth
    ours = [x.copy() for x in truth]
    assert not teacher_forced_check(bf16, ours).passed
    assert teacher_forced_check(bf16, ours, truth_logits=truth).passed
    wrong = [_peaked(30), _peaked(7)]  # agrees with neither reference: still a failure
    assert teacher_forced_check(bf16, wrong, truth_logits=truth).failed_steps == [0]


def test_evaluate_with_the_truth_gates_the_calibrated_lens() -> None:
    truth, bf16 = _three_sides(steps=4)
    tokens = [topk_token_ids(x, 1)[0] for x in bf16]
    ref = Capture("reference", "toy", {}, [_side(tokens, bf16, None)])
    tru = Capture("truth", "toy", {}, [_side(tokens, truth, None)])
    # Same top-5 everywhere, but 10x the floor's noise in the logits.
    ours_logits = [_noisy(x, 0.02, 50 + i) for i, x in enumerate(bf16)]
    ours = Capture("engine", "toy", {}, [_side(tokens, bf16, ours_logits)])
    (r,) = evaluate(ours, ref, tru)
    assert r.lenses == ["calibrated"] and r.failed and r.calibrated.tier == "fp32"
    (r,) = evaluate(ours, ref, tru, policy=GatePolicy(tier="requantized"))
    assert not r.failed and "calibrated" not in r.gating
    (r,) = evaluate(ours, ref, tru, policy=GatePolicy(spec=True))
    assert not r.failed and r.gating == ["first-divergence"]
    report = Report({"deployment": "toy", "mode": "topk_token", "model_choice": "x"})
    report.add(evaluate(ours, ref, tru)[0])
    line = report.summary_line()
    assert "calibrated 0/1 (gating; fp32 tier" in line and "bf16 floor mean" in line, line


def test_first_divergence_excused_only_where_bf16_alone_disagrees() -> None:
    """Random-weight case: the bf16 reference's choice at the divergence is far from its own
    fp32 truth; our choice agrees with the truth. Benign by default, a failure under --spec-gate,
    and a real bug (agreeing with neither) still fails."""
    truth = [_peaked(5), _peaked(6, second=7)]
    bf16 = [_peaked(5), _peaked(20)]  # step 1: bf16 picks 20, outside the truth's top-5
    ref = Capture("reference", "toy", {}, [_side([5, 20], bf16, None)])
    tru = Capture("truth", "toy", {}, [_side([5, 20], truth, None)])
    ours = Capture("engine", "toy", {}, [_side([5, 6], truth, truth)])
    (r,) = evaluate(ours, ref, tru)
    assert r.first_divergence.passed and "fp32 truth" in r.first_divergence.reason
    assert "first-divergence" not in r.lenses
    (r,) = evaluate(ours, ref, tru, policy=GatePolicy(spec=True))
    assert r.failed and r.lenses[0] == "first-divergence"
    wrong = [_peaked(5), _peaked(30)]
    bad = Capture("engine", "toy", {}, [_side([5, 30], wrong, wrong)])
    (r,) = evaluate(bad, ref, tru)
    assert r.failed and "first-divergence" in r.lenses
