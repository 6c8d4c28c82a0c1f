"""OpenAI's Responses API (POST /v1/responses) on `edgellm serve`, with the official `openai`
client (SmolLM2). The C++ server only: the Ray ingress does not serve this route.

A Responses request is translated into the chat request it means and served by the chat route's
checks, encoder and scheduler, so a greedy reply must equal the chat route's reply to the same
conversation token for token: with instructions, after previous_response_id (the stored
conversation), and around a function call. Every reply and stream event is validated against the
client's own pydantic models (`Response`, `ResponseStreamEvent`), so a wrong shape fails.
"""

from __future__ import annotations

import json
import re
import signal
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from common.server import openai_schema as schema
from conftest import with_chat_template
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter
from test_protocol_types import OPTIONAL, VALUES, refusal_problem, with_value
from test_reasoning import THINK_TEMPLATE
from test_server import JSON, NAME, Server
from test_tool_calls import WEATHER

TOOL = {"type": "function", **WEATHER["function"]}  # the Responses API's flat shape
ASK = "What is the weather in Paris?"
STORED_RESPONSES = 256  # responses_store.h: kStoredResponses
EVENTS = TypeAdapter(ResponseStreamEvent)


@pytest.fixture(scope="module")
def server(smollm2_checkpoint: Path):
    s = Server(smollm2_checkpoint, "--parallel", "2")
    yield s
    assert s.stop() == 0


def respond(server: Server, **kw: Any) -> Response:
    """client.responses.create, greedy; the reply validated against the client's model."""
    kw.setdefault("max_output_tokens", 16)
    kw.setdefault("temperature", 0)
    raw = server.client.responses.with_raw_response.create(model=NAME, **kw)
    reply = Response.model_validate(raw.http_response.json())
    assert reply.object == "response" and reply.model == NAME and reply.id.startswith("resp_")
    return reply


def chat(server: Server, messages: list[dict[str, Any]], **kw: Any) -> Any:
    kw.setdefault("max_tokens", 16)
    kw.setdefault("temperature", 0)
    return server.client.chat.completions.create(model=NAME, messages=messages, **kw)


def check_same_reply(got: Response, want: Any) -> None:
    """`got` (Responses) says what `want` (chat) does: text, end, tokens."""
    assert got.output_text == (want.choices[0].message.content or ""), (got, want)
    cut = want.choices[0].finish_reason == "length"
    assert got.status == ("incomplete" if cut else "completed")
    if cut:
        assert got.incomplete_details and got.incomplete_details.reason == "max_output_tokens"
    u = got.usage
    assert u.input_tokens == want.usage.prompt_tokens
    assert u.output_tokens == want.usage.completion_tokens > 0
    assert u.total_tokens == u.input_tokens + u.output_tokens


def post(server: Server, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    code, reply, _ = server.post("/v1/responses", json.dumps(body).encode())
    return code, reply


def test_a_string_input_equals_the_chat_route(server: Server) -> None:
    prompt = "What is the capital of France?"
    got = respond(server, input=prompt, metadata={"ticket": "7"}, user="u1")
    check_same_reply(got, chat(server, [{"role": "user", "content": prompt}]))
    (item,) = got.output
    assert item.type == "message" and item.role == "assistant" and item.id.startswith("msg_")
    # Ids name stored conversations: 128 random bits, not a counter another client could guess.
    assert re.fullmatch(r"resp_[0-9a-f]{32}", got.id), got.id
    assert [c.type for c in item.content] == ["output_text"] and item.content[0].annotations == []
    assert got.metadata == {"ticket": "7"} and got.user == "u1" and got.store is True
    assert got.max_output_tokens == 16 and got.temperature == 0 and got.tools == []
    # max_output_tokens cuts it short: incomplete, as the chat route's "length".
    short = respond(server, input=prompt, max_output_tokens=2)
    check_same_reply(short, chat(server, [{"role": "user", "content": prompt}], max_tokens=2))
    assert short.output[0].status == "incomplete"


def test_instructions_are_the_system_message(server: Server) -> None:
    prompt = [{"role": "user", "content": "Name a colour."}]
    got = respond(server, input=prompt, instructions="Answer in French.")
    want = chat(server, [{"role": "system", "content": "Answer in French."}, *prompt])
    check_same_reply(got, want)
    assert got.instructions == "Answer in French."
    # A list of messages with text parts and a developer turn reads as the same conversation.
    parts = [{"type": "input_text", "text": t} for t in ("Name a ", "colour.")]
    items = [
        {"type": "message", "role": "developer", "content": "Answer in French."},
        {"type": "message", "role": "user", "content": parts},
    ]
    assert respond(server, input=items).output_text == got.output_text


def stream_events(server: Server, **kw: Any) -> list[Any]:
    kw.setdefault("max_output_tokens", 16)
    kw.setdefault("temperature", 0)
    with server.client.responses.create(model=NAME, stream=True, **kw) as stream:
        # Each event as sent, validated against the client's union of event types.
        return [EVENTS.validate_python(e.model_dump(mode="json")) for e in stream]


def check_order(events: list[Any], pattern: str) -> None:
    """Numbered 0, 1, 2, ... as sent; their types match `pattern` (a regex over 'a b c')."""
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = " ".join(e.type for e in events)
    assert re.fullmatch(pattern, kinds), kinds


TEXT_EVENTS = (
    r"response\.created response\.in_progress response\.output_item\.added "
    r"response\.content_part\.added( response\.output_text\.delta)+ response\.output_text\.done "
    r"response\.content_part\.done response\.output_item\.done response\.(completed|incomplete)"
)


def test_a_stream_joins_to_the_reply_in_order(server: Server) -> None:
    prompt = "Write one sentence about the sea."
    whole = respond(server, input=prompt, max_output_tokens=24)
    events = stream_events(server, input=prompt, max_output_tokens=24)
    check_order(events, TEXT_EVENTS)
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text
    (done,) = [e for e in events if e.type == "response.output_text.done"]
    assert done.text == deltas
    final = events[-1].response
    assert final.output_text == whole.output_text and final.status == whole.status
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert events[0].response.status == "in_progress" and events[0].response.id == final.id
    # A streamed response is stored by the time its end is read.
    follow = respond(server, input="Another, please.", previous_response_id=final.id)
    assert follow.previous_response_id == final.id


def test_the_client_stream_helper_accumulates_the_reply(server: Server) -> None:
    prompt = "What is the capital of France?"
    whole = respond(server, input=prompt, max_output_tokens=24)
    assert whole.status == "completed"  # the helper's final needs response.completed
    with server.client.responses.stream(
        model=NAME, input=prompt, max_output_tokens=24, temperature=0
    ) as stream:
        final = stream.get_final_response()
    assert final.output_text == whole.output_text
    assert [i.type for i in final.output] == ["message"]


def test_a_shutdown_cut_off_is_a_failure(smollm2_checkpoint: Path) -> None:
    """Cancelled by the drain: a whole reply gets 503 server_shutdown, a stream ends with
    response.failed (never response.completed)."""
    s = Server(smollm2_checkpoint, "--parallel", "2", "--drain", "0.5")
    try:
        long = {"input": "Count from 1 to 1000, one number per line."}
        long |= {"max_output_tokens": 400, "temperature": 0}
        with ThreadPoolExecutor(1) as pool:
            whole = pool.submit(post, s, {"model": NAME, **long})
            with s.client.responses.create(model=NAME, stream=True, **long) as stream:
                events = iter(stream)
                next(events)
                while s.metric("edgellm_active_requests") < 2:
                    time.sleep(0.05)
                s.proc.send_signal(signal.SIGTERM)
                rest = [EVENTS.validate_python(e.model_dump(mode="json")) for e in events]
            code, reply = whole.result(timeout=60)
        assert rest[-1].type == "response.failed", [e.type for e in rest]
        assert (
            rest[-1].response.status == "failed" and "shut down" in rest[-1].response.error.message
        )
        assert code == 503 and reply["error"]["code"] == "server_shutdown", reply
    finally:
        assert s.stop() == 0


def test_previous_response_id_continues_the_conversation(server: Server) -> None:
    first_ask = "My name is Ana. Say hello to me."
    first = respond(server, input=first_ask, instructions="Be brief.")
    then = respond(server, input="What is my name?", previous_response_id=first.id)
    assert then.previous_response_id == first.id and then.instructions is None
    # The whole history, as the chat route gets it; the first request's instructions are not
    # carried over (as OpenAI documents).
    want = chat(
        server,
        [
            {"role": "user", "content": first_ask},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "What is my name?"},
        ],
    )
    check_same_reply(then, want)
    # And on from there: the chain keeps every turn.
    third = respond(server, input="Thanks.", previous_response_id=then.id)
    want3 = chat(
        server,
        [
            {"role": "user", "content": first_ask},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "What is my name?"},
            {"role": "assistant", "content": then.output_text},
            {"role": "user", "content": "Thanks."},
        ],
    )
    check_same_reply(third, want3)


def test_a_response_not_stored_cannot_be_continued(server: Server) -> None:
    kept = respond(server, input="Hello.", store=False)
    assert kept.store is False
    for missing in (kept.id, "resp_" + "0" * 32):
        with pytest.raises(openai.BadRequestError) as e:
            respond(server, input="And?", previous_response_id=missing)
        assert e.value.body["param"] == "previous_response_id", e.value.body
        assert e.value.body["code"] == "previous_response_not_found"


def call_of(reply: Response) -> Any:
    (call,) = [i for i in reply.output if i.type == "function_call"]
    assert call.name == TOOL["name"] and call.call_id and call.id.startswith("fc_")
    jsonschema.validate(json.loads(call.arguments), TOOL["parameters"])
    return call


def test_a_forced_function_call_and_its_output(server: Server) -> None:
    forced = {"type": "function", "name": TOOL["name"]}
    reply = respond(server, input=ASK, tools=[TOOL], tool_choice=forced, max_output_tokens=64)
    call = call_of(reply)
    assert reply.tool_choice.name == TOOL["name"] and reply.tools[0].name == TOOL["name"]
    # Streamed, the call comes as its item with its arguments.
    events = stream_events(
        server, input=ASK, tools=[TOOL], tool_choice=forced, max_output_tokens=64
    )
    check_order(
        events,
        r"response\.created response\.in_progress response\.output_item\.added "
        r"response\.function_call_arguments\.delta response\.function_call_arguments\.done "
        r"response\.output_item\.done response\.completed",
    )
    assert call_of(events[-1].response).arguments == call.arguments
    # The tool's output, continuing the stored response, equals the chat route's round...
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "18 degrees"}
    after = respond(
        server, input=[result], previous_response_id=reply.id, tools=[TOOL], max_output_tokens=24
    )
    chat_call = {"id": call.call_id, "type": "function"}
    chat_call["function"] = {"name": call.name, "arguments": call.arguments}
    want = chat(
        server,
        [
            {"role": "user", "content": ASK},
            {"role": "assistant", "content": None, "tool_calls": [chat_call]},
            {"role": "tool", "tool_call_id": call.call_id, "content": "18 degrees"},
        ],
        tools=[WEATHER],
        max_tokens=24,
    )
    assert after.output_text == (want.choices[0].message.content or "")
    assert after.usage.input_tokens == want.usage.prompt_tokens
    # ...and so does the whole round sent as items (the call item as the client got it).
    items = [{"role": "user", "content": ASK}, call.model_dump(exclude_none=True), result]
    again = respond(server, input=items, tools=[TOOL], max_output_tokens=24)
    assert again.output_text == after.output_text
    assert again.usage.input_tokens == after.usage.input_tokens


def test_the_store_evicts_the_least_recently_used(server: Server) -> None:
    def stored(text: str) -> str:
        return respond(server, input=text, max_output_tokens=1).id

    oldest = stored("Hello 0.")
    next_oldest = stored("Hello 1.")
    with ThreadPoolExecutor(4) as pool:  # in any order among themselves, after those two
        others = list(pool.map(stored, [f"Hello {i}." for i in range(2, STORED_RESPONSES)]))
    # The store now holds exactly its bound. Continuing `oldest` (not stored itself) makes it
    # the most recently used...
    respond(server, input="And?", previous_response_id=oldest, store=False, max_output_tokens=1)
    stored("One more.")  # ...so this evicts the next least recent.
    respond(server, input="And?", previous_response_id=oldest, store=False, max_output_tokens=1)
    code, reply = post(
        server, {"model": NAME, "input": "And?", "previous_response_id": next_oldest}
    )
    assert code == 400 and reply["error"]["param"] == "previous_response_id", reply
    for kept in others[::8]:  # a sample: every request costs time
        respond(server, input="And?", previous_response_id=kept, store=False, max_output_tokens=1)


@pytest.mark.parametrize(
    "change, param",
    [
        ({"reasoning": {"effort": "low"}}, "reasoning"),
        ({"text": {"format": {"type": "json_object"}}}, "text"),
        ({"include": ["reasoning.encrypted_content"]}, "include"),
        ({"background": True}, "background"),
        ({"truncation": "auto"}, "truncation"),
        ({"prompt_cache_key": 7}, "prompt_cache_key"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [{**TOOL, "defer_loading": True}]}, "tools[0].defer_loading"),
        ({"tool_choice": {"type": "web_search"}}, "tool_choice"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0].type",
        ),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
        ({"input": []}, "input"),
        ({"input": None}, "input"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"max_output_tokens": 10_000}, "max_output_tokens"),  # past the context
        ({"temperature": 3}, "temperature"),
        ({"store": "yes"}, "store"),
        ({"metadata": {"a": 1}}, "metadata"),
        ({"instructions": ["x"]}, "instructions"),
        ({"tools": [{"type": "function", "name": "bad name!"}]}, "tools[0].name"),
    ],
)
def test_unsupported_requests_are_refused_by_name(
    server: Server, change: dict[str, Any], param: str
) -> None:
    body = {"model": NAME, "input": "Hi", **change}
    code, reply = post(server, {k: v for k, v in body.items() if v is not None})
    assert code == 400, reply
    schema.ErrorReply.model_validate(reply)
    assert reply["error"]["type"] == "invalid_request_error"
    assert reply["error"]["param"] == param, reply


def test_fields_that_ask_for_nothing_are_accepted(server: Server) -> None:
    no_op = {
        "include": [],
        "truncation": "disabled",
        "text": {"format": {"type": "text"}},
        "prompt_cache_key": "codex-session",
    }
    got = respond(server, input="Hi", extra_body=no_op)
    assert got.output_text == respond(server, input="Hi").output_text


def test_a_reasoning_template_is_refused(
    smollm2_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    model = with_chat_template(smollm2_checkpoint, tmp_path_factory.mktemp("t"), THINK_TEMPLATE)
    s = Server(model, "--parallel", "1")
    try:
        code, reply = post(s, {"model": NAME, "input": "Hi"})
        assert code == 400 and reply["error"]["param"] == "model", reply
        assert "reasoning" in reply["error"]["message"]
    finally:
        assert s.stop() == 0


# Every documented request field with a value of each JSON type (test_protocol_types.py's sweep,
# for this route): a type it does not take is a 400 naming the field, never a 5xx.
TYPED = {"model": NAME, "input": "Hi", "max_output_tokens": 2}
FUNCTION = {"type": "function", "name": "f", "description": "d"}
FUNCTION["parameters"] = {"type": "object", "properties": {}}
TYPED_ITEMS = {
    **TYPED,
    "tools": [FUNCTION],
    "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "ok"},
    ],
}
FORCED = {**TYPED_ITEMS, "tool_choice": {"type": "function", "name": "f"}}
FIELDS = [
    ("model", ("string",), TYPED),
    ("input", ("string", "list"), TYPED),
    ("input[0]", ("object",), TYPED_ITEMS),
    ("input[0].type", ("string", *OPTIONAL), TYPED_ITEMS),
    ("input[0].role", ("string",), TYPED_ITEMS),
    ("input[0].content", ("string", "list"), TYPED_ITEMS),
    ("input[0].content[0]", ("object",), TYPED_ITEMS),
    ("input[0].content[0].type", ("string",), TYPED_ITEMS),
    ("input[0].content[0].text", ("string",), TYPED_ITEMS),
    ("input[1].call_id", ("string",), TYPED_ITEMS),
    ("input[1].name", ("string",), TYPED_ITEMS),
    ("input[1].arguments", ("string",), TYPED_ITEMS),
    ("input[2].call_id", ("string",), TYPED_ITEMS),
    ("input[2].output", ("string", "list"), TYPED_ITEMS),
    ("instructions", ("string", *OPTIONAL), TYPED),
    ("max_output_tokens", ("number", *OPTIONAL), TYPED),
    ("temperature", ("number", *OPTIONAL), TYPED),
    ("top_p", ("number", *OPTIONAL), TYPED),
    ("stream", ("bool", *OPTIONAL), TYPED),
    ("store", ("bool", *OPTIONAL), TYPED),
    ("previous_response_id", ("string", *OPTIONAL), TYPED),
    ("metadata", ("object", *OPTIONAL), TYPED),
    ("user", ("string", *OPTIONAL), TYPED),
    ("parallel_tool_calls", ("bool", *OPTIONAL), TYPED_ITEMS),
    ("tools", ("list", *OPTIONAL), TYPED_ITEMS),
    ("tools[0]", ("object",), TYPED_ITEMS),
    ("tools[0].type", ("string",), TYPED_ITEMS),
    ("tools[0].name", ("string",), TYPED_ITEMS),
    ("tools[0].description", ("string", *OPTIONAL), TYPED_ITEMS),
    ("tools[0].parameters", ("object", *OPTIONAL), TYPED_ITEMS),
    ("tools[0].strict", ("bool", *OPTIONAL), TYPED_ITEMS),
    ("tool_choice", ("string", "object", *OPTIONAL), TYPED_ITEMS),
    ("tool_choice.type", ("string",), FORCED),
    ("tool_choice.name", ("string",), FORCED),
]


def raw_post(server: Server, body: dict[str, Any]) -> tuple[int, str]:
    request = urllib.request.Request(
        server.url + "/v1/responses", json.dumps(body).encode(), headers=JSON
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_typed_bases_are_served(server: Server) -> None:
    """Every request a field is swept in is served as written: a refusal comes from the field."""
    for base in (TYPED, TYPED_ITEMS, FORCED):
        code, text = raw_post(server, base)
        assert code == 200, text
        Response.model_validate_json(text)


@pytest.mark.parametrize("path, takes, base", FIELDS, ids=[p for p, _, _ in FIELDS])
def test_a_wrong_type_is_a_400_naming_the_field(
    server: Server, path: str, takes: tuple[str, ...], base: dict[str, Any]
) -> None:
    problems = []
    for kind, value in VALUES.items():
        code, text = raw_post(server, with_value(base, path, value))
        if kind in takes:
            if code >= 500:  # its value may be refused (400, or 404 for an unknown model)
                problems.append(f"{kind}: HTTP {code} {text[:300]}")
        elif code != 400:
            problems.append(f"{kind}: HTTP {code}, want 400: {text[:300]}")
        elif problem := refusal_problem("/v1/responses", path, text):
            problems.append(f"{kind}: {problem}: {text[:300]}")
    assert not problems, f"{path}:\n" + "\n".join(problems)
