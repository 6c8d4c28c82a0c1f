"""The server's continuous-batching Scheduler through the binding (what a Ray replica runs)."""

from __future__ import annotations

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
