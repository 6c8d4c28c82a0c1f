"""Our C++ tokenizer and chat templates against HF tokenizers / transformers.

Why: the verify gate feeds both engines the same prompt, so our token ids must equal HF's
for every input, and decode must give back HF's text. Per checkpoint under
$EDGELLM_MODELS (or models/): encode over tests/data/tokenizer_corpus.txt vs
tokenizers.Tokenizer (no specials) and AutoTokenizer (with specials), decode vs
AutoTokenizer.decode, and chat-template rendering and ids vs apply_chat_template. The
template families are also checked on a tiny byte-level tokenizer built here, so they are
covered without any checkpoint. Needs the binding: cmake --build build --target edgellm_py.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "build" / "python"))

# Required, never skipped: a missing package or an unbuilt binding fails the suite.
import edgellm_py  # noqa: E402
import tokenizers  # noqa: E402
import transformers  # noqa: E402

STORE = Path(os.environ.get("EDGELLM_MODELS") or REPO / "models")
CHECKPOINTS = ["smollm2-135m-instruct", "gemma3-270m"]
CORPUS_FILE = REPO / "tests" / "data" / "tokenizer_corpus.txt"
PROMPTS_FILE = REPO / "llms" / "verify" / "prompts" / "instruct.txt"
FALLBACK_PROMPTS = [
    "What is the capital of France?",
    "Explain why the sky is blue.",
    "Write a haiku about autumn.",
    "  Leading and trailing spaces  ",
    "Line one\nLine two\n\nLine four",
    "Translate 'good morning' into Spanish, French and German.",
    "Compute 12345 * 6789 and show your steps.",
    "日本語で自己紹介してください。🤗",
]
MAX_REPORTED = 10


def unescape(line: str) -> str:
    """Corpus lines are one string each; \\n \\t \\r \\\\ \\uXXXX spell what a line can't hold."""
    out, i = [], 0
    simple = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}
    while i < len(line):
        c = line[i]
        if c == "\\" and i + 1 < len(line):
            n = line[i + 1]
            if n in simple:
                out.append(simple[n])
                i += 2
                continue
            if n == "u" and i + 6 <= len(line):
                out.append(chr(int(line[i + 2 : i + 6], 16)))
                i += 6
                continue
        out.append(c)
        i += 1
    return "".join(out)


CORPUS = [
    unescape(line) for line in CORPUS_FILE.read_text(encoding="utf-8").split("\n") if line != ""
]


def load_prompts() -> list[str]:
    if not PROMPTS_FILE.exists():
        return FALLBACK_PROMPTS
    lines = PROMPTS_FILE.read_text(encoding="utf-8").splitlines()
    return [ln for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


@functools.cache
def hf_auto(path: str):
    return transformers.AutoTokenizer.from_pretrained(path)


@functools.cache
def hf_raw(path: str):
    return tokenizers.Tokenizer.from_file(str(Path(path) / "tokenizer.json"))


def show_ids(tok, ids: list[int]) -> str:
    return f"{ids} {[tok.convert_ids_to_tokens(i) for i in ids]}"


def diff_ids(kind: str, text: str, ours: list[int], theirs: list[int], tok) -> str:
    first = next(
        (i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b),
        min(len(ours), len(theirs)),
    )
    return (
        f"{kind} {text!r}: first difference at index {first}\n"
        f"    ours {show_ids(tok, ours)}\n"
        f"    HF   {show_ids(tok, theirs)}"
    )


def diff_text(kind: str, source: str, ours: str, theirs: str) -> str:
    return f"{kind} {source}:\n    ours {ours!r}\n    HF   {theirs!r}"


def check(mismatches: list[str], compared: int, what: str) -> None:
    print(f"{what}: {compared} compared, {len(mismatches)} mismatches")
    if mismatches:
        shown = "\n".join(mismatches[:MAX_REPORTED])
        pytest.fail(f"{len(mismatches)}/{compared} {what} differ from HF:\n{shown}")


@pytest.fixture(params=CHECKPOINTS)
def checkpoint(request) -> str:
    path = STORE / request.param
    if not (path / "tokenizer.json").exists():
        pytest.skip(f"{request.param}: no tokenizer.json under {STORE} (scripts fetch it)")
    return str(path)


# --- checkpoints -------------------------------------------------------------------------


def test_encode_matches_hf(checkpoint):
    ours = edgellm_py.Tokenizer.load(checkpoint)
    raw, auto = hf_raw(checkpoint), hf_auto(checkpoint)
    mismatches = []
    for text in CORPUS + [""]:
        got, want = ours.encode(text, False), raw.encode(text, add_special_tokens=False).ids
        if got != want:
            mismatches.append(diff_ids("encode", text, got, want, auto))
        got, want = ours.encode(text, True), auto(text, add_special_tokens=True)["input_ids"]
        if got != want:
            mismatches.append(diff_ids("encode+specials", text, got, want, auto))
    check(mismatches, 2 * (len(CORPUS) + 1), f"{Path(checkpoint).name} encodings")


def test_decode_matches_hf(checkpoint):
    ours = edgellm_py.Tokenizer.load(checkpoint)
    auto = hf_auto(checkpoint)
    mismatches, compared = [], 0
    for text in CORPUS:
        ids = auto(text, add_special_tokens=True)["input_ids"]
        for skip in (False, True):
            got, want = ours.decode(ids, skip), auto.decode(ids, skip_special_tokens=skip)
            compared += 1
            if got != want:
                mismatches.append(diff_text(f"decode(skip={skip})", repr(text), got, want))
    # Ids no text produces: every byte token alone, and ids past the vocabulary.
    singles = [[i] for i in range(min(ours.vocab_size(), 600))]
    singles += [[ours.vocab_size() + 5], list(range(0, 300, 7))]
    for ids in singles:
        for skip in (False, True):
            got, want = ours.decode(ids, skip), auto.decode(ids, skip_special_tokens=skip)
            compared += 1
            if got != want:
                mismatches.append(diff_text(f"decode(skip={skip})", str(ids), got, want))
    check(mismatches, compared, f"{Path(checkpoint).name} decodes")


def test_vocab_and_lookup(checkpoint):
    ours = edgellm_py.Tokenizer.load(checkpoint)
    auto = hf_auto(checkpoint)
    assert ours.vocab_size() >= len(auto)
    for token, want in list(auto.get_vocab().items())[:2000] + [
        (t, auto.convert_tokens_to_ids(t)) for t in auto.all_special_tokens
    ]:
        assert ours.token_to_id(token) == want, token
    assert ours.token_to_id("this is surely not a token \x00") == -1


def chat_cases(prompts: list[str]) -> list[list[tuple[str, str]]]:
    cases = [[("user", p)] for p in prompts]
    turns = [
        ("user", prompts[0]),
        ("assistant", "Paris is the capital of France."),
        ("user", "And of Italy?"),
        ("assistant", " Rome.\n"),
        ("user", prompts[-1]),
    ]
    cases.append(turns)
    cases.append([("system", "You are a terse assistant. Answer in one line.")] + turns)
    return cases


def compare_chat(path: str, cases: list[list[tuple[str, str]]]) -> tuple[list[str], int]:
    ours_t = edgellm_py.Tokenizer.load(path)
    ours_c = edgellm_py.ChatTemplate.load(path)
    auto = hf_auto(path)
    mismatches, compared = [], 0
    for msgs in cases:
        messages = [{"role": r, "content": c} for r, c in msgs]
        for gen in (True, False):
            compared += 1
            try:
                want = auto.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
            except Exception as e:  # the template raised (e.g. system role unsupported)
                with pytest.raises(edgellm_py.Error):
                    ours_c.render(msgs, gen)
                print(f"HF and ours both reject {msgs[0][0]}-first conversation: {e}")
                continue
            got = ours_c.render(msgs, gen)
            if got != want:
                mismatches.append(diff_text(f"render(gen={gen})", str(msgs)[:80], got, want))
                continue
            want_ids = list(
                auto.apply_chat_template(messages, tokenize=True, add_generation_prompt=gen)
            )
            got_ids = ours_t.encode(got, False)
            if got_ids != want_ids:
                mismatches.append(diff_ids("chat ids", got, got_ids, want_ids, auto))
    return mismatches, compared


def test_chat_template_matches_hf(checkpoint):
    auto = hf_auto(checkpoint)
    ours = edgellm_py.ChatTemplate.load(checkpoint)
    if auto.chat_template is None:
        assert not ours.available()
        pytest.skip(f"{Path(checkpoint).name} has no chat template (HF neither)")
    assert ours.available(), "HF has a chat template, ours found none"
    mismatches, compared = compare_chat(checkpoint, chat_cases(load_prompts()))
    check(mismatches, compared, f"{Path(checkpoint).name} chat renders ({ours.name()})")


def test_long_prompt_matches_hf(checkpoint):
    """A 2,000-token prompt tokenizes to HF's ids. Its timing is printed, not asserted:
    performance claims come from benchmarks, not timed tests on a shared machine."""
    counter = edgellm_py.Tokenizer.load(checkpoint)
    lines, text = iter(CORPUS * 100), ""
    while len(counter.encode(text, False)) < 2000:
        text += "".join(next(lines) + "\n" for _ in range(10))
    # HF's encoder leaves worker threads spinning for a moment; on a 2-core machine they
    # would be timed too, so HF runs after ours and each cold run gets a fresh tokenizer.
    cold = []
    for _ in range(3):
        fresh = edgellm_py.Tokenizer.load(checkpoint)  # empty word caches
        cold.append(_timed(fresh.encode, text, False))
    warm = min(_timed(fresh.encode, text, False) for _ in range(5))
    ids = fresh.encode(text, False)
    auto = hf_auto(checkpoint)
    hf_time = min(_timed(auto, text, add_special_tokens=False) for _ in range(3))
    print(
        f"{Path(checkpoint).name}: {len(ids)} tokens, ours {min(cold) * 1e3:.1f} ms cold / "
        f"{warm * 1e3:.1f} ms warm, HF {hf_time * 1e3:.1f} ms"
    )
    assert ids == auto(text, add_special_tokens=False)["input_ids"]


def _timed(fn, *args, **kwargs) -> float:
    t0 = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - t0


# --- template families on a tiny tokenizer -----------------------------------------------

SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# The same with escaped newlines, as tokenizer_config.json files often spell it.
CHATML_ESCAPED_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + "
    "messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou "
    "are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}{%- for message in messages %}{%- if not (message.role == 'system' and "
    "loop.first) %}{{- '<|im_start|>' + message.role + '\\n' + message.content + "
    "'<|im_end|>' + '\\n' }}{%- endif %}{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
PLAIN_CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
GEMMA3_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""
GEMMA2_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role "
    "not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == "
    "'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must "
    "alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == "
    "'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + "
    "'<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{'<start_of_turn>model\n'}}{% endif %}"
)
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
LLAMA32_TEMPLATE = """{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message #}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}

{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+
        message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""
# Llama 3.1 pins the date instead of asking for today's.
LLAMA31_TEMPLATE = LLAMA32_TEMPLATE.replace(
    """{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}""",
    '{%- if not date_string is defined %}\n    {%- set date_string = "26 Jul 2024" %}\n'
    "{%- endif %}",
)
FAMILIES = {
    "smollm2": (SMOLLM2_TEMPLATE, "chatml", None),
    "qwen-style": (CHATML_ESCAPED_TEMPLATE, "chatml", None),
    "plain-chatml": (PLAIN_CHATML_TEMPLATE, "chatml", None),
    "gemma3": (GEMMA3_TEMPLATE, "gemma", "<bos>"),
    "gemma2": (GEMMA2_TEMPLATE, "gemma", "<bos>"),
    "llama3": (LLAMA3_TEMPLATE, "llama3", "<|begin_of_text|>"),
    "llama3.1": (LLAMA31_TEMPLATE, "llama3", "<|begin_of_text|>"),
    "llama3.2": (LLAMA32_TEMPLATE, "llama3", "<|begin_of_text|>"),
}
SPECIALS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<bos>", "<eos>", "<start_of_turn>",
    "<end_of_turn>", "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
    "<|eot_id|>",
]  # fmt: skip


def tiny_tokenizer_dir(path: Path, config: dict) -> Path:
    """A byte-level BPE with no merges: one token per byte, plus the families' specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    base = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
    (path / "tokenizer_config.json").write_text(json.dumps(base | config), encoding="utf-8")
    return path


@pytest.mark.parametrize("family", FAMILIES)
def test_template_family_matches_hf(tmp_path, family):
    template, style, bos = FAMILIES[family]
    config = {"chat_template": template}
    if bos:
        config["bos_token"] = bos
    path = str(tiny_tokenizer_dir(tmp_path / family, config))
    assert edgellm_py.ChatTemplate.load(path).name() == style
    prompts = FALLBACK_PROMPTS + ["\t tabs and spaces around \n ", ""]
    mismatches, compared = compare_chat(path, chat_cases(prompts))
    check(mismatches, compared, f"{family} template renders")


def test_template_list_and_jinja_file(tmp_path):
    """chat_template as a list of {name, template}, and chat_template.jinja taking precedence."""
    listed = [{"name": "tool_use", "template": GEMMA3_TEMPLATE},
              {"name": "default", "template": SMOLLM2_TEMPLATE}]  # fmt: skip
    path = tiny_tokenizer_dir(tmp_path / "listed", {"chat_template": listed})
    assert edgellm_py.ChatTemplate.load(str(path)).name() == "chatml"
    mismatches, compared = compare_chat(str(path), chat_cases(FALLBACK_PROMPTS[:2]))
    check(mismatches, compared, "listed template renders")

    path = tiny_tokenizer_dir(tmp_path / "jinja", {"chat_template": SMOLLM2_TEMPLATE})
    (path / "chat_template.jinja").write_text(LLAMA3_TEMPLATE, encoding="utf-8")
    assert edgellm_py.ChatTemplate.load(str(path)).name() == "llama3"


def test_no_template(tmp_path):
    path = tiny_tokenizer_dir(tmp_path / "none", {})
    ct = edgellm_py.ChatTemplate.load(str(path))
    assert not ct.available()
    with pytest.raises(edgellm_py.Error):
        ct.render([("user", "hi")], True)


def test_bad_tokenizer_files_raise(tmp_path):
    good = tiny_tokenizer_dir(tmp_path / "good", {}) / "tokenizer.json"
    text = good.read_text(encoding="utf-8")
    cases = {
        "missing": None,
        "truncated": text[: len(text) // 2],
        "empty": "",
        "not an object": "[1, 2, 3]",
        "wordpiece": json.dumps(json.loads(text) | {"model": {"type": "WordPiece", "vocab": {}}}),
        "bad merge": json.dumps(
            json.loads(text) | {"model": json.loads(text)["model"] | {"merges": ["a zz"]}}
        ),
    }
    for name, content in cases.items():
        d = tmp_path / name.replace(" ", "_")
        d.mkdir()
        if content is not None:
            (d / "tokenizer.json").write_text(content, encoding="utf-8")
        with pytest.raises(edgellm_py.Error, match="tokenizer.json") as err:
            edgellm_py.Tokenizer.load(str(d))
        print(f"{name}: {err.value}")
