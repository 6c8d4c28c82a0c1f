"""Stage 2's statistics and verdict (llms/verify/stage2.py) on synthetic logits: pure, fast."""

from __future__ import annotations

import math

import numpy as np
import pytest
from verify import stage2
from verify.errors import VerifyError


def test_kl_and_the_next_token_statistics_on_a_hand_case() -> None:
    base = np.log(np.array([[0.5, 0.25, 0.25], [0.1, 0.2, 0.7]]))
    test = np.log(np.array([[0.25, 0.5, 0.25], [0.1, 0.2, 0.7]]))
    acc = stage2.KlAccumulator()
    acc.add(base, test, [0, 2])
    s = acc.stats()
    kl0 = 0.5 * math.log(2) + 0.25 * math.log(0.5)  # KL(base || test), row 0
    assert s.n == 2 and s.mean == pytest.approx(kl0 / 2) and s.max == pytest.approx(kl0)
    assert s.median == pytest.approx(kl0 / 2) and s.same_top1 == 0.5
    assert s.rms_dp == pytest.approx(math.sqrt((0.25**2 + 0.0) / 2))  # p(next) 0.5 -> 0.25
    assert s.ppl_base == pytest.approx(math.exp((math.log(2) - math.log(0.7)) / 2))
    assert s.ppl_ratio == pytest.approx(math.sqrt(2))  # next-token p halved at one of two


def test_shift_invariance_and_identity() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(70, 1000)).astype(np.float32)  # more rows than one block
    acc = stage2.KlAccumulator()
    acc.add(logits, logits + 3.0, list(range(70)))  # softmax ignores a constant shift
    s = acc.stats()
    assert s.max < 1e-9 and s.same_top1 == 1.0 and s.ppl_ratio == pytest.approx(1.0)


def floor_of(mean: float, p99: float) -> stage2.KlStats:
    return stage2.KlStats(1000, mean, mean, p99, p99, p99, 0.97, 0.01, 10.0, 10.01)


def noisy(scale: float, seed: int, n: int = 400) -> stage2.KlAccumulator:
    rng = np.random.default_rng(seed)
    base = rng.normal(size=(n, 300)) * 4
    acc = stage2.KlAccumulator()
    acc.add(base, base + rng.normal(size=base.shape) * scale, list(rng.integers(0, 300, n)))
    return acc


def test_the_verdict_holds_mean_p99_and_top1_to_the_floor() -> None:
    small = noisy(0.01, 1)
    s = small.stats()
    ok = stage2.judge("fast", small, floor_of(10 * s.mean, 10 * s.p99), "test")
    assert ok.passed and stage2.summary(ok).startswith(
        "stage 2 (deployed arithmetic vs exact): PASS"
    )
    # Above the floor's mean (and p99), the same positions fail, and the summary says why.
    tight = stage2.judge("fast", small, floor_of(s.mean / 2, 10 * s.p99), "test")
    assert not tight.passed and any("corpus mean KLD" in f for f in tight.failures)
    tight99 = stage2.judge("fast", small, floor_of(10 * s.mean, s.p99 / 2), "test")
    assert not tight99.passed and any("corpus p99 KLD" in f for f in tight99.failures)
    # Large noise flips top-1 at more than 1% of positions: failed even under a huge floor.
    big = noisy(3.0, 2)
    assert big.stats().same_top1 < 0.99
    flips = stage2.judge("fast", big, floor_of(1e3, 1e3), "test")
    assert [f for f in flips.failures if "same-top-1" in f], flips.failures
    # The prompt set is judged against its own floor.
    prompts, prompts_floor = noisy(0.5, 3, 64), noisy(0.01, 4, 64)
    both = stage2.judge("fast", small, floor_of(10 * s.mean, 10 * s.p99), "test", prompts,
                        prompts_floor)  # fmt: skip
    assert not both.passed and any(f.startswith("prompt set") for f in both.failures)


def test_bad_shapes_and_empty_input_are_errors() -> None:
    acc = stage2.KlAccumulator()
    with pytest.raises(VerifyError):
        acc.add(np.zeros((2, 5)), np.zeros((3, 5)), [0, 1])
    with pytest.raises(VerifyError):
        acc.stats()


def test_the_corpus_is_shipped_and_has_a_long_document() -> None:
    docs = stage2.corpus_documents()
    assert len(docs) >= 3 and stage2.corpus_hash()
    # One document long enough to cross Gemma 3's 512-token sliding window several times
    # (~4 characters per token): checked in tokens by the stored budget's token counts.
    assert max(len(text) for _, text in docs) > 4 * 3000
    assert (stage2.CORPUS_DIR / "README.md").read_text().count("PSF") >= 1
