"""Generation stops at every end-of-sequence id the model declares, not only the template's.

* A checkpoint whose generation_config.json lists one id more than config.json (Qwen's
  <|endoftext|> beside <|im_end|>): greedy generation that would produce that id stops there
  (finish "stop", the id not in the output).
* A bare GGUF's tokenizer.ggml.eot_token_id and eom_token_id (Llama 3's <|eot_id|>,
  <|eom_id|>) stop it as its eos_token_id does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_gguf_only import write_fixture_gguf

PROMPT = "The capital of France is"
N = 8


def greedy(binding: Any, model: Path) -> Any:
    session = binding.Session()
    session.setup(str(model), threads=2, max_context=64, precision="exact")
    ids = session.tokenizer.encode(PROMPT)
    stream = binding.generate(session.context, ids, max_tokens=N, temperature=0.0)
    list(stream)
    return session, stream


def later_new_token(tokens: list[int], eos: list[int]) -> int:
    """The position of the last token in `tokens` not seen before it (nor an EOS already)."""
    new = [i for i, t in enumerate(tokens) if t not in tokens[:i] and t not in eos]
    assert new, tokens
    return new[-1]


def test_generation_config_eos_stops_generation(family_fixture: Any, engine_binding: Any) -> None:
    model = family_fixture("llama-tiny")
    session, run = greedy(engine_binding, model)
    assert run.finish_reason == "length" and len(run.tokens) == N, (run.finish_reason, run.tokens)
    at = later_new_token(run.tokens, list(session.eos_token_ids))
    config = json.loads((model / "config.json").read_text())
    declared = config["eos_token_id"]
    declared = declared if isinstance(declared, list) else [declared]
    (model / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [*declared, run.tokens[at]]})
    )
    session, stopped = greedy(engine_binding, model)
    assert run.tokens[at] in session.eos_token_ids
    assert stopped.finish_reason == "stop"
    assert stopped.tokens == run.tokens[:at]


@pytest.mark.parametrize("end", ["eot", "eom"])
def test_gguf_end_of_turn_ids_stop_generation(
    end: str, family_fixture: Any, engine_binding: Any, tmp_path: Path
) -> None:
    fixture = family_fixture("llama-tiny")
    plain = tmp_path / "plain.gguf"
    write_fixture_gguf(fixture, "llama-tiny", plain)
    session, run = greedy(engine_binding, plain)
    assert run.finish_reason == "length" and len(run.tokens) == N, (run.finish_reason, run.tokens)
    at = later_new_token(run.tokens, list(session.eos_token_ids))
    marked = tmp_path / f"{end}.gguf"

    def declare(writer: Any) -> None:
        getattr(writer, f"add_{end}_token_id")(run.tokens[at])

    write_fixture_gguf(fixture, "llama-tiny", marked, edit=declare)
    session, stopped = greedy(engine_binding, marked)
    assert run.tokens[at] in session.eos_token_ids
    assert stopped.finish_reason == "stop"
    assert stopped.tokens == run.tokens[:at]
