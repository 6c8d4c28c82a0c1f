"""The verify runner and the benchmark generate through the engine's one generate() loop.

The gate's greedy capture of our engine must be generate()'s (the binding's generate_timed,
with the per-sample hook keeping every step's logits), and it must hold the very records the
step-by-step prefill / decode_step loop gives: same tokens, EOS inclusive, bit-identical logits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from verify.comparators import topk_token_ids
from verify.gate import greedy
from verify.runners.engine_runner import EngineRunner


@pytest.fixture(scope="module")
def runner(engine_binding: Any, smollm2_checkpoint: Path) -> EngineRunner:
    r = EngineRunner(smollm2_checkpoint, threads=2, max_context=256)
    yield r
    r.close()


def step_loop(runner: EngineRunner, ids: list[int], n: int) -> tuple[list[int], np.ndarray]:
    """The gate's former loop, over prefill and decode_step."""
    logits = [runner.prefill(ids).logits]
    tokens = [topk_token_ids(logits[0], 1)[0]]
    while len(tokens) < n and tokens[-1] not in runner.eos_token_ids:
        logits.append(runner.decode_step(tokens[-1], len(ids) + len(tokens) - 1).logits)
        tokens.append(topk_token_ids(logits[-1], 1)[0])
    return tokens, np.stack(logits)


@pytest.mark.parametrize(
    "text,n",
    [("What is the capital of France?", 40), ("Write a long poem about the sea.", 12)],
)
def test_gate_greedy_is_generate_with_the_loops_records(
    runner: EngineRunner, monkeypatch: pytest.MonkeyPatch, text: str, n: int
) -> None:
    calls = []
    real = runner._py.generate_timed

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(runner._py, "generate_timed", spy)
    ids = runner.encode_prompt(text, chat=True)
    tokens, logits, record = greedy(runner, ids, n)
    assert len(calls) == 1 and calls[0]["record_logits"], calls
    want_tokens, want_logits = step_loop(runner, ids, n)
    assert tokens == want_tokens
    assert np.array_equal(logits, want_logits)
    assert np.array_equal(record.logits, want_logits[0]) and record.top1 == want_tokens[0]
    if len(tokens) < n:  # the short answer ends at EOS, which the gate's records include
        assert tokens[-1] in runner.eos_token_ids


def test_gate_greedy_capture_keeps_the_prefill_layers(runner: EngineRunner) -> None:
    ids = runner.encode_prompt("Name a colour.", chat=True)
    _, _, record = greedy(runner, ids, 3, capture=True)
    want = runner.prefill(ids, capture=True)
    assert len(record.layer_outputs) == runner.num_layers
    for got, ref in zip(record.layer_outputs, want.layer_outputs, strict=True):
        assert np.array_equal(got, ref)
    assert np.array_equal(record.final_hidden, want.final_hidden)


def test_generate_timed_decodes_past_eos_for_the_timing(engine_binding: Any, runner: Any) -> None:
    """run_bench's decode: all steps are timed even when the answer ends at EOS."""
    ids = runner.encode_prompt("What is the capital of France?", chat=True)
    ctx = runner.session.context
    short = engine_binding.generate_timed(ctx, ids, max_tokens=40)
    assert short.finish_reason == "stop" and short.decode_steps < 39  # EOS came early
    timed = engine_binding.generate_timed(ctx, ids, max_tokens=40, decode_past_stop=True)
    assert timed.decode_steps == 39 and len(timed.sampled) == 40
    assert timed.text == short.text and timed.finish_reason == "stop"
    assert timed.decode_ms > 0 and timed.ttft_ms > 0
