"""Tool calling through the OpenAI API, with the official `openai` client (SmolLM2).

Both servers (`edgellm serve` and the Ray Serve ingress) run the engine's one implementation
(edgellm/tool_calls.h): tools rendered into the system turn, assistant tool_calls and "tool"
results rendered into the conversation, forced calls (tool_choice "required" or a named
function) generated under the call's JSON schema, replies parsed back into tool_calls.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from test_server import KINDS, NAME, Server

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a time zone",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string"}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, TIME]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
# A finished round: the assistant's call and the tool's result, as a client sends them back.
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'},
}
ROUND = [
    *ASK,
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"},
]


@pytest.fixture(scope="module", params=KINDS)
def server(request: pytest.FixtureRequest, smollm2_checkpoint: Path):
    s = Server(smollm2_checkpoint, "--parallel", "2", kind=request.param)
    yield s
    assert s.stop() == 0


def create(server: Server, messages: list[dict[str, Any]], **kw: Any) -> Any:
    kw.setdefault("max_tokens", 64)
    kw.setdefault("temperature", 0)
    return server.client.chat.completions.create(model=NAME, messages=messages, **kw)


def tokenize(server: Server, body: dict[str, Any]) -> list[int]:
    code, reply, _ = server.post("/tokenize", json.dumps({"model": NAME, **body}).encode())
    assert code == 200, reply
    return reply["tokens"]


def check_call(call: Any, names: set[str]) -> dict[str, Any]:
    """A call of one of `names` whose arguments validate against its parameter schema."""
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name in names, call
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, SCHEMAS[call.function.name])
    return arguments


def test_forced_named_call_parses_to_the_schema(server: Server) -> None:
    r = create(server, ASK, tools=TOOLS, tool_choice=NAMED)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None and len(choice.message.tool_calls) == 1
    check_call(choice.message.tool_calls[0], {"get_weather"})
    # parallel_tool_calls: accepted either way (a reply holds one call).
    r = create(server, ASK, tools=TOOLS, tool_choice=NAMED, parallel_tool_calls=False)
    check_call(r.choices[0].message.tool_calls[0], {"get_weather"})


def test_forced_call_wins_over_response_format(server: Server) -> None:
    """response_format shapes content replies; a forced call keeps the call's grammar."""
    r = create(server, ASK, tools=TOOLS, tool_choice=NAMED, response_format={"type": "json_object"})
    assert r.choices[0].finish_reason == "tool_calls"
    check_call(r.choices[0].message.tool_calls[0], {"get_weather"})


def test_required_calls_one_of_the_tools(server: Server) -> None:
    ask_time = [{"role": "user", "content": "What time is it in Tokyo?"}]
    r = create(server, ask_time, tools=TOOLS, tool_choice="required")
    assert r.choices[0].finish_reason == "tool_calls"
    (call,) = r.choices[0].message.tool_calls
    check_call(call, {"get_weather", "get_time"})


def test_streamed_forced_call_reassembles_to_the_same_call(server: Server) -> None:
    whole = create(server, ASK, tools=TOOLS, tool_choice=NAMED).choices[0].message.tool_calls[0]
    calls: dict[int, dict[str, str]] = {}
    finishes = []
    stream = create(server, ASK, tools=TOOLS, tool_choice=NAMED, stream=True)
    for chunk in stream:
        if not chunk.choices:
            continue
        finishes.append(chunk.choices[0].finish_reason)
        for d in chunk.choices[0].delta.tool_calls or []:
            c = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
            c["id"] += d.id or ""
            c["name"] += (d.function.name or "") if d.function else ""
            c["arguments"] += (d.function.arguments or "") if d.function else ""
    assert finishes[-1] == "tool_calls" and all(f is None for f in finishes[:-1])
    assert list(calls) == [0]
    assert calls[0]["id"].startswith("call_")
    assert calls[0]["name"] == whole.function.name == "get_weather"
    assert json.loads(calls[0]["arguments"]) == json.loads(whole.function.arguments)


def test_streamed_auto_reply_equals_the_whole_one(server: Server) -> None:
    """Under auto the reply is held and parsed once whole: a plain answer streams as content."""
    whole = create(server, ASK, tools=TOOLS, max_tokens=16).choices[0]
    content, names, finishes = "", [], []
    for chunk in create(server, ASK, tools=TOOLS, max_tokens=16, stream=True):
        if chunk.choices:
            content += chunk.choices[0].delta.content or ""
            names += [d.function.name for d in chunk.choices[0].delta.tool_calls or [] if d.id]
            finishes.append(chunk.choices[0].finish_reason)
    assert finishes[-1] == whole.finish_reason
    assert names == [c.function.name for c in whole.message.tool_calls or []]
    assert content == (whole.message.content or "")


def test_tool_result_goes_back_into_the_conversation(
    server: Server, engine_binding: Any, smollm2_checkpoint: Path
) -> None:
    r = create(server, ROUND, tools=TOOLS, tool_choice="none", max_tokens=24)
    choice = r.choices[0]
    assert choice.finish_reason in ("stop", "length") and not choice.message.tool_calls
    assert isinstance(choice.message.content, str) and choice.message.content.strip()
    # The prompt holds the call and the result (tool_choice none: no tool block).
    session = engine_binding.Session()
    session.setup(str(smollm2_checkpoint), threads=1, max_context=512)
    text = session.tokenizer.decode(tokenize(server, {"messages": ROUND}))
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris",'
        '"unit":"celsius"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>tool\n18 degrees, sunny<|im_end|>\n<|im_start|>assistant\n"
    ) in text, text
    assert "<tools>" not in text


def test_auto_renders_the_tools_and_parses_what_comes(
    server: Server, engine_binding: Any, smollm2_checkpoint: Path
) -> None:
    session = engine_binding.Session()
    session.setup(str(smollm2_checkpoint), threads=1, max_context=512)
    text = session.tokenizer.decode(tokenize(server, {"messages": ASK, "tools": TOOLS}))
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert '"name":"get_weather"' in system and '"name":"get_time"' in system
    r = create(server, ASK, tools=TOOLS, tool_choice="auto")
    message = r.choices[0].message
    if message.tool_calls:  # the model chose to call: parsed (auto is not constrained)
        assert r.choices[0].finish_reason == "tool_calls"
        for call in message.tool_calls:
            assert call.function.name in SCHEMAS
            json.loads(call.function.arguments)
    else:
        assert isinstance(message.content, str)


def test_tool_choice_none_is_the_plain_prompt(server: Server) -> None:
    plain = tokenize(server, {"messages": ASK})
    assert tokenize(server, {"messages": ASK, "tools": TOOLS, "tool_choice": "none"}) == plain
    assert tokenize(server, {"messages": ASK, "tools": TOOLS}) != plain
    r = create(server, ASK, tools=TOOLS, tool_choice="none", max_tokens=8)
    assert r.choices[0].message.tool_calls is None
    assert (
        r.choices[0].message.content == create(server, ASK, max_tokens=8).choices[0].message.content
    )


def test_both_servers_encode_tools_as_the_engine_does(
    server: Server, engine_binding: Any, smollm2_checkpoint: Path
) -> None:
    """The same request with tools and tool messages becomes the same ids on both servers: the
    ids of the binding's encode_conversation with tools, which both run."""
    session = engine_binding.Session()
    session.setup(str(smollm2_checkpoint), threads=1, max_context=512)
    for choice, forced in (("auto", False), (NAMED, True)):
        tools = engine_binding.Tools.parse(json.dumps(TOOLS), json.dumps(choice), "")
        assert tools.forced == forced
        call = (CALL["id"], "get_weather", CALL["function"]["arguments"])
        messages = [
            ("user", ASK[0]["content"], []),
            ("assistant", "", [call]),
            ("tool", "18 degrees, sunny", []),
        ]
        want = engine_binding.encode_conversation(
            session.tokenizer, session.chat_template, messages, True, tools
        )
        got = tokenize(server, {"messages": ROUND, "tools": TOOLS, "tool_choice": choice})
        assert got == want
        if forced:  # the prompt opens the call the schema then constrains
            assert session.tokenizer.decode(got).endswith("<|im_start|>assistant\n<tool_call>\n")


@pytest.mark.parametrize(
    "extra, messages, param",
    [
        ({"tools": [{"type": "retrieval"}]}, ASK, "tools[0].type"),
        ({"tools": [{"type": "function", "function": {}}]}, ASK, "tools[0].function.name"),
        ({"tools": {"type": "function"}}, ASK, "tools"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
            ASK,
            "tools[0].function.parameters",
        ),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            ASK,
            "tool_choice.function.name",
        ),
        ({"tool_choice": "required"}, ASK, "tool_choice"),
        (  # a forced call's parameters must be enforceable by structured output
            {
                "tools": [
                    TIME,
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {"type": "string", "pattern": "^a+$"},
                        },
                    },
                ],
                "tool_choice": "required",
            },
            ASK,
            "tools[1].function.parameters",
        ),
        ({"tools": TOOLS, "tool_choice": "always"}, ASK, "tool_choice"),
        ({"tools": TOOLS, "parallel_tool_calls": "yes"}, ASK, "parallel_tool_calls"),
        ({}, [{"role": "user", "content": "x", "tool_calls": [CALL]}], "messages[0].tool_calls"),
        (
            {},
            [
                *ASK,
                {
                    "role": "assistant",
                    "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "{oops"}}],
                },
            ],
            "messages[1].tool_calls[0].function.arguments",
        ),
        ({}, [*ASK, {"role": "assistant", "content": None}], "messages[1].content"),
    ],
)
def test_bad_tools_get_400_naming_the_field(
    server: Server, extra: dict[str, Any], messages: list[dict[str, Any]], param: str
) -> None:
    body = {"model": NAME, "max_tokens": 2, "messages": messages, **extra}
    code, reply, _ = server.post("/v1/chat/completions", json.dumps(body).encode())
    assert code == 400 and reply["error"]["param"] == param, reply


def test_python_api_chat_with_tools(edgellm_package: Any, smollm2_checkpoint: Path) -> None:
    """edgellm.load(...).chat(tools=...): the same engine functions as both servers."""
    llm = edgellm_package.load(smollm2_checkpoint, threads=1, max_context=512)
    r = llm.chat(ASK, max_tokens=64, tools=TOOLS, tool_choice=NAMED)
    choice = r["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS["get_weather"])
    chunks = list(llm.chat(ASK, max_tokens=64, tools=TOOLS, tool_choice=NAMED, stream=True))
    deltas = [d for c in chunks for d in c["choices"][0]["delta"].get("tool_calls", [])]
    assert deltas[0]["function"]["name"] == "get_weather"
    streamed = "".join(d["function"]["arguments"] for d in deltas)
    assert json.loads(streamed) == json.loads(call["function"]["arguments"])
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    reply = llm.chat(ROUND, max_tokens=8, tools=TOOLS, tool_choice="none")
    assert reply["choices"][0]["message"]["content"]
    with pytest.raises(edgellm_package.ToolRequestError) as e:
        llm.chat(ASK, tools=[{"type": "retrieval"}])
    assert e.value.param == "tools[0].type" and "retrieval" in str(e.value)
    assert isinstance(e.value, edgellm_package.Error)
