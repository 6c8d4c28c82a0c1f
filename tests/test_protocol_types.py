"""Wrong JSON types in every documented request field: a 400 naming the field, never a 500.

Each documented field of /v1/chat/completions, /v1/completions and /v1/messages (nested ones
too: a message's role, a tool's schema, tool_choice.type, a content block's text) is sent with
a value of every JSON type (null, number, string, list, object, bool). A type the API does not
accept must be refused with 400, in the route's own error shape (OpenAI's {"error": {"param"}}
or Anthropic's {"type": "error", "error": {...}}), naming the field; a type it accepts may
still be refused for its value (400; 404 for an unknown model) or served, never with a 5xx.
After each field the server still answers /health. Runs against both servers: `edgellm serve`
(C++) and the Ray ingress, which share the Messages translation (anthropic_messages.cpp) and
the tool parsing.
"""

from __future__ import annotations

import copy
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from test_server import KINDS, NAME, Server

# One value of each JSON type.
VALUES: dict[str, Any] = {
    "null": None,
    "number": 5,
    "string": "x",
    "list": [1],
    "object": {"a": 1},
    "bool": True,
}
OPTIONAL = ("null",)  # null means absent, as in both APIs

HI = [{"role": "user", "content": "Hi"}]
TOOL_CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
FUNCTION = {"name": "f", "description": "d", "parameters": {"type": "object", "properties": {}}}
TOOLED_CHAT = [
    *HI,
    {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
]
CHAT = {"model": NAME, "messages": HI, "max_tokens": 1, "temperature": 0}
CHAT_BLOCKS = {**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]}
CHAT_TOOLS = {**CHAT, "tools": [{"type": "function", "function": FUNCTION}]}
CHAT_ROUND = {**CHAT_TOOLS, "messages": TOOLED_CHAT}
CHAT_FORCED = {**CHAT_TOOLS, "tool_choice": {"type": "function", "function": {"name": "f"}}}
SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}}
CHAT_SCHEMA = {**CHAT, "response_format": SCHEMA_FORMAT}
CHAT_STREAM = {**CHAT, "stream": True, "stream_options": {}}

# (field path, the JSON types the API takes there, the request it is set in).
CHAT_FIELDS: list[tuple[str, tuple[str, ...], dict[str, Any]]] = [
    ("model", ("string",), CHAT),
    ("messages", ("list",), CHAT),
    ("messages[0]", ("object",), CHAT),
    ("messages[0].role", ("string",), CHAT),
    ("messages[0].content", ("string", "list"), CHAT),
    ("messages[0].content[0]", ("object",), CHAT_BLOCKS),
    ("messages[0].content[0].type", ("string",), CHAT_BLOCKS),
    ("messages[0].content[0].text", ("string",), CHAT_BLOCKS),
    ("messages[0].name", ("string", *OPTIONAL), CHAT),
    ("messages[1].tool_calls", ("list", *OPTIONAL), CHAT_ROUND),
    ("messages[1].tool_calls[0]", ("object",), CHAT_ROUND),
    ("messages[1].tool_calls[0].id", ("string",), CHAT_ROUND),
    ("messages[1].tool_calls[0].type", ("string", *OPTIONAL), CHAT_ROUND),
    ("messages[1].tool_calls[0].function", ("object",), CHAT_ROUND),
    ("messages[1].tool_calls[0].function.name", ("string",), CHAT_ROUND),
    ("messages[1].tool_calls[0].function.arguments", ("string", "object"), CHAT_ROUND),
    ("messages[1].reasoning_content", ("string", *OPTIONAL), CHAT_ROUND),
    ("messages[2].tool_call_id", ("string", *OPTIONAL), CHAT_ROUND),
    ("max_tokens", ("number", *OPTIONAL), CHAT),
    ("max_completion_tokens", ("number", *OPTIONAL), CHAT),
    ("temperature", ("number", *OPTIONAL), CHAT),
    ("top_p", ("number", *OPTIONAL), CHAT),
    ("top_k", ("number", *OPTIONAL), CHAT),
    ("min_p", ("number", *OPTIONAL), CHAT),
    ("frequency_penalty", ("number", *OPTIONAL), CHAT),
    ("presence_penalty", ("number", *OPTIONAL), CHAT),
    ("seed", ("number", *OPTIONAL), CHAT),
    ("n", ("number", *OPTIONAL), CHAT),
    ("stop", ("string", "list", *OPTIONAL), CHAT),
    ("stop[0]", ("string",), {**CHAT, "stop": ["zzz"]}),
    ("ignore_eos", ("bool", *OPTIONAL), CHAT),
    ("stream", ("bool", *OPTIONAL), CHAT),
    ("stream_options", ("object", *OPTIONAL), CHAT_STREAM),
    ("stream_options.include_usage", ("bool", *OPTIONAL), CHAT_STREAM),
    ("logprobs", ("bool", *OPTIONAL), CHAT),
    ("top_logprobs", ("number", *OPTIONAL), {**CHAT, "logprobs": True}),
    ("response_format", ("object", *OPTIONAL), CHAT),
    ("response_format.type", ("string",), CHAT_SCHEMA),
    ("response_format.json_schema", ("object",), CHAT_SCHEMA),
    ("response_format.json_schema.name", ("string", *OPTIONAL), CHAT_SCHEMA),
    ("response_format.json_schema.strict", ("bool", *OPTIONAL), CHAT_SCHEMA),
    # A JSON Schema is an object or a boolean (true: anything, false: nothing).
    ("response_format.json_schema.schema", ("object", "bool"), CHAT_SCHEMA),
    ("tools", ("list", *OPTIONAL), CHAT_TOOLS),
    ("tools[0]", ("object",), CHAT_TOOLS),
    ("tools[0].type", ("string",), CHAT_TOOLS),
    ("tools[0].function", ("object",), CHAT_TOOLS),
    ("tools[0].function.name", ("string",), CHAT_TOOLS),
    ("tools[0].function.description", ("string", *OPTIONAL), CHAT_TOOLS),
    ("tools[0].function.parameters", ("object", *OPTIONAL), CHAT_TOOLS),
    ("tools[0].function.strict", ("bool", *OPTIONAL), CHAT_TOOLS),
    ("tool_choice", ("string", "object", *OPTIONAL), CHAT_TOOLS),
    ("tool_choice.type", ("string",), CHAT_FORCED),
    ("tool_choice.function", ("object",), CHAT_FORCED),
    ("tool_choice.function.name", ("string",), CHAT_FORCED),
    ("parallel_tool_calls", ("bool", *OPTIONAL), CHAT_TOOLS),
    ("chat_template_kwargs", ("object", *OPTIONAL), CHAT),
    ("reasoning_budget", ("number", *OPTIONAL), CHAT),
    ("user", ("string", *OPTIONAL), CHAT),
    ("metadata", ("object", *OPTIONAL), CHAT),
    ("store", ("bool", *OPTIONAL), CHAT),
]

COMPLETION = {"model": NAME, "prompt": "Hi", "max_tokens": 1, "temperature": 0}
COMPLETION_FIELDS: list[tuple[str, tuple[str, ...], dict[str, Any]]] = [
    ("prompt", ("string", "list"), COMPLETION),
    ("prompt[0]", ("string",), {**COMPLETION, "prompt": ["Hi"]}),
    ("logprobs", ("number", *OPTIONAL), COMPLETION),
    ("max_tokens", ("number", *OPTIONAL), COMPLETION),
    ("stop", ("string", "list", *OPTIONAL), COMPLETION),
]

MESSAGES = {"model": NAME, "max_tokens": 1, "messages": HI, "temperature": 0}
TOOL = {"name": "f", "description": "d", "input_schema": {"type": "object", "properties": {}}}
MESSAGES_TOOLS = {**MESSAGES, "tools": [TOOL]}
BLOCKS = {**MESSAGES, "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]}
SYSTEM_BLOCKS = {**MESSAGES, "system": [{"type": "text", "text": "Be brief."}]}
THINKING_AND_CALL = [
    {"type": "thinking", "thinking": "hm", "signature": ""},
    {"type": "tool_use", "id": "call_1", "name": "f", "input": {}},
]
RESULT = [{"type": "tool_result", "tool_use_id": "call_1", "content": "ok"}]
TOOL_ROUND = {
    **MESSAGES_TOOLS,
    "messages": [
        *HI,
        {"role": "assistant", "content": THINKING_AND_CALL},
        {"role": "user", "content": RESULT},
    ],
}
AUTO = {**MESSAGES_TOOLS, "tool_choice": {"type": "auto"}}
MESSAGES_FIELDS: list[tuple[str, tuple[str, ...], dict[str, Any]]] = [
    ("model", ("string",), MESSAGES),
    ("max_tokens", ("number",), MESSAGES),
    ("messages", ("list",), MESSAGES),
    ("messages[0]", ("object",), MESSAGES),
    ("messages[0].role", ("string",), MESSAGES),
    ("messages[0].content", ("string", "list"), MESSAGES),
    ("messages[0].content[0]", ("object",), BLOCKS),
    ("messages[0].content[0].type", ("string",), BLOCKS),
    ("messages[0].content[0].text", ("string",), BLOCKS),
    ("messages[0].content[0].cache_control", ("object", *OPTIONAL), BLOCKS),
    ("messages[1].content[0].thinking", ("string",), TOOL_ROUND),
    ("messages[1].content[1].id", ("string",), TOOL_ROUND),
    ("messages[1].content[1].name", ("string",), TOOL_ROUND),
    ("messages[1].content[1].input", ("object",), TOOL_ROUND),
    ("messages[2].content[0].tool_use_id", ("string",), TOOL_ROUND),
    ("messages[2].content[0].content", ("string", "list", *OPTIONAL), TOOL_ROUND),
    ("messages[2].content[0].is_error", ("bool", *OPTIONAL), TOOL_ROUND),
    ("system", ("string", "list", *OPTIONAL), MESSAGES),
    ("system[0]", ("object",), SYSTEM_BLOCKS),
    ("system[0].text", ("string",), SYSTEM_BLOCKS),
    ("stop_sequences", ("list", *OPTIONAL), MESSAGES),
    ("stop_sequences[0]", ("string",), {**MESSAGES, "stop_sequences": ["zzz"]}),
    ("stream", ("bool", *OPTIONAL), MESSAGES),
    ("temperature", ("number", *OPTIONAL), MESSAGES),
    ("top_p", ("number", *OPTIONAL), MESSAGES),
    ("top_k", ("number", *OPTIONAL), MESSAGES),
    ("metadata", ("object", *OPTIONAL), MESSAGES),
    ("metadata.user_id", ("string", *OPTIONAL), {**MESSAGES, "metadata": {"user_id": "u"}}),
    ("tools", ("list", *OPTIONAL), MESSAGES_TOOLS),
    ("tools[0]", ("object",), MESSAGES_TOOLS),
    ("tools[0].type", ("string", *OPTIONAL), MESSAGES_TOOLS),
    ("tools[0].name", ("string",), MESSAGES_TOOLS),
    ("tools[0].description", ("string", *OPTIONAL), MESSAGES_TOOLS),
    ("tools[0].input_schema", ("object",), MESSAGES_TOOLS),
    ("tool_choice", ("object", *OPTIONAL), MESSAGES_TOOLS),
    ("tool_choice.type", ("string",), AUTO),
    (
        "tool_choice.name",
        ("string",),
        {**MESSAGES_TOOLS, "tool_choice": {"type": "tool", "name": "f"}},
    ),
    ("tool_choice.disable_parallel_tool_use", ("bool", *OPTIONAL), AUTO),
    ("thinking", ("object", *OPTIONAL), MESSAGES),
    ("thinking.type", ("string",), {**MESSAGES, "thinking": {"type": "disabled"}}),
    (
        "thinking.budget_tokens",
        ("number",),
        {**MESSAGES, "thinking": {"type": "enabled", "budget_tokens": 8}},
    ),
]

ROUTES = {
    "/v1/chat/completions": CHAT_FIELDS,
    "/v1/completions": COMPLETION_FIELDS,
    "/v1/messages": MESSAGES_FIELDS,
}
CASES = [(route, *row) for route, rows in ROUTES.items() for row in rows]


def parse_path(path: str) -> list[str | int]:
    """ "a[0].b" -> ["a", 0, "b"]."""
    keys: list[str | int] = []
    for part in path.split("."):
        name, *indices = part.split("[")
        keys.append(name)
        keys += [int(i.rstrip("]")) for i in indices]
    return keys


def with_value(body: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(body)
    *parents, last = parse_path(path)
    node: Any = out
    for key in parents:
        node = node[key]
    node[last] = copy.deepcopy(value)
    return out


def leaf(path: str) -> str:
    """The name a refusal must mention: the field's key (`tools` for tools[0])."""
    keys = [k for k in parse_path(path) if isinstance(k, str)]
    return keys[-1]


def post(server: Server, route: str, body: dict[str, Any]) -> tuple[int, str]:
    req = urllib.request.Request(
        server.url + route,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def refusal_problem(route: str, path: str, text: str) -> str | None:
    """What is wrong with a 400's body for the field at `path` (None: it is right)."""
    reply = json.loads(text)
    if route == "/v1/messages":
        ok = (
            reply.get("type") == "error"
            and reply.get("error", {}).get("type") == "invalid_request_error"
            and isinstance(reply["error"].get("message"), str)
        )
        if not ok:
            return "not Anthropic's error shape"
        named = reply["error"]["message"]
    else:
        error = reply.get("error")
        if not isinstance(error, dict) or error.get("type") != "invalid_request_error":
            return "not OpenAI's error shape"
        param = error.get("param") or ""
        top = str(parse_path(path)[0])
        if not param or str(parse_path(param)[0]) != top:
            return f"param {param!r} does not name {top!r}"
        named = param + " " + error.get("message", "")
    return None if leaf(path) in named else f"the error does not name {leaf(path)!r}"


@pytest.fixture(scope="module", params=KINDS)
def server(request: pytest.FixtureRequest, smollm2_checkpoint: Path):
    s = Server(smollm2_checkpoint, "--parallel", "2", kind=request.param)
    yield s
    assert s.stop() == 0


def test_bases_are_served(server: Server) -> None:
    """Every request a field is swept in is served as written: a refusal comes from the field."""
    bases = {(route, json.dumps(base, sort_keys=True)) for route, _, _, base in CASES}
    for route, text in sorted(bases):
        code, reply = post(server, route, json.loads(text))
        assert code == 200, (route, text, reply)


@pytest.mark.parametrize(
    "route, path, takes, base", CASES, ids=[f"{r}:{p}" for r, p, _, _ in CASES]
)
def test_wrong_type_is_a_400_naming_the_field(
    server: Server, route: str, path: str, takes: tuple[str, ...], base: dict[str, Any]
) -> None:
    problems = []
    for kind, value in VALUES.items():
        code, text = post(server, route, with_value(base, path, value))
        if kind in takes:
            if code >= 500:  # its value may be refused (400, or 404 for an unknown model)
                problems.append(f"{kind}: HTTP {code} {text[:300]}")
            continue
        if code != 400:
            problems.append(f"{kind}: HTTP {code}, want 400: {text[:300]}")
        elif problem := refusal_problem(route, path, text):
            problems.append(f"{kind}: {problem}: {text[:300]}")
    assert not problems, f"{route} {path}:\n" + "\n".join(problems)
    assert server.proc.poll() is None and server.get("/health")[0] == 200
