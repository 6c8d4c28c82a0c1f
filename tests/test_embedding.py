"""The embedding API through the binding on SmolLM2: Model / Context / generate / decode_batch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest


@pytest.fixture(scope="module")
def model(engine_binding: Any, smollm2_checkpoint: Path) -> Any:
    m = engine_binding.Model()
    m.setup(str(smollm2_checkpoint), threads=2, max_context=128)
    return m


def prompt(model: Any, text: str) -> list[int]:
    return model.tokenizer.encode(model.chat_template.render([("user", text)], True))


def test_objects_used_before_setup_raise(engine_binding: Any) -> None:
    m = engine_binding.Model()
    with pytest.raises(engine_binding.Error, match="not set up"):
        m.tokenizer  # noqa: B018
    with pytest.raises(engine_binding.Error, match="not set up"):
        engine_binding.Context(m)
    with pytest.raises(engine_binding.Error, match="not set up"):
        engine_binding.Context().prefill([1])


def test_generate_streams_the_greedy_loop(engine_binding: Any, model: Any) -> None:
    ids = prompt(model, "Name a colour.")
    ctx = engine_binding.Context(model)
    logits, expected, pos = ctx.prefill(ids), [], len(ids)
    while len(expected) < 12 and int(np.argmax(logits)) not in model.eos_token_ids:
        expected.append(int(np.argmax(logits)))
        logits = ctx.decode_step(expected[-1], pos)
        pos += 1
    stream = engine_binding.generate(engine_binding.Context(model), ids, max_tokens=12)
    pieces = list(stream)
    assert stream.tokens == expected
    assert "".join(pieces) == model.tokenizer.decode(expected, skip_special_tokens=True)
    assert stream.finish_reason in ("stop", "length")


def test_decode_batch_is_bit_identical_to_alone(engine_binding: Any, model: Any) -> None:
    prompts = [prompt(model, t) for t in ("Hi.", "What is 2 + 2?", "Name three animals.")]
    alone = [engine_binding.Context(model) for _ in prompts]
    batched = [engine_binding.Context(model) for _ in prompts]
    tokens = []
    for a, b, ids in zip(alone, batched, prompts, strict=True):
        a.prefill(ids)
        tokens.append(int(np.argmax(b.prefill(ids))))
    for _ in range(4):
        positions = [c.position for c in batched]
        together = engine_binding.decode_batch(batched, tokens, positions)
        for i, ctx in enumerate(alone):
            assert np.array_equal(ctx.decode_step(tokens[i], positions[i]), together[i])
        tokens = [int(np.argmax(t)) for t in together]
