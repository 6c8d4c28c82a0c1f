"""Hostile chat templates (issue 38): a template comes inside a downloaded model (GGUF
metadata, tokenizer_config.json), so every resource it drives is budgeted (Limits in
engine/include/edgellm/jinja.h: output bytes, live bytes, work in bytes touched, steps,
value nesting, source size) and checked before the allocation or work it guards.

* Each hostile template, rendered by the binding's render_jinja in a fresh process: one
  TemplateError naming the limit it breaches, within seconds, with the process's peak RSS
  growing by at most 256 MB (VmHWM, reset before the render, less VmRSS before it).
* The same templates as a tiny GGUF's tokenizer.chat_template: `edgellm run` prints one
  `error:` line naming the file's template and the limit; `edgellm serve` answers each with
  a 400 and stays up (/health, a plain completion). A template beyond the source budget is
  refused when the model loads, naming the file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, assert_one_line_error, edgellm_cmd

RSS_BUDGET = 256 << 20  # issue 38's target: no hostile input grows RSS by more than this
# Every case ends in about a second on a quiet machine (steps and work are sized for it);
# this bound leaves room for a loaded CI machine and still catches a hang.
SECONDS = 20

# (name, template, what the error must say). The first eight are issue 38's findings.
CASES = [
    ("str_repeat_overflow", "{{ 'aaaa' * 4611686018427387904 }}", "-byte output budget"),
    ("list_repeat_overflow", "{{ [1, 2] * 4611686018427387904 }}", "-byte allocation budget"),
    (
        "nested_ranges",
        "{% for i in range(3000) %}{% for j in range(3000) %}{% set x = i %}"
        "{% endfor %}{% endfor %}",
        "-step work budget",
    ),
    ("tojson_indent", "{{ messages|tojson(indent=1500000000) }}", "-byte output budget"),
    ("indent_width", "{{ 'a\\nb'|indent(1500000000) }}", "-byte output budget"),
    (
        "huge_indent_string_times_list",
        "{% set pad = ' ' * 8000000 %}{{ [[1, 2], [3, 4]]|tojson(indent=pad) }}",
        "-byte output budget",
    ),
    (
        "compare_16mb_loop",
        "{% set s = 'a' * 16000000 %}{% set t = 'a' * 16000000 %}"
        "{% for i in range(100000) %}{% if s == t %}{% endif %}{% endfor %}",
        "-byte work budget",
    ),
    (
        "output_16mb",
        "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
        "-byte output budget",
    ),
    (
        "huge_indent_string_lines",
        "{% set pad = ' ' * 8000000 %}{{ ('x\\n' * 100)|indent(pad) }}",
        "-byte output budget",
    ),
    (
        "macro_per_iteration",
        "{% for i in range(3000) %}{% for j in range(3000) %}{% macro m() %}{% endmacro %}"
        "{% endfor %}{% endfor %}",
        "-byte allocation budget",
    ),
    ("split_flood", "{{ ('a,' * 8000000).split(',')|length }}", "-byte allocation budget"),
    ("iterate_16mb_string", "{% for c in 'a' * 16000000 %}{% endfor %}", "-byte allocation budget"),
    ("quadratic_search", "{{ ('a' * 8000000 + 'b') in ('a' * 16000000) }}", "-byte work budget"),
    (
        "copies_in_a_loop",
        "{% set s = 'a' * 16000000 %}{% set ns = namespace(n=0) %}"
        "{% for i in range(100000) %}{% set ns.n = ns.n + (s|length) %}{% endfor %}",
        "-byte work budget",
    ),
    (
        "deep_value",
        "{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}"
        "{% endfor %}",
        "levels deep",
    ),
    (
        "many_live_strings",
        "{{ (range(100000)|map('string')|map('indent', ' ' * 1000, true)|list)|length }}",
        "-byte allocation budget",
    ),
    (
        "nested_macro_buffers",
        "{% macro f(n) %}{{ 'x' * 15000000 }}{% if n > 0 %}{{ f(n - 1) }}{% endif %}"
        "{% endmacro %}{{ f(150) }}",
        "-byte allocation budget",
    ),
    (
        "nested_list_repr",
        "{% set s = 'x' * 4000000 %}{% set ns = namespace(x=s) %}{% for i in range(150) %}"
        "{% set ns.x = [s, ns.x] %}{% endfor %}{{ ns.x }}",
        "-byte allocation budget",
    ),
    ("namespace_cycle", "{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}", "levels deep"),
    ("repr_of_copies", "{% set s = 'a' * 1000000 %}{{ [s] * 100 }}", "-byte output budget"),
    ("percent_width", "{{ ('%1048576s' * 20) % ((1,) * 20) }}", "-byte output budget"),
]
# Refused before any render: the parse's own budget.
PARSE_CASES = [
    ("source_too_big", "{{ a }}" * 50000, "-byte source budget"),
    ("parse_nesting", "{{ " + "(" * 300 + "1" + ")" * 300 + " }}", "nested too deeply"),
]

# Renders one template in this fresh process and reports its outcome, time and the growth
# of the peak RSS over the RSS before the render (the peak reset by clear_refs).
PROBE = r"""
import json, sys, time
import edgellm_py

def status_bytes(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)

case = json.loads(sys.stdin.read())
edgellm_py.render_jinja("{{ 1 }}", "{}")  # the binding's own start-up is not the template's
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # resets VmHWM to the current RSS
before = status_bytes("VmRSS")
start = time.monotonic()
try:
    edgellm_py.render_jinja(case["template"], json.dumps(case["context"]))
    outcome, message = "text", ""
except edgellm_py.TemplateError as e:
    outcome, message = "error", str(e)
print(json.dumps({"outcome": outcome, "message": message,
                  "seconds": time.monotonic() - start,
                  "rss_growth": status_bytes("VmHWM") - before}))
"""

CONTEXT = {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": True}


def probe(template: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "build" / "python")}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE],
        input=json.dumps({"template": template, "context": CONTEXT}),
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr  # no crash, no std::bad_alloc
    return json.loads(proc.stdout)


@pytest.mark.parametrize(("name", "template", "needle"), CASES + PARSE_CASES)
def test_hostile_template_is_refused_within_its_budget(
    name: str, template: str, needle: str, binding: Any
) -> None:
    got = probe(template)
    assert got["outcome"] == "error", f"{name}: rendered instead of refused"
    assert needle in got["message"], got["message"]
    assert got["seconds"] < SECONDS, f"{name}: {got['seconds']:.1f} s"
    assert got["rss_growth"] <= RSS_BUDGET, f"{name}: peak RSS +{got['rss_growth'] >> 20} MB"


def test_a_real_conversation_renders_within_the_budget(binding: Any) -> None:
    """The other side of the budgets: the largest corpus template, with a conversation of
    500 turns of 2 KB each (about a 256K-token context), renders."""
    source = (REPO / "tests/data/chat_templates/openai-gpt-oss-120b.jinja").read_text()
    turns = [
        {"role": "user" if k % 2 == 0 else "assistant", "content": f"turn {k} " + "x" * 2000}
        for k in range(500)
    ]
    text = binding.render_jinja(source, json.dumps({"messages": turns}), now=0)
    assert text.count("x" * 2000) == 500


# ------------------------------------------------------------- inside a model file


def dispatch_template() -> str:
    """One template holding every hostile case, picked by the last message's content (so one
    model file and one server serve them all); any other content renders as ChatML."""
    branches = "".join(
        f"{{%- {'if' if k == 0 else 'elif'} case == '{name}' -%}}{template}"
        for k, (name, template, _) in enumerate(CASES)
    )
    chatml = "{{ '<|im_start|>user\\n' + case + '<|im_end|>\\n<|im_start|>assistant\\n' }}"
    head = "{%- set case = messages[-1]['content'] -%}"
    return f"{head}{branches}{{%- else -%}}{chatml}{{%- endif -%}}"


@pytest.fixture(scope="module")
def hostile_gguf(tmp_path_factory: pytest.TempPathFactory, family_fixture: Any) -> Path:
    from test_gguf_only import write_fixture_gguf

    out = tmp_path_factory.mktemp("hostile") / "model.gguf"
    write_fixture_gguf(
        family_fixture("llama-tiny"), "llama-tiny", out, chat_template=dispatch_template()
    )
    return out


def run_cli(model: Path, prompt: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*edgellm_cmd("run"), "--model", str(model), "--prompt", prompt, "--n-tokens", "1"]
        + ["--threads", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(("name", "needle"), [(n, k) for n, _, k in CASES])
def test_cli_refuses_a_hostile_gguf_template(
    name: str, needle: str, hostile_gguf: Path, edgellm_bin: Path
) -> None:
    start = time.monotonic()
    proc = run_cli(hostile_gguf, name)
    assert time.monotonic() - start < SECONDS + 10
    assert_one_line_error(
        proc, f"{hostile_gguf}: metadata 'tokenizer.chat_template'", needle, code=2
    )


def test_cli_runs_the_same_gguf_on_a_benign_prompt(hostile_gguf: Path, edgellm_bin: Path) -> None:
    proc = run_cli(hostile_gguf, "hello")
    assert proc.returncode == 0, proc.stderr


def test_template_beyond_the_source_budget_is_refused_at_load(
    tmp_path: Path, family_fixture: Any, edgellm_bin: Path
) -> None:
    from test_gguf_only import write_fixture_gguf

    path = tmp_path / "model.gguf"
    write_fixture_gguf(
        family_fixture("llama-tiny"), "llama-tiny", path, chat_template=PARSE_CASES[0][1]
    )
    proc = run_cli(path, "hello")
    assert_one_line_error(
        proc, f"{path}: metadata 'tokenizer.chat_template'", "source budget", code=2
    )


def test_source_budget_is_a_load_time_refusal(tmp_path: Path, engine_binding: Any) -> None:
    """Beyond a parse budget the model file itself is refused (a template that merely fails
    to parse still loads: completions work, chat requests get the error)."""
    from test_gguf_only import finish, gguf_writer

    for name, template, needle in PARSE_CASES:
        path = tmp_path / f"{name}.gguf"
        writer = gguf_writer(path, "llama")
        writer.add_chat_template(template)
        finish(writer)
        with pytest.raises(engine_binding.Error, match=needle):
            engine_binding.ChatTemplate.from_gguf(str(path))
    unsupported = tmp_path / "unsupported.gguf"
    writer = gguf_writer(unsupported, "llama")
    writer.add_chat_template("{% include 'other.jinja' %}")
    finish(writer)
    assert engine_binding.ChatTemplate.from_gguf(str(unsupported)).available()


def post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_server_answers_400_and_stays_up(hostile_gguf: Path, edgellm_bin: Path) -> None:
    from test_server import Server

    server = Server(hostile_gguf, kind="cpp", max_context=128)
    try:
        model = json.loads(server.get("/v1/models")[1])["data"][0]["id"]
        for name, _, needle in CASES:
            status, reply = post(
                server.url + "/v1/chat/completions",
                {"model": model, "messages": [{"role": "user", "content": name}], "max_tokens": 1},
            )
            assert status == 400, (name, reply)
            assert needle in reply["error"]["message"], reply
            assert server.get("/health")[0] == 200
        status, reply = post(
            server.url + "/v1/completions", {"model": model, "prompt": "Hi", "max_tokens": 2}
        )
        assert status == 200, reply
    finally:
        assert server.stop() == 0
