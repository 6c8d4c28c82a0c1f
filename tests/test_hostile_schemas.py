"""Hostile JSON schemas (issue 38) against both servers, the CLI and the binding.

A response_format schema or a forced tool call's parameters is untrusted input: compiling it
stays within edgellm.h's JsonSchemaLimits (reference depth 1000, 250,000 grammar nodes, ...)
or is one 400 naming the limit, answered at once, the server up and /health answering within
1 s after it. Before: a flat chain of 12,000 $defs references crashed `edgellm serve` (one
native recursion per $ref), 25,000 took 7 s of CPU, {"minimum": 1e16} on an integer returned
999999999999999 as valid, and a tool's "#/$defs/City" resolved against the call's wrapper.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from conftest import assert_one_line_error, edgellm_cmd
from test_server import KINDS, NAME, Server

REF_DEPTH = 1000  # JsonSchemaLimits::kMaxRefDepth (edgellm/json_grammar.h)
QUICK_S = 2.0  # a refusal costs milliseconds; the margin is for a loaded 2-core machine
ASK = [{"role": "user", "content": "Record the city Paris."}]


def ref_chain(links: int) -> dict[str, Any]:
    """d0 -> d1 -> ... -> d<links> (a string): d<links> is links + 1 $ref hops from the root."""
    defs: dict[str, Any] = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(links)}
    defs[f"d{links}"] = {"type": "string"}
    return {"$ref": "#/$defs/d0", "$defs": defs}


def compact(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def rf(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def tool(parameters: dict[str, Any], name: str = "record") -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


@pytest.fixture(scope="module", params=KINDS)
def server(request: pytest.FixtureRequest, smollm2_checkpoint: Path):
    s = Server(smollm2_checkpoint, "--parallel", "2", kind=request.param)
    yield s
    assert s.stop() == 0


def post_chat(server: Server, **fields: Any) -> tuple[int, dict[str, Any], float]:
    """A chat request (compact JSON, under the 1 MiB body limit): status, reply, seconds."""
    body = compact({"model": NAME, "messages": ASK, "max_tokens": 48, "temperature": 0, **fields})
    assert len(body) <= 1 << 20, len(body)
    start = time.monotonic()
    code, reply, _ = server.post("/v1/chat/completions", body)
    return code, reply, time.monotonic() - start


def assert_still_serving(server: Server) -> None:
    """The process is up and /health answers within 1 s."""
    assert server.proc.poll() is None, server.proc.stderr.read()
    start = time.monotonic()
    status, _ = server.get("/health")
    assert status == 200 and time.monotonic() - start < 1.0


def assert_refused(server: Server, param: str, needles: list[str], **fields: Any) -> dict[str, Any]:
    code, reply, seconds = post_chat(server, **fields)
    assert code == 400, reply
    assert reply["error"]["param"] == param, reply
    for needle in needles:
        assert needle in reply["error"]["message"], reply
    assert seconds < QUICK_S, f"refused after {seconds:.2f} s"
    assert_still_serving(server)
    return reply


@pytest.mark.parametrize("links", [12_000, 25_000])
def test_response_format_reference_chain_is_refused_at_once(server: Server, links: int) -> None:
    assert_refused(
        server,
        "response_format",
        [f"'#/$defs/d{REF_DEPTH}'", f"{REF_DEPTH} $ref hops", "reference depth"],
        response_format=rf(ref_chain(links)),
    )


def test_reference_chain_within_the_limit_is_served(server: Server) -> None:
    code, reply, _ = post_chat(server, max_tokens=8, response_format=rf(ref_chain(REF_DEPTH - 1)))
    assert code == 200, reply
    text = reply["choices"][0]["message"]["content"]
    assert text.startswith('"'), text  # the string at the chain's end
    assert_still_serving(server)


@pytest.mark.parametrize("keyword, bound", [("minimum", 1e16), ("minimum", 1e300),
                                            ("exclusiveMinimum", 999999999999999),
                                            ("maximum", -1e16)])  # fmt: skip
def test_integer_bound_no_emitted_integer_meets_is_refused(
    server: Server, keyword: str, bound: float
) -> None:
    schema = {"type": "integer", keyword: bound}
    assert_refused(
        server, "response_format", [f"'{keyword}'", "999999999999999"], response_format=rf(schema)
    )


def test_integer_bound_every_emitted_integer_meets_is_served(server: Server) -> None:
    schema = {"type": "integer", "minimum": 999999999999990, "maximum": 1e300}
    code, reply, _ = post_chat(server, response_format=rf(schema))
    assert code == 200, reply
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "stop", choice
    jsonschema.validate(json.loads(choice["message"]["content"]), schema)


CITY = {
    "type": "object",
    "properties": {"city": {"$ref": "#/$defs/City"}},
    "required": ["city"],
    "additionalProperties": False,
    "$defs": {
        "City": {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 20}},
            "required": ["name"],
            "additionalProperties": False,
        }
    },
}
NAMED = {"type": "function", "function": {"name": "record"}}


@pytest.mark.parametrize("choice", ["required", NAMED])
def test_tool_refs_resolve_in_the_tools_own_parameters(server: Server, choice: Any) -> None:
    code, reply, _ = post_chat(server, tools=[tool(CITY)], tool_choice=choice)
    assert code == 200, reply
    message = reply["choices"][0]["message"]
    assert reply["choices"][0]["finish_reason"] == "tool_calls", message
    [call] = message["tool_calls"]
    assert call["function"]["name"] == "record"
    jsonschema.validate(json.loads(call["function"]["arguments"]), CITY)  # $defs/City enforced


def test_tool_root_ref_means_the_parameters_not_the_call(server: Server) -> None:
    tree = {
        "type": "object",
        "properties": {"label": {"type": "string", "maxLength": 8}, "child": {"$ref": "#"}},
        "required": ["label"],
        "additionalProperties": False,
    }
    code, reply, _ = post_chat(server, tools=[tool(tree)], tool_choice=NAMED, max_tokens=96)
    assert code == 200, reply
    assert reply["choices"][0]["finish_reason"] == "tool_calls", reply["choices"][0]
    arguments = json.loads(reply["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"])
    jsonschema.validate(arguments, tree)  # every level a tree node: no nested call objects


def test_tool_ref_outside_its_parameters_is_refused(server: Server) -> None:
    parameters = {"type": "object", "properties": {"x": {"$ref": "#/properties/name"}}}
    assert_refused(
        server,
        "tools[0].function.parameters",
        ["'#/properties/name' does not resolve"],
        tools=[tool(parameters)],
        tool_choice="required",
    )


def test_tool_parameters_reference_chain_is_refused_at_once(
    server: Server, edgellm_package: Any
) -> None:
    # A server renders the tools into the prompt first: 25,000 links are ~600k tokens, past
    # any context, so that is the 400 here. The call grammar's own refusal, which a model
    # with the context for them would reach, is the binding's (the Ray replica's) below.
    code, reply, seconds = post_chat(
        server, tools=[tool(ref_chain(25_000))], tool_choice="required"
    )
    assert code == 400, reply
    assert seconds < QUICK_S, f"refused after {seconds:.2f} s"
    assert_still_serving(server)
    tools = edgellm_package.Tools.parse(json.dumps([tool(ref_chain(25_000))]), '"required"')
    with pytest.raises(edgellm_package.ToolRequestError, match=f"{REF_DEPTH} \\$ref hops") as e:
        tools.call_grammar()
    assert e.value.param == "tools[0].function.parameters"


def vm_hwm_mb(pid: int) -> float:
    """The process's peak resident set (VmHWM), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_hostile_schemas_cost_edgellm_serve_at_most_256_mb(smollm2_checkpoint: Path) -> None:
    s = Server(smollm2_checkpoint, "--parallel", "2", kind="cpp")
    try:
        before = vm_hwm_mb(s.proc.pid)
        hostile = [
            {"response_format": rf(ref_chain(25_000))},
            {"response_format": rf({"enum": [i % 10 for i in range(200_000)]})},  # served
            {"tools": [tool(ref_chain(25_000))], "tool_choice": "required"},
        ]
        for fields in hostile:
            code, reply, _ = post_chat(s, max_tokens=1, **fields)
            assert code in (200, 400), reply
        assert vm_hwm_mb(s.proc.pid) - before <= 256
        assert_still_serving(s)
    finally:
        assert s.stop() == 0


def test_binding_refuses_the_chain_as_an_edgellm_error(edgellm_package: Any) -> None:
    start = time.monotonic()
    with pytest.raises(edgellm_package.Error, match="reference depth") as e:
        edgellm_package.compile_json_schema(json.dumps(ref_chain(25_000)))
    assert time.monotonic() - start < QUICK_S
    assert isinstance(e.value, edgellm_package.JsonSchemaError)
    assert isinstance(e.value, ValueError)  # as JsonSchemaError always was
    deep = "[" * 100_000 + "]" * 100_000  # refused while parsed, not by a stack overflow
    with pytest.raises(edgellm_package.JsonSchemaError, match="nested deeper than 64"):
        edgellm_package.compile_json_schema(deep)
    with pytest.raises(edgellm_package.JsonSchemaError, match="nested deeper than 64"):
        edgellm_package.compile_response_format(f'{{"type": "json_schema", "json_schema": {deep}}}')
    with pytest.raises(edgellm_package.JsonSchemaError, match="'minimum'.*999999999999999"):
        edgellm_package.compile_json_schema('{"type": "integer", "minimum": 1e16}')


def test_cli_refuses_the_chain_in_one_error_line(tmp_path: Path, edgellm_bin: Path) -> None:
    path = tmp_path / "chain.json"
    path.write_text(json.dumps(ref_chain(12_000)))
    start = time.monotonic()
    proc = subprocess.run(
        [*edgellm_cmd("run"), "--json-schema", str(path)], capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert time.monotonic() - start < 10  # before the model loads
    assert_one_line_error(proc, "--json-schema", f"{REF_DEPTH} $ref hops", code=2)
