"""The server's continuous-batching Scheduler through the binding (what a Ray replica runs)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

PROMPTS = ["Name a colour.", "What is 2 + 2?", "Say hello in French."]


@pytest.fixture(scope="module")
def model(engine_binding: Any, smollm2_checkpoint: Path) -> Any:
    m = engine_binding.Model()
    m.setup(str(smollm2_checkpoint), threads=2, max_context=256)
    return m


def ids(binding: Any, model: Any, text: str) -> list[int]:
    return binding.encode_conversation(model.tokenizer, model.chat_template, [("user", text)])


def drain(stream: Any) -> str:
    data, done = b"", False
    while not done:
        piece, done, _ = stream.wait(1000)
        data += piece
    return data.decode()


def test_batched_requests_equal_generate_alone(engine_binding: Any, model: Any) -> None:
    alone = []
    for p in PROMPTS:
        it = engine_binding.generate(engine_binding.Context(model), ids(engine_binding, model, p),
                                     max_tokens=12)  # fmt: skip
        alone.append("".join(it))
    scheduler = engine_binding.Scheduler(model, max_batch=4, max_queue=4)
    streams = [scheduler.submit(ids(engine_binding, model, p), 12) for p in PROMPTS]
    assert [drain(s) for s in streams] == alone
    for s in streams:
        assert s.finish_reason in ("stop", "length") and s.error == ""
        assert 0 < s.completion_tokens <= 12 and s.prompt_tokens > 0
    deadline = time.monotonic() + 10
    while scheduler.load() != (0, 0) and time.monotonic() < deadline:  # retired after the text
        time.sleep(0.01)
    assert scheduler.load() == (0, 0)
    scheduler.shutdown(0)


def test_full_queue_and_cancel(engine_binding: Any, model: Any) -> None:
    scheduler = engine_binding.Scheduler(model, max_batch=1, max_queue=0)
    prompt = ids(engine_binding, model, PROMPTS[0])
    first = scheduler.submit(prompt, 200, stop_at_eos=False)
    assert first is not None
    assert scheduler.submit(prompt, 4) is None  # one running, no queue: refused (the 429 path)
    first.cancel()
    drain(first)
    assert first.finish_reason == "cancelled" and first.completion_tokens < 200
    scheduler.shutdown(0)
    assert scheduler.stopping and scheduler.submit(prompt, 4) is None


# A shared system prompt longer than a few 16-token blocks, as a server's clients send it.
SYSTEM = (
    "You are a careful assistant for a small bakery. Answer in one short sentence, stay polite, "
    "never invent prices, and mention that the bakery opens at seven in the morning when asked "
    "about opening hours. Fresh bread comes out of the oven at eight, cakes at ten."
)
QUESTIONS = ["When do you open?", "Do you sell cakes?", "Is the bread fresh?", "Hello!"]


def conversation(binding: Any, model: Any, question: str) -> list[int]:
    turns = [("system", SYSTEM), ("user", question)]
    return binding.encode_conversation(model.tokenizer, model.chat_template, turns)


def cacheable(prompt: list[int], known: list[list[int]]) -> int:
    """The scheduler's reuse rule: the longest whole-block prefix shared with a prompt it has
    prefilled, leaving at least 16 tokens to prefill."""
    shared = 0
    for k in known:
        pairs = zip(prompt, k, strict=False)
        n = next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(prompt), len(k)))
        shared = max(shared, n // 16 * 16)
    return min(shared, max(0, len(prompt) - 16) // 16 * 16)


def metric(scheduler: Any, name: str) -> float:
    m = re.search(rf"^{name} (\S+)$", scheduler.metrics(), re.M)
    assert m, f"{name} not in the metrics"
    return float(m.group(1))


def run_alone(binding: Any, model: Any, prompts: list[list[int]], cache_mb: int) -> list[Any]:
    """Each prompt on its own, one after the other: (text, cached_tokens) and the scheduler."""
    scheduler = binding.Scheduler(model, max_batch=4, max_queue=8, cache_mb=cache_mb)
    out = []
    for p in prompts:
        s = scheduler.submit(p, 16)
        out.append((drain(s), s.cached_tokens))
    return [out, scheduler]


# The KV dtypes the cache copies, and a GGUF file's quantized weights (int8 activations).
VARIANTS = {
    "bf16 KV": ("", {"kv_cache": "bf16"}),
    "q8_0 KV": ("", {"kv_cache": "q8_0"}),
    "exact fp32 KV": ("", {"precision": "exact"}),
    "gguf": ("model.gguf", {}),
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant(request: pytest.FixtureRequest, engine_binding: Any, smollm2_checkpoint: Path) -> Any:
    file, options = VARIANTS[request.param]
    m = engine_binding.Model()
    m.setup(str(smollm2_checkpoint / file), threads=2, max_context=256, **options)
    return m


def test_prefix_cache_is_bit_identical_single_and_batched(
    engine_binding: Any, variant: Any
) -> None:
    model = variant
    prompts = [conversation(engine_binding, model, q) for q in QUESTIONS]
    prompts.append(prompts[0])  # the whole prompt cached: its last tokens are still computed
    assert len(prompts[0]) > 64 and any(len(p) % 16 for p in prompts)  # partial last blocks
    plain, off = run_alone(engine_binding, model, prompts, cache_mb=0)
    assert [c for _, c in plain] == [0] * len(prompts)
    assert metric(off, "edgellm_prompt_tokens_cached_total") == 0
    off.shutdown(0)

    cached, on = run_alone(engine_binding, model, prompts, cache_mb=64)
    assert [t for t, _ in cached] == [t for t, _ in plain]
    # The questions diverge inside a block: only the blocks before it are reused.
    expected = [cacheable(p, prompts[:i]) for i, p in enumerate(prompts)]
    assert [c for _, c in cached] == expected and expected[0] == 0 and min(expected[1:]) > 0
    assert expected[-1] == (len(prompts[0]) - 16) // 16 * 16

    # Batched: all at once on the warm cache, every prompt a hit, the same texts.
    streams = [on.submit(p, 16) for p in prompts]
    assert [drain(s) for s in streams] == [t for t, _ in plain]
    hits = [s.cached_tokens for s in streams]
    assert hits == [(len(p) - 16) // 16 * 16 for p in prompts]
    total = sum(expected) + sum(hits)
    assert metric(on, "edgellm_prompt_tokens_cached_total") == total
    assert metric(on, "edgellm_prefix_cache_blocks") > 0
    assert metric(on, "edgellm_prefix_cache_evictions_total") == 0
    on.shutdown(0)


def test_prefix_cache_evicts_within_a_tiny_budget(engine_binding: Any, model: Any) -> None:
    # 1 MiB holds two blocks of SmolLM2's bf16 KV (16 x 23,040 bytes each).
    a = conversation(engine_binding, model, QUESTIONS[0])
    b = ids(engine_binding, model, "A different prompt, with no system turn, that is long enough")
    texts, tiny = run_alone(engine_binding, model, [a, a, b, a], cache_mb=1)
    plain, off = run_alone(engine_binding, model, [a, b], cache_mb=0)
    off.shutdown(0)
    assert [t for t, _ in texts] == [plain[0][0], plain[0][0], plain[1][0], plain[0][0]]
    # a stores its first two blocks (no room for more); b evicts them for its own; a misses.
    assert [c for _, c in texts] == [0, 32, cacheable(b, [a]), cacheable(a, [b])]
    assert metric(tiny, "edgellm_prefix_cache_blocks") == 2
    assert metric(tiny, "edgellm_prefix_cache_bytes") <= 1 << 20
    assert metric(tiny, "edgellm_prefix_cache_evictions_total") >= 2
    tiny.shutdown(0)


def test_the_grammar_index_is_built_at_start_up(
    engine_binding: Any, smollm2_checkpoint: Path
) -> None:
    """The Scheduler builds its model's vocabulary index for the token masks when it is
    constructed, so the first constrained request (in the scheduler thread, beside the other
    streams) does not."""
    fresh = engine_binding.Model()  # a tokenizer no index was built for yet
    fresh.setup(str(smollm2_checkpoint), threads=2, max_context=128)
    before = engine_binding.grammar_index_builds()
    scheduler = engine_binding.Scheduler(fresh, max_batch=2, max_queue=2)
    built = engine_binding.grammar_index_builds()
    assert built >= before  # +1, unless a freed tokenizer's address and vocabulary came back
    grammar = engine_binding.compile_json_schema('{"type": "boolean"}')
    stream = scheduler.submit(ids(engine_binding, fresh, "Is the sky blue?"), 8, grammar=grammar)
    assert drain(stream) in ("true", "false")
    assert engine_binding.grammar_index_builds() == built
    scheduler.shutdown(0)
