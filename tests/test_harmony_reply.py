"""gpt-oss's harmony replies through every front end (edgellm serve and the Ray server, with the
openai and anthropic clients; the Python API): analysis is `reasoning_content` (Anthropic: a
thinking block), final is the content, a json_schema binds only to the final body, and with
tools the final body still streams as it comes.

The gpt-oss fixture's tokenizer is SmolLM2's (make_fixture borrows it), which has no harmony
markers, and random weights never write them. So SmolLM2 stands in for a harmony model: its
checkpoint with seven of its special tokens renamed to harmony's markers (still special, same
ids), <|return|> and <|call|> among its EOS ids, and a harmony template whose generation prompt
opens the analysis body. SmolLM2 never closes it, so every reply here is shaped by the
reasoning budget (harmony's close, `<|end|><|start|>assistant<|channel|>final<|message|>`,
forced in after that many tokens): the reasoning is exactly what the prompt continues with,
and the content is what follows the close, with no marker in either. Were the markers dropped
from the text (as every other template's special tokens are), the close would vanish and the
whole reply would read as reasoning.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import pytest
from test_reasoning import assert_the_schema_binds_after_the_reasoning, streamed_parts
from test_server import KINDS, NAME, Server

MARKERS = ["<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>", "<|return|>"]
MARKERS += ["<|call|>"]
# Each body starts "ROLE: " so that SmolLM2 reads on as in a transcript.
HARMONY_TEMPLATE = (
    "{% for m in messages %}<|start|>{{ m.role }}"
    "{% if m.role == 'assistant' %}<|channel|>final{% endif %}"
    "<|message|>{{ m.role }}: {{ m.content }}\n<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant<|channel|>analysis<|message|>assistant: "
    "{% endif %}"
)
ASK = [{"role": "user", "content": "Tell me about Paris."}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def with_harmony_tokens(checkpoint: Path, parent: Path) -> Path:
    """`checkpoint` under `parent` with harmony's markers as special tokens (SmolLM2's ids
    3-9, which name StarCoder's <repo_name> and the like), its EOS ids and HARMONY_TEMPLATE.
    (SmolLM2's own <|im_start|> stays: a special token harmony's text does not keep.)"""
    model = parent / checkpoint.name
    model.mkdir()
    own = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")
    for f in checkpoint.iterdir():
        if f.name not in own:
            (model / f.name).symlink_to(f)
    tok = json.loads((checkpoint / "tokenizer.json").read_text())
    added = tok["added_tokens"][3 : 3 + len(MARKERS)]
    vocab = tok["model"]["vocab"]
    for token, marker in zip(added, MARKERS, strict=True):
        assert token["special"], token
        vocab[marker] = vocab.pop(token["content"])
        token["content"] = marker
    (model / "tokenizer.json").write_text(json.dumps(tok))
    config = json.loads((checkpoint / "tokenizer_config.json").read_text())
    config["chat_template"] = HARMONY_TEMPLATE
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    generation = json.loads((checkpoint / "generation_config.json").read_text())
    ids = {t["content"]: t["id"] for t in added}
    generation["eos_token_id"] = [generation["eos_token_id"], ids["<|return|>"], ids["<|call|>"]]
    (model / "generation_config.json").write_text(json.dumps(generation))
    return model


@pytest.fixture(scope="module")
def harmony_checkpoint(smollm2_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return with_harmony_tokens(smollm2_checkpoint, tmp_path_factory.mktemp("harmony"))


@pytest.fixture(scope="module", params=KINDS)
def harmony(request: pytest.FixtureRequest, harmony_checkpoint: Path):
    s = Server(harmony_checkpoint, "--parallel", "2", "--reasoning-budget", "6", kind=request.param)
    s.checkpoint = harmony_checkpoint
    s.anthropic = anthropic.Anthropic(base_url=s.url, api_key="none", max_retries=0)
    yield s
    assert s.stop() == 0


def chat(s: Server, **kw: Any) -> Any:
    kw.setdefault("max_tokens", 40)
    return s.client.chat.completions.create(model=NAME, messages=ASK, temperature=0, **kw)


def completion(s: Server, max_tokens: int, **body: Any) -> str:
    """What the chat prompt (`body`: more of the chat request) continues with, unconstrained
    and with no reply rules."""
    request = {"model": NAME, "messages": ASK, **body}
    status, tokens, _ = s.post("/tokenize", json.dumps(request).encode())
    assert status == 200, tokens
    from transformers import AutoTokenizer

    text = AutoTokenizer.from_pretrained(s.checkpoint).decode(tokens["tokens"])
    assert text.endswith("<|start|>assistant<|channel|>analysis<|message|>assistant: "), text
    reply = s.client.completions.create(
        model=NAME, prompt=text, max_tokens=max_tokens, temperature=0
    )
    return reply.choices[0].text


def no_markers(*texts: str) -> bool:
    """No marker, and none of the words they leave where they are dropped."""
    return not any(m in t for t in texts for m in ("<|", "|>", "assistantfinal"))


def test_analysis_is_reasoning_content_and_final_is_content(harmony: Server) -> None:
    budget = 8
    reply = chat(harmony, extra_body={"reasoning_budget": budget})
    message = reply.choices[0].message
    thought = message.model_extra["reasoning_content"]
    # The analysis body holds exactly the budget's tokens; the final body follows the close.
    assert thought == completion(harmony, budget), (thought, message.content)
    assert message.content and no_markers(thought, message.content), message
    assert reply.choices[0].finish_reason in ("stop", "length")

    # Streamed: reasoning_content deltas, then content deltas, the same text.
    parts, order = streamed_parts(
        chat(harmony, stream=True, extra_body={"reasoning_budget": budget})
    )
    assert parts == {"reasoning_content": thought, "content": message.content}
    assert order == sorted(order, key=lambda k: k == "content")  # analysis streams first

    # The server's --reasoning-budget (6) when the request names none.
    default = chat(harmony).choices[0].message.model_extra["reasoning_content"]
    assert default == completion(harmony, 6)


def test_a_json_schema_binds_only_to_the_final_body(harmony: Server) -> None:
    assert_the_schema_binds_after_the_reasoning(harmony, max_tokens=80)


def test_with_tools_a_reply_without_calls_is_its_channels(harmony: Server) -> None:
    """With tools active a harmony reply is still split by channel, whole and streamed; a final
    body is content, not a call (calls are messages to functions.NAME: tests/
    test_harmony_reply.py's binding test and engine/tests/reply_splitter_test.cpp)."""
    kw = {"tools": TOOLS, "extra_body": {"reasoning_budget": 4}}
    whole = chat(harmony, **kw).choices[0]
    assert whole.finish_reason != "tool_calls" and not whole.message.tool_calls
    assert whole.message.content and no_markers(whole.message.content), whole.message
    thought = whole.message.model_extra["reasoning_content"]
    assert thought == completion(harmony, 4, tools=TOOLS)
    parts, _ = streamed_parts(chat(harmony, stream=True, **kw))
    assert parts == {"reasoning_content": thought, "content": whole.message.content}


def test_anthropic_thinking_blocks(harmony: Server) -> None:
    kw = {"model": NAME, "messages": ASK, "max_tokens": 40, "extra_body": {"temperature": 0}}
    thinking = {"type": "enabled", "budget_tokens": 8}
    got = harmony.anthropic.messages.create(thinking=thinking, **kw)
    assert [b.type for b in got.content] == ["thinking", "text"]
    openai_reply = chat(harmony, extra_body={"reasoning_budget": 8}).choices[0].message
    assert got.content[0].thinking == openai_reply.model_extra["reasoning_content"]
    assert got.content[1].text == openai_reply.content

    # Streamed: a thinking block (index 0) of thinking_delta events, then the text block.
    with harmony.anthropic.messages.stream(thinking=thinking, **kw) as stream:
        events = [e for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert {(e.index, e.delta.type) for e in events} == {(0, "thinking_delta"), (1, "text_delta")}
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in got.content]

    # Disabled: the analysis body is closed at once, so there is no thinking block.
    off = harmony.anthropic.messages.create(thinking={"type": "disabled"}, **kw)
    assert [b.type for b in off.content] == ["text"] and no_markers(off.content[0].text)


def test_the_python_api_reads_harmony_alike(edgellm_package: Any, harmony_checkpoint: Path) -> None:
    """LLM.chat splits by the engine's ReplySplitter, as the servers do."""
    edgellm = edgellm_package
    llm = edgellm.load(str(harmony_checkpoint), threads=2, max_context=512)
    reply = llm.chat(ASK, max_tokens=30, reasoning_budget=6)
    message = reply["choices"][0]["message"]
    m = llm.model
    prompt = edgellm.encode_conversation(
        m.tokenizer, m.chat_template, [("user", ASK[0]["content"])]
    )
    alone = "".join(edgellm.generate(edgellm.Context(m), prompt, max_tokens=6))
    assert message["reasoning_content"] == alone
    assert message["content"] and no_markers(message["reasoning_content"], message["content"])
    assert reply["choices"][0]["finish_reason"] == "stop"
    parts, _ = streamed_parts(llm.chat(ASK, max_tokens=30, reasoning_budget=6, stream=True))
    assert parts == {"reasoning_content": alone, "content": message["content"]}


def test_the_binding_reads_harmony_calls(edgellm_package: Any) -> None:
    """The ReplySplitter the replicas and LLM.chat hold: a message to functions.NAME is a call
    of an active tool, and only the calls wait for the end."""
    eg = edgellm_package
    tools = eg.Tools.parse(tools=json.dumps(TOOLS), tool_choice="", parallel_tool_calls="")
    split = eg.ReplySplitter((True, False, -1, True))
    assert not split.holds_content(tools)
    text = (
        "<|channel|>analysis<|message|>Weather.<|end|><|start|>assistant<|channel|>commentary"
        ' to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'
    )
    assert split.feed(text[:40]) == ("Weather.", "")
    assert split.feed(text[40:], True) == ("", "")
    content, calls = split.end("", tools)
    assert content == "" and [(n, a) for _, n, a in calls] == [("get_weather", '{"city":"Paris"}')]
    # A <think> template's reply is held and parsed whole; with no reasoning rules, plain content.
    assert eg.ReplySplitter((True, True, -1, False)).holds_content(tools)
    plain = eg.ReplySplitter(None)
    assert plain.feed("<|end|>x", True) == ("", "<|end|>x")
    assert plain.end("x", eg.Tools.parse(tools="", tool_choice="", parallel_tool_calls="")) is None
