"""Anthropic's Messages API on both servers (`edgellm serve` and the Ray ingress), with the
official `anthropic` client (SmolLM2).

POST /v1/messages is translated into the chat request it means and served by the chat route's
checks, encoder and scheduler, so a greedy Messages reply must equal the chat route's reply to
the same conversation token for token; streaming, stop_sequences, max_tokens, tool use (forced,
streamed, and the tool_result round) and the error shapes are checked through the real client.
Both servers translate the request and write the reply with the same C++ (the Ray ingress
through the edgellm_anthropic module), and every test runs against each.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import jsonschema
import pytest
from test_server import KINDS, NAME, Server
from test_tool_calls import WEATHER

TOOL = {
    "name": WEATHER["function"]["name"],
    "description": WEATHER["function"]["description"],
    "input_schema": WEATHER["function"]["parameters"],
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module", params=KINDS)
def server(request: pytest.FixtureRequest, smollm2_checkpoint: Path):
    s = Server(smollm2_checkpoint, "--parallel", "2", kind=request.param)
    s.anthropic = anthropic.Anthropic(base_url=s.url, api_key="none", max_retries=0)
    yield s
    assert s.stop() == 0


# This client (2.17) no longer has a temperature argument; the API field is sent as extra body.
GREEDY = {"extra_body": {"temperature": 0}}


def message(server: Server, messages: list[dict[str, Any]], **kw: Any) -> Any:
    kw.setdefault("max_tokens", 16)
    kw.update(GREEDY)
    return server.anthropic.messages.create(model=NAME, messages=messages, **kw)


def chat(server: Server, messages: list[dict[str, Any]], **kw: Any) -> Any:
    kw.setdefault("max_tokens", 16)
    kw.setdefault("temperature", 0)
    return server.client.chat.completions.create(model=NAME, messages=messages, **kw)


def text_of(reply: Any) -> str:
    return "".join(b.text for b in reply.content if b.type == "text")


def test_greedy_message_equals_the_chat_route(server: Server) -> None:
    prompt = [{"role": "user", "content": "What is the capital of France?"}]
    for system in (None, "Answer in one word."):
        extra = {"system": system} if system else {}
        got = message(server, prompt, **extra)
        turns = [{"role": "system", "content": system}] if system else []
        want = chat(server, [*turns, *prompt])
        assert got.type == "message" and got.role == "assistant" and got.model == NAME
        assert got.id.startswith("msg_")
        assert text_of(got) == want.choices[0].message.content, (got, want)
        finish = want.choices[0].finish_reason
        assert got.stop_reason == {"stop": "end_turn", "length": "max_tokens"}[finish]
        u = got.usage
        assert u.input_tokens + u.cache_read_input_tokens == want.usage.prompt_tokens
        assert u.output_tokens == want.usage.completion_tokens > 0


def test_system_as_text_blocks_equals_the_string(server: Server) -> None:
    prompt = [{"role": "user", "content": [{"type": "text", "text": "Name a colour."}]}]
    as_string = message(server, prompt, system="Be brief. Answer in English.")
    blocks = [{"type": "text", "text": t} for t in ("Be brief. ", "Answer in English.")]
    assert text_of(message(server, prompt, system=blocks)) == text_of(as_string)


def test_stream_reassembles_to_the_message(server: Server) -> None:
    prompt = [{"role": "user", "content": "Write one sentence about the sea."}]
    whole = message(server, prompt, max_tokens=24)
    kinds = []
    with server.anthropic.messages.stream(
        model=NAME, messages=prompt, max_tokens=24, **GREEDY
    ) as stream:
        for event in stream:
            kinds.append(event.type)
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds
    assert "content_block_start" in kinds and "message_delta" in kinds
    assert text_of(final) == text_of(whole) and final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_stop_sequence_and_max_tokens(server: Server) -> None:
    prompt = [{"role": "user", "content": "List the numbers from one to ten in words."}]
    full = text_of(message(server, prompt, max_tokens=40))
    stop = full.split()[3]  # a word well inside the reply
    r = message(server, prompt, max_tokens=40, stop_sequences=[stop])
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == stop, r
    assert text_of(r) == full[: full.index(stop)]
    short = message(server, prompt, max_tokens=3)
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 3


def check_tool_use(reply: Any) -> Any:
    (call,) = [b for b in reply.content if b.type == "tool_use"]
    assert call.name == TOOL["name"] and call.id
    jsonschema.validate(call.input, TOOL["input_schema"])
    assert reply.stop_reason == "tool_use"
    return call


def test_forced_tool_use_streamed_and_not(server: Server) -> None:
    choice = {"type": "tool", "name": TOOL["name"]}
    call = check_tool_use(message(server, ASK, max_tokens=64, tools=[TOOL], tool_choice=choice))
    with server.anthropic.messages.stream(
        model=NAME, messages=ASK, max_tokens=64, tools=[TOOL], tool_choice=choice, **GREEDY
    ) as stream:
        streamed = check_tool_use(stream.get_final_message())
    assert streamed.input == call.input
    # tool_choice "any" is OpenAI's "required": one call of some tool.
    check_tool_use(message(server, ASK, max_tokens=64, tools=[TOOL], tool_choice={"type": "any"}))


def test_tool_result_round_equals_the_chat_route(server: Server) -> None:
    args = {"city": "Paris", "unit": "celsius"}
    messages = [
        *ASK,
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "call_1", "name": TOOL["name"], "input": args}],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": "18 degrees, sunny"}
            ],
        },
    ]
    got = message(server, messages, max_tokens=24, tools=[TOOL])
    call = {"id": "call_1", "type": "function"}
    call["function"] = {"name": TOOL["name"], "arguments": json.dumps(args)}
    want = chat(
        server,
        [
            *ASK,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"},
        ],
        max_tokens=24,
        tools=[WEATHER],
    )
    calls = want.choices[0].message.tool_calls or []
    assert text_of(got) == (want.choices[0].message.content or "")
    assert [(b.name, b.input) for b in got.content if b.type == "tool_use"] == [
        (c.function.name, json.loads(c.function.arguments)) for c in calls
    ]
    assert got.usage.input_tokens + got.usage.cache_read_input_tokens == want.usage.prompt_tokens


@pytest.mark.parametrize(
    "change, param",
    [
        (  # thinking blocks are served (tests/test_reasoning.py); redacted ones have no text
            {
                "messages": [
                    *ASK,
                    {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"}]},
                    {"role": "user", "content": "And?"},
                ]
            },
            "redacted_thinking",
        ),
        ({"max_tokens": None}, "max_tokens"),
        ({"temperature": 1.5}, "temperature"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "image"),
        ({"messages": [*ASK, {"role": "assistant", "content": "It is"}]}, "prefill"),
        ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "server tools"),
        ({"stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences"),
    ],
)
def test_unsupported_requests_get_anthropic_errors(
    server: Server, change: dict[str, Any], param: str
) -> None:
    body = {"model": NAME, "max_tokens": 4, "messages": ASK, **change}
    code, reply = server.post_json("/v1/messages", {k: v for k, v in body.items() if v is not None})
    assert code == 400, reply
    assert reply["type"] == "error" and reply["error"]["type"] == "invalid_request_error"
    assert param in reply["error"]["message"], reply


def test_client_sees_the_error_classes(server: Server) -> None:
    with pytest.raises(anthropic.NotFoundError):
        server.anthropic.messages.create(model="nope", max_tokens=4, messages=ASK)
    with pytest.raises(anthropic.BadRequestError):
        message(server, ASK, max_tokens=10_000)  # past the context
    code, reply = server.post_json("/v1/messages", {"model": NAME, "max_tokens": 4, "messages": []})
    assert code == 400 and reply["error"]["type"] == "invalid_request_error"
    assert server.get("/health")[0] == 200
