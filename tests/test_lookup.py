"""Prompt-lookup decoding through the Python binding: greedy output with and
without lookup is the same token for token on SmolLM2, on an answer that
copies its input (where drafts are accepted) and on an open-ended one."""

from pathlib import Path
from typing import Any

import pytest

CODE = (
    "Repeat this code exactly:\n\ndef add(a, b):\n    total = a + b\n    return total\n\n"
    "def mul(a, b):\n    product = a * b\n    return product\n"
)


@pytest.mark.parametrize("text", [CODE, "Tell me a story about a dragon."])
def test_lookup_keeps_greedy_output(
    smollm2_checkpoint: Path, engine_binding: Any, text: str
) -> None:
    model = engine_binding.Model()
    model.setup(str(smollm2_checkpoint))
    context = engine_binding.Context(model)
    prompt = engine_binding.encode_conversation(
        model.tokenizer, model.chat_template, [("user", text)], True
    )
    runs = {}
    for lookup in (False, True):
        stream = engine_binding.generate(context, prompt, max_tokens=60, lookup=lookup)
        text_out = "".join(stream)
        runs[lookup] = (list(stream.tokens), text_out)
    assert runs[True] == runs[False]
    assert len(runs[False][0]) > 5
