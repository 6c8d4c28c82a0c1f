"""The engine's chat encoder end to end: ChatTemplate (the Jinja interpreter behind it) and
render_conversation, which turn OpenAI messages into what the template sees, against
transformers' own apply_chat_template on every template of the differential corpus, with a
real tokenizer's bos/eos. The text must be byte-identical, a template's raise_exception the
same refusal, and the ids of encode_conversation equal HF's tokenization of that text.

The messages are the ones the server reads: only its fields, call arguments as JSON text as
OpenAI clients send them (the template gets objects, as HF's docs pass them: templates write
`arguments | tojson`) and no content on a turn that only calls tools. A template that does
not name `tools` gets our own tool layout (tool_calls.h), not HF's silence, so tool
conversations are compared only on templates that render tools. strftime_now reads the
clock on both sides (the test date is today's)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jinja2
import pytest
from test_jinja_differential import CONVERSATIONS, CORPUS

# Fields the server reads from a message (llms/common/server/server.cpp kMessageFields).
SERVER_FIELDS = {"role", "content", "name", "tool_call_id", "tool_calls", "reasoning_content"}


def as_server_reads(messages: list[dict[str, Any]]) -> tuple[list[Any], list[Any]]:
    """(what HF's template gets, what a client sends us) for one conversation."""
    hf, ours = [], []
    for m in copy.deepcopy(messages):
        m = {k: v for k, v in m.items() if k in SERVER_FIELDS}
        if m.get("tool_calls") and not m.get("content"):
            m.pop("content", None)
        sent = copy.deepcopy(m)
        calls = zip(m.get("tool_calls", []), sent.get("tool_calls", []), strict=True)
        for call, sent_call in calls:
            args = call["function"]["arguments"]
            if isinstance(args, str):
                call["function"]["arguments"] = json.loads(args)
            else:
                sent_call["function"]["arguments"] = json.dumps(args)
        hf.append(m)
        ours.append(sent)
    return hf, ours


def has_tools(messages: list[dict[str, Any]], tools: Any) -> bool:
    return bool(tools) or any(m["role"] == "tool" or m.get("tool_calls") for m in messages)


@pytest.fixture(scope="module")
def hf_tokenizer(smollm2_checkpoint: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_checkpoint)


def hf_render(tok: Any, source: str, messages: Any, tools: Any, gen: bool, extra: dict) -> Any:
    try:
        return "text", tok.apply_chat_template(
            messages,
            tools=tools,
            chat_template=source,
            add_generation_prompt=gen,
            tokenize=False,
            **extra,
        )
    except jinja2.TemplateError as e:
        # raise_exception raises the base class itself; jinja2's own errors are subclasses.
        return ("raised" if type(e) is jinja2.TemplateError else "failed"), str(e)
    except Exception as e:  # a Python error inside the template
        return "failed", str(e)


def our_render(template: Any, messages: Any, tools: Any, gen: bool, extra: dict) -> Any:
    try:
        return "text", template.render_conversation(
            json.dumps(messages), gen, json.dumps(tools), json.dumps(extra)
        )
    except engine_error() as e:
        # A refusal is the template's own message; any other failure names the source.
        message = str(e)
        return ("raised" if message.startswith(RAISED) else "failed"), message.removeprefix(RAISED)


RAISED = "chat template: "


def engine_error() -> type:
    import edgellm_py

    return edgellm_py.Error


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_chat_encoder_matches_apply_chat_template(
    engine_binding: Any, hf_tokenizer: Any, path: Path
) -> None:
    source = path.read_text()
    tokenizer = engine_binding.Tokenizer.load(hf_tokenizer.name_or_path)
    template = engine_binding.ChatTemplate.from_text(
        source, hf_tokenizer.bos_token, path.name, hf_tokenizer.eos_token
    )
    diffs, compared = [], 0
    for name, raw, tools, gen, extra in CONVERSATIONS:
        hf_messages, messages = as_server_reads(raw)
        if has_tools(messages, tools) and not template.renders_tools():
            continue
        ref = hf_render(hf_tokenizer, source, hf_messages, tools, gen, extra)
        ours = our_render(template, messages, tools, gen, extra)
        compared += 1
        if ref[0] == "failed":  # a Python error: ours fails too, in its own words
            if ours[0] != "failed":
                diffs.append(f"{name}: HF failed ({ref[1]!r:.200}), ours {ours!r:.200}")
            continue
        if ours != ref:
            diffs.append(f"{name}:\n  HF:   {ref!r:.400}\n  ours: {ours!r:.400}")
            continue
        if ref[0] != "text":
            continue
        plain = not extra and all(set(m) <= {"role", "content"} for m in messages)
        if tools is None and plain:
            pairs = [(m["role"], m["content"]) for m in messages]
            ids = engine_binding.encode_conversation(tokenizer, template, pairs, gen)
            want = hf_tokenizer(ref[1], add_special_tokens=False)["input_ids"]
            if list(ids) != want:
                diffs.append(f"{name}: ids differ from HF's tokenization of the same text")
    assert not diffs, "\n".join(diffs)
    assert compared >= 4, f"{path.name}: only {compared} conversations compared"
