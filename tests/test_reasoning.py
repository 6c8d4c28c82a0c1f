"""Reasoning models through the real clients (openai, anthropic), on both servers: where the
model's template lays out <think> blocks, the block comes back as `reasoning_content` (OpenAI
routes) and a `thinking` block (Anthropic), a json_schema binds only after the block, and a
budget closes it.

SmolLM2 stands in for a reasoning model: its checkpoint with a ChatML template whose generation
prompt opens the block, as DeepSeek R1's does. It never closes the block on its own, so every
reply here is shaped by the budget (the close forced in after that many tokens), which makes each
one exact: the reasoning is what the same prompt continues with unconstrained, the rest follows
the close.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import anthropic
import jsonschema
import pytest
from conftest import with_chat_template
from openai.types.chat import ChatCompletionChunk
from test_server import KINDS, NAME, Server

THINK_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n{% endif %}"
    "{{ m.content.split('</think>')[-1] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)
ASK = [{"role": "user", "content": "Tell me about Paris."}]
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}},
    "required": ["answer"],
}


@pytest.fixture(scope="module", params=KINDS)
def thinker(
    request: pytest.FixtureRequest,
    smollm2_checkpoint: Path,
    tmp_path_factory: pytest.TempPathFactory,
):
    model = with_chat_template(smollm2_checkpoint, tmp_path_factory.mktemp("t"), THINK_TEMPLATE)
    s = Server(model, "--parallel", "2", "--reasoning-budget", "6", kind=request.param)
    s.checkpoint = model
    s.anthropic = anthropic.Anthropic(base_url=s.url, api_key="none", max_retries=0)
    yield s
    assert s.stop() == 0


def streamed_parts(chunks: Iterable[Any]) -> tuple[dict[str, str], list[str]]:
    """A chat stream's reasoning_content and content deltas, each joined, and which came in
    what order (chunks from the openai client, or LLM.chat's dicts)."""
    parts = {"reasoning_content": "", "content": ""}
    order = []
    for chunk in chunks:
        if isinstance(chunk, dict):
            chunk = ChatCompletionChunk.model_validate(chunk)
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        for key, piece in (
            ("reasoning_content", (delta.model_extra or {}).get("reasoning_content")),
            ("content", delta.content),
        ):
            if piece:
                parts[key] += piece
                order.append(key)
    return parts, order


def chat(s: Server, **kw: Any) -> Any:
    kw.setdefault("max_tokens", 24)
    return s.client.chat.completions.create(model=NAME, messages=ASK, temperature=0, **kw)


def completion(s: Server, max_tokens: int) -> str:
    """What the chat prompt continues with, unconstrained and with no block rules."""
    status, tokens, _ = s.post("/tokenize", json.dumps({"model": NAME, "messages": ASK}).encode())
    assert status == 200, tokens
    from transformers import AutoTokenizer

    text = AutoTokenizer.from_pretrained(s.checkpoint).decode(tokens["tokens"])
    reply = s.client.completions.create(
        model=NAME, prompt=text, max_tokens=max_tokens, temperature=0
    )
    return reply.choices[0].text


def test_the_block_is_reasoning_content_and_the_budget_closes_it(thinker: Server) -> None:
    budget = 8
    reply = chat(thinker, extra_body={"reasoning_budget": budget})
    message = reply.choices[0].message
    thought = message.model_extra["reasoning_content"]
    # The block holds exactly the budget's tokens: what the prompt continues with alone.
    assert thought == completion(thinker, budget).lstrip(), (thought, message.content)
    assert message.content and "</think>" not in message.content and "<think>" not in thought
    assert reply.usage.completion_tokens > budget + 1  # the close, then the answer

    # Streamed: reasoning_content deltas, then content deltas, the same text.
    parts, order = streamed_parts(
        chat(thinker, stream=True, extra_body={"reasoning_budget": budget})
    )
    assert parts == {"reasoning_content": thought, "content": message.content}
    assert order == sorted(order, key=lambda k: k == "content")  # the block streams first

    # The server's --reasoning-budget (6) when the request names none.
    default = chat(thinker).choices[0].message.model_extra["reasoning_content"]
    assert default == completion(thinker, 6).lstrip()


def assert_the_schema_binds_after_the_reasoning(s: Server, max_tokens: int) -> None:
    """The reasoning is free text, token for token the unconstrained one; the content is the
    schema's."""
    budget = 10
    free = chat(s, extra_body={"reasoning_budget": budget}).choices[0].message
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
    bound = chat(
        s, max_tokens=max_tokens, response_format=fmt, extra_body={"reasoning_budget": budget}
    ).choices[0]
    assert bound.message.model_extra["reasoning_content"] == free.model_extra["reasoning_content"]
    jsonschema.validate(json.loads(bound.message.content), SCHEMA)
    assert bound.finish_reason == "stop"


def test_a_json_schema_binds_only_after_the_block(thinker: Server) -> None:
    assert_the_schema_binds_after_the_reasoning(thinker, max_tokens=60)


def test_anthropic_thinking_blocks(thinker: Server) -> None:
    kw = {"model": NAME, "messages": ASK, "max_tokens": 24, "extra_body": {"temperature": 0}}
    thinking = {"type": "enabled", "budget_tokens": 8}
    got = thinker.anthropic.messages.create(thinking=thinking, **kw)
    assert [b.type for b in got.content] == ["thinking", "text"]
    openai_reply = chat(thinker, extra_body={"reasoning_budget": 8}).choices[0].message
    assert got.content[0].thinking == openai_reply.model_extra["reasoning_content"]
    assert got.content[1].text == openai_reply.content

    # Streamed: a thinking block (index 0) of thinking_delta events, then the text block.
    with thinker.anthropic.messages.stream(thinking=thinking, **kw) as stream:
        events = [e for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert [e.delta.type for e in events][0] == "thinking_delta"
    assert {(e.index, e.delta.type) for e in events} == {(0, "thinking_delta"), (1, "text_delta")}
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in got.content]

    # Disabled: the block is closed at once, so there is no thinking block.
    off = thinker.anthropic.messages.create(thinking={"type": "disabled"}, **kw)
    assert [b.type for b in off.content] == ["text"]


def test_a_reply_sent_back_keeps_its_reasoning(thinker: Server) -> None:
    """The client's usual loop appends the reply it got (reasoning_content included) and asks
    again; the block reaches a template that reads it, as plain text. Anthropic's client sends
    the thinking block back the same way."""
    reply = chat(thinker, extra_body={"reasoning_budget": 4}).choices[0].message
    sent = reply.model_dump(exclude_none=True)
    assert sent["reasoning_content"]
    follow = [*ASK, sent, {"role": "user", "content": "And its museums?"}]
    again = thinker.client.chat.completions.create(
        model=NAME, messages=follow, max_tokens=4, temperature=0
    )
    assert again.choices[0].message.content is not None
    status, tokens, _ = thinker.post(
        "/tokenize", json.dumps({"model": NAME, "messages": follow}).encode()
    )
    from transformers import AutoTokenizer

    text = AutoTokenizer.from_pretrained(thinker.checkpoint).decode(tokens["tokens"])
    assert f"<think>\n{sent['reasoning_content']}\n</think>\n{sent['content']}<|im_end|>" in text
    bad = [{**ASK[0], "reasoning_content": "x"}]
    status, err, _ = thinker.post(
        "/v1/chat/completions", json.dumps({"model": NAME, "messages": bad}).encode()
    )
    assert status == 400 and err["error"]["param"] == "messages[0].reasoning_content", err

    kw = {"model": NAME, "max_tokens": 8, "extra_body": {"temperature": 0}}
    got = thinker.anthropic.messages.create(
        messages=ASK, thinking={"type": "enabled", "budget_tokens": 4}, **kw
    )
    turn = {"role": "assistant", "content": [b.model_dump() for b in got.content]}
    assert turn["content"][0]["type"] == "thinking"
    more = [*ASK, turn, {"role": "user", "content": "And its museums?"}]
    assert thinker.anthropic.messages.create(messages=more, **kw).content


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"reasoning_budget": "8"}, "reasoning_budget"),
        ({"reasoning_budget": -2}, "reasoning_budget"),
    ],
)
def test_bad_budgets_are_refused(thinker: Server, body: dict[str, Any], param: str) -> None:
    req = {"model": NAME, "messages": ASK, **body}
    status, reply, _ = thinker.post("/v1/chat/completions", json.dumps(req).encode())
    assert status == 400 and reply["error"]["param"] == param, reply


@pytest.mark.parametrize(
    ("thinking", "param"),
    [
        ({"type": "enabled"}, "thinking.budget_tokens"),
        ({"type": "enabled", "budget_tokens": -1}, "thinking.budget_tokens"),
        ({"type": "sometimes"}, "thinking.type"),
        ({"type": "enabled", "budget_tokens": 8, "display": "x"}, "thinking.display"),
    ],
)
def test_bad_thinking_is_refused(thinker: Server, thinking: dict[str, Any], param: str) -> None:
    with pytest.raises(anthropic.BadRequestError) as e:
        thinker.anthropic.messages.create(model=NAME, messages=ASK, max_tokens=8, thinking=thinking)
    assert param in e.value.message


def test_a_template_without_blocks_has_no_reasoning(server_plain: Server) -> None:
    reply = chat(server_plain, extra_body={"reasoning_budget": 4}).choices[0].message
    assert "reasoning_content" not in (reply.model_extra or {}) and reply.content


@pytest.fixture(scope="module", params=KINDS)
def server_plain(request: pytest.FixtureRequest, smollm2_checkpoint: Path):
    s = Server(smollm2_checkpoint, "--parallel", "1", kind=request.param)
    yield s
    assert s.stop() == 0
