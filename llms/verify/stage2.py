"""Stage 2 of the gate: the deployed (fast) arithmetic against our own exact path.

Stage 1 proves the model's logic: the exact path (the gate's fp32 tier) against HF fp32, with
every lens. The deployed path shares all of that code (the same Transformer, weights, positions
and KV bookkeeping); only the kernels' arithmetic differs (bf16 GEMM activations and attention
products, a compact KV cache, int8 activations on quantized weights). Stage 2 asks whether that
arithmetic is good enough, with its own reference: our exact path on the same tokens.

The statistics are those of ``llama-perplexity --kl-divergence``: per position
KL(P_exact || P_deployed), then mean, median, p99, p99.9 and max, the share of positions whose
top-1 token agrees, the RMS of the change in the probability of the actual next token, and the
perplexity ratio. They run over a real-text corpus shipped in ``corpus/`` (CPython's docs and
source, PSF licence; one document crosses Gemma's 512-token sliding window) and over the gate's
prompt set (teacher-forced on the HF bf16 reference's tokens, as stage 1's lenses).

The budget is HF's own: KL(HF fp32 || HF bf16) on the same text, the distance HF's bf16 sits
from its fp32. The deployed path must sit no farther from exact than that: mean and p99 KLD at
most 1x the floor's mean and p99, and same-top-1 at least 99% (pooled over every judged
position). The corpus floor is measured once per model (``verify_runner.py --gate-phase floor
--write-budget``) into ``stage2_budget.json`` and never moved; a model without an entry has its
floor measured live in the run. The prompt set's floor comes from the run's own HF captures.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from verify.errors import VerifyError

CORPUS_DIR = Path(__file__).resolve().parent / "corpus"
BUDGET_FILE = Path(__file__).resolve().parent / "stage2_budget.json"
MIN_SAME_TOP1 = 0.99
# Positions per forward pass over a corpus document: the deployed path's prefill GEMM runs at
# this width, as a long prompt does (the server's default prefill chunk is 256).
CHUNK = 512
# Rows per block of statistics: bounds the float64 temporaries (Gemma's vocab is 262k).
_ROWS = 32
_THREADS = min(4, len(os.sched_getaffinity(0)))


def corpus_documents() -> list[tuple[str, str]]:
    """(name, text) of every corpus document, in name order."""
    docs = sorted(p for p in CORPUS_DIR.glob("*.txt"))
    if not docs:
        raise VerifyError(f"{CORPUS_DIR}: no corpus documents (*.txt)")
    return [(p.name, p.read_text(encoding="utf-8")) for p in docs]


def corpus_hash() -> str:
    h = hashlib.sha256()
    for name, text in corpus_documents():
        h.update(name.encode() + b"\0" + text.encode() + b"\0")
    return h.hexdigest()[:16]


# --- statistics -------------------------------------------------------------------------------


def _block_statistics(
    base: np.ndarray, test: np.ndarray, nxt: np.ndarray
) -> tuple[np.ndarray, ...]:
    """(KL, same top-1, dp, nll base, nll test) of one block of rows, in float64.

    KL(P || Q) = sum_v p_v (x_v - y_v) - lse(x) + lse(y) for logits x, y: two exp passes per
    element and no log-softmax arrays, the same value as sum p (log p - log q) to float64
    rounding."""
    same = base.argmax(axis=-1) == test.argmax(axis=-1)  # float64 keeps the order and the ties
    rows = np.arange(base.shape[0])
    x = base.astype(np.float64)
    y = test.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    y -= y.max(axis=-1, keepdims=True)
    lse_y = np.log(np.exp(y).sum(axis=-1))
    ex = np.exp(x)
    sum_x = ex.sum(axis=-1)
    lse_x = np.log(sum_x)
    lp_next, lq_next = x[rows, nxt] - lse_x, y[rows, nxt] - lse_y
    x -= y
    x *= ex
    kl = np.maximum(x.sum(axis=-1) / sum_x - lse_x + lse_y, 0.0)
    return kl, same, np.exp(lq_next) - np.exp(lp_next), -lp_next, -lq_next


@dataclass
class KlStats:
    """llama-perplexity's KL-divergence statistics of a test distribution against a base one."""

    n: int
    mean: float
    median: float
    p99: float
    p999: float
    max: float
    same_top1: float
    rms_dp: float  # RMS of p_test(next) - p_base(next)
    ppl_base: float
    ppl_test: float

    @property
    def ppl_ratio(self) -> float:
        return self.ppl_test / self.ppl_base if self.ppl_base > 0 else float("nan")


@dataclass
class KlAccumulator:
    """Per-position KL(base || test), top-1 agreement and next-token probabilities."""

    kl: list[float] = field(default_factory=list)
    same: list[bool] = field(default_factory=list)
    dp: list[float] = field(default_factory=list)
    nll_base: list[float] = field(default_factory=list)
    nll_test: list[float] = field(default_factory=list)

    def add(self, base: np.ndarray, test: np.ndarray, next_tokens: Sequence[int]) -> None:
        """Rows of logits [n, vocab] at the same positions; next_tokens[i] follows row i."""
        if base.shape != test.shape or base.shape[0] != len(next_tokens):
            raise VerifyError(
                f"stage 2: logits {base.shape} vs {test.shape} for {len(next_tokens)} positions"
            )
        nxt = np.asarray(next_tokens, dtype=np.int64)
        blocks = [slice(r0, r0 + _ROWS) for r0 in range(0, base.shape[0], _ROWS)]
        # numpy drops the GIL inside each array operation: blocks run on the CPU's cores.
        with ThreadPoolExecutor(max_workers=min(len(blocks), _THREADS) or 1) as pool:
            done = pool.map(lambda b: _block_statistics(base[b], test[b], nxt[b]), blocks)
            for kl, same, dp, nll_base, nll_test in done:
                self.kl.extend(kl.tolist())
                self.same.extend(same.tolist())
                self.dp.extend(dp.tolist())
                self.nll_base.extend(nll_base.tolist())
                self.nll_test.extend(nll_test.tolist())

    def extend(self, other: KlAccumulator) -> None:
        for name in ("kl", "same", "dp", "nll_base", "nll_test"):
            getattr(self, name).extend(getattr(other, name))

    def stats(self) -> KlStats:
        if not self.kl:
            raise VerifyError("stage 2: no positions to judge")
        kl = np.asarray(self.kl)
        return KlStats(
            n=int(kl.size),
            mean=float(kl.mean()),
            median=float(np.median(kl)),
            p99=float(np.quantile(kl, 0.99)),
            p999=float(np.quantile(kl, 0.999)),
            max=float(kl.max()),
            same_top1=float(np.mean(self.same)),
            rms_dp=float(np.sqrt(np.mean(np.square(self.dp)))),
            ppl_base=float(np.exp(np.mean(self.nll_base))),
            ppl_test=float(np.exp(np.mean(self.nll_test))),
        )


# --- running the corpus -----------------------------------------------------------------------


def corpus_token_ids(encode: Any) -> list[tuple[str, list[int]]]:
    """Each document as raw text with the tokenizer's added specials (a base-model prompt):
    ``encode(text)`` must add them."""
    return [(name, [int(i) for i in encode(text)]) for name, text in corpus_documents()]


def chunked_positions(n: int) -> Iterator[tuple[int, int]]:
    for start in range(0, n, CHUNK):
        yield start, min(n, start + CHUNK)


def engine_corpus(exact: Any, deployed: Any, docs: list[tuple[str, list[int]]]) -> KlAccumulator:
    """Both engine sessions (edgellm_py.Session) over every document, chunk by chunk: the
    positions that have a next token, KL(exact || deployed)."""
    acc = KlAccumulator()
    for _name, ids in docs:
        if len(ids) > min(exact.max_context, deployed.max_context):
            raise VerifyError(
                f"stage 2: a corpus document of {len(ids)} tokens exceeds the context"
            )
        for s, e in chunked_positions(len(ids)):
            base = np.asarray(exact.prefill_logits(ids[s:e], s))
            test = np.asarray(deployed.prefill_logits(ids[s:e], s))
            keep = min(e, len(ids) - 1) - s  # the last position has no next token
            acc.add(base[:keep], test[:keep], ids[s + 1 : s + 1 + keep])
    return acc


# --- the budget -------------------------------------------------------------------------------


def budget_key(hf_reference: str | Path) -> str:
    """Which model a stored floor belongs to: its HF reference directory, store-relative."""
    p = Path(hf_reference).resolve()
    return f"{p.parent.name}/{p.name}" if p.name == "gguf" else p.name


def load_budget(key: str, token_counts: list[int]) -> dict[str, Any] | None:
    """The stored corpus floor for this model, if it was measured on this very corpus."""
    if not BUDGET_FILE.exists():
        return None
    entry = json.loads(BUDGET_FILE.read_text(encoding="utf-8")).get("models", {}).get(key)
    if not entry or entry.get("corpus_hash") != corpus_hash():
        return None
    if entry.get("token_counts") != token_counts:
        raise VerifyError(
            f"stage 2: {BUDGET_FILE.name} holds {key}'s floor for corpus token counts "
            f"{entry.get('token_counts')}, but the engine's tokenizer gives {token_counts}"
        )
    return entry


def write_budget(key: str, entry: dict[str, Any]) -> None:
    data = (
        json.loads(BUDGET_FILE.read_text(encoding="utf-8"))
        if BUDGET_FILE.exists()
        else {"method": __doc__.split("\n\n")[3].replace("\n", " "), "models": {}}
    )
    data["models"][key] = entry
    BUDGET_FILE.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def floor_entry(stats: KlStats, token_counts: list[int], meta: dict[str, Any]) -> dict[str, Any]:
    return {
        "corpus_hash": corpus_hash(),
        "token_counts": token_counts,
        "floor": asdict(stats),
        **meta,
    }


# --- the verdict ------------------------------------------------------------------------------


@dataclass
class Stage2Result:
    deployed: str  # the deployed path, as the engine describes it
    corpus: KlStats
    corpus_floor: KlStats
    floor_source: str  # "stage2_budget.json (measured ...)" or "measured in this run"
    prompts: KlStats | None = None
    prompts_floor: KlStats | None = None
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["passed"] = self.passed
        return out


def judge(
    deployed: str,
    corpus: KlAccumulator,
    corpus_floor: KlStats,
    floor_source: str,
    prompts: KlAccumulator | None = None,
    prompts_floor: KlAccumulator | None = None,
) -> Stage2Result:
    """Mean and p99 KLD at most the floor's on each text; same-top-1 >= 99% pooled."""
    c = corpus.stats()
    result = Stage2Result(deployed, c, corpus_floor, floor_source)
    checks = [("corpus", c, corpus_floor)]
    pooled = KlAccumulator()
    pooled.extend(corpus)
    if prompts is not None and prompts_floor is not None:
        result.prompts, result.prompts_floor = prompts.stats(), prompts_floor.stats()
        checks.append(("prompt set", result.prompts, result.prompts_floor))
        pooled.extend(prompts)
    for where, ours, floor in checks:
        for stat in ("mean", "p99"):
            if getattr(ours, stat) > getattr(floor, stat):
                result.failures.append(
                    f"{where} {stat} KLD {getattr(ours, stat):.3g} > floor "
                    f"{getattr(floor, stat):.3g}"
                )
    same = pooled.stats().same_top1
    if same < MIN_SAME_TOP1:
        result.failures.append(f"same-top-1 {100 * same:.2f}% < {100 * MIN_SAME_TOP1:.0f}%")
    return result


def summary(r: Stage2Result) -> str:
    verdict = "PASS" if r.passed else "FAIL (" + "; ".join(r.failures) + ")"
    c, f = r.corpus, r.corpus_floor
    text = (
        f"stage 2 (deployed arithmetic vs exact): {verdict}; {r.deployed}; corpus {c.n} positions:"
        f" KLD mean {c.mean:.3g} p99 {c.p99:.3g} max {c.max:.3g} (floor {f.mean:.3g} / "
        f"{f.p99:.3g}), same-top-1 {100 * c.same_top1:.2f}%, PPL ratio {c.ppl_ratio:.4f}"
    )
    if r.prompts is not None and r.prompts_floor is not None:
        p, pf = r.prompts, r.prompts_floor
        text += (
            f"; prompts {p.n} steps: mean {p.mean:.3g} p99 {p.p99:.3g} (floor {pf.mean:.3g} / "
            f"{pf.p99:.3g}), same-top-1 {100 * p.same_top1:.2f}%"
        )
    return text
