"""Every real chat template in tests/data/chat_templates (its source in SOURCES.md) over
many conversations, through our interpreter (edgellm_py.render_jinja) and through
transformers' jinja2 environment: the text must be byte-identical, a raise_exception the
same message, and a failure on one side a failure on the other. Then the mutants of
engine/src/jinja/fault_injection.h: each one must make this comparison fail."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from jinja_reference import outcome, render_ours, render_reference, same

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
CORPUS = sorted(TEMPLATES.glob("*.jinja"))

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
            "required": ["query"],
        },
    },
}
CALL = {
    "id": "call_0",
    "type": "function",
    "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}},
}
CALL_STR = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "search", "arguments": '{"query": "jinja2", "limit": 3}'},
}

SYS = {"role": "system", "content": "You are a helpful assistant."}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str, **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": text, **extra}


def long_chat(turns: int) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [SYS]
    for k in range(turns):
        msgs.append(user(f"Question {k}: what is {k} squared?"))
        msgs.append(assistant(f"{k} squared is {k * k}."))
    return msgs


# (name, messages, tools, add_generation_prompt, extra kwargs)
CONVERSATIONS: list[tuple[str, list[dict[str, Any]], Any, bool, dict[str, Any]]] = [
    ("user_only", [user("Hello!")], None, True, {}),
    ("system_user", [SYS, user("Hi, who are you?")], None, True, {}),
    (
        "multi_turn",
        [SYS, user("Name a color."), assistant("Blue."), user("Another one?")],
        None,
        True,
        {},
    ),
    (
        "no_system_no_prompt",
        [user("2+2?"), assistant("4"), user("3+3?"), assistant("6")],
        None,
        False,
        {},
    ),
    ("tools_offered", [SYS, user("Weather in Paris?")], [WEATHER, SEARCH], True, {}),
    (
        "tool_round_trip",
        [
            user("Weather in Paris?"),
            assistant("", tool_calls=[CALL]),
            {"role": "tool", "tool_call_id": "call_0", "name": "get_weather", "content": "18 C"},
            assistant("It is 18 °C in Paris."),
        ],
        [WEATHER],
        False,
        {},
    ),
    (
        "tool_result_pending",
        [
            SYS,
            user("Find jinja2 docs."),
            assistant(None, tool_calls=[CALL_STR]),
            {"role": "tool", "tool_call_id": "call_1", "name": "search", "content": '["a", "b"]'},
        ],
        [SEARCH],
        True,
        {},
    ),
    (
        "thinking_off",
        [user("Think about 7*6."), assistant("42", reasoning_content="7*6 is 42")],
        None,
        True,
        {"enable_thinking": False},
    ),
    (
        "thinking_on",
        [SYS, user("Why is the sky blue?")],
        None,
        True,
        {"enable_thinking": True},
    ),
    (  # a reasoning reply sent back mid tool round (Qwen3 lays out the block after the query)
        "thinking_tool_round",
        [
            user("Find jinja2 docs."),
            assistant("", reasoning_content="I should search.", tool_calls=[CALL_STR]),
            {"role": "tool", "tool_call_id": "call_1", "name": "search", "content": '["a"]'},
        ],
        [SEARCH],
        True,
        {},
    ),
    (
        "unicode_whitespace",
        [user("  Grüße, 世界! 🎉\n\n"), assistant("\nBonjour — “quotes” ‘here’  "), user("ok")],
        None,
        True,
        {},
    ),
    ("twenty_turns", long_chat(20) + [user("And 20?")], None, True, {}),
    ("not_alternating", [user("one"), user("two")], None, True, {}),
    ("system_only", [SYS], None, False, {}),
]


def context(messages: Any, tools: Any, add_generation_prompt: bool, extra: dict) -> dict:
    """What transformers' apply_chat_template hands the template."""
    return {
        "messages": copy.deepcopy(messages),
        "tools": copy.deepcopy(tools),
        "documents": None,
        "add_generation_prompt": add_generation_prompt,
        "bos_token": "<s>",
        "eos_token": "</s>",
        **extra,
    }


def compare(binding: Any, path: Path, fault: str = "none") -> tuple[list[str], int]:
    """The conversations where ours differs from jinja2, and how many rendered text."""
    source = path.read_text()
    diffs, texts = [], 0
    for name, messages, tools, gen, extra in CONVERSATIONS:
        ctx = context(messages, tools, gen, extra)
        ref = outcome(render_reference, source, ctx)
        ours = outcome(render_ours, binding, source, ctx, fault)
        texts += ref[0] == "text"
        if not same(ref, ours):
            diffs.append(f"{path.name} / {name}:\n  jinja2: {ref!r:.600}\n  ours:   {ours!r:.600}")
    return diffs, texts


def test_corpus_is_sourced() -> None:
    """Every template names where it came from, and the corpus is not trivially small."""
    sources = (TEMPLATES / "SOURCES.md").read_text()
    assert len(CORPUS) >= 20
    missing = [p.name for p in CORPUS if p.name not in sources]
    assert not missing, f"templates without a recorded source: {missing}"


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_template_matches_jinja2(binding: Any, path: Path) -> None:
    diffs, _ = compare(binding, path)
    assert not diffs, "\n".join(diffs)


def test_corpus_renders_text(binding: Any) -> None:
    """The comparison is mostly over rendered text, not over errors on both sides."""
    texts = sum(compare(binding, path)[1] for path in CORPUS)
    pairs = len(CORPUS) * len(CONVERSATIONS)
    assert texts >= 0.6 * pairs, f"jinja2 rendered text for only {texts} of {pairs} pairs"


@pytest.mark.parametrize("fault", ["loop_last_off_by_one", "ignore_lstrip_blocks"])
def test_mutant_fails_the_comparison(binding: Any, fault: str) -> None:
    """A bug injected into the interpreter makes some template differ from jinja2."""
    caught = [d for path in CORPUS for d in compare(binding, path, fault)[0]]
    assert caught, f"mutant {fault} rendered every template like jinja2: the test cannot see it"
