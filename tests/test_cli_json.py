"""`edgellm run` / `chat` with structured output: -j/--json-schema (JSON text or a file) and
--json-object constrain the answer as response_format does on the servers; a schema the
engine cannot enforce, a malformed one or an unreadable file is one `error:` line, exit 2,
before the model loads.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import jsonschema
import pytest
from conftest import assert_one_line_error, edgellm_cmd

pytestmark = pytest.mark.usefixtures("smollm2_run")

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 30},
        "country": {"type": "string", "maxLength": 30},
        "population": {"type": "integer", "minimum": 0},
        "capital": {"type": "boolean"},
    },
    "required": ["city", "country", "population", "capital"],
}


def run(*args: str, sub: str = "run", stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*edgellm_cmd(sub), "--threads", "2", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.mark.parametrize("as_file", [False, True])
def test_answer_validates_against_the_schema(tmp_path: Path, as_file: bool) -> None:
    path = tmp_path / "city.json"
    path.write_text(json.dumps(SCHEMA, indent=2))
    schema_arg = str(path) if as_file else json.dumps(SCHEMA)
    proc = run("-p", "Describe Paris.", "-n", "80", "--json-schema", schema_arg)
    assert proc.returncode == 0, proc.stderr
    answer = proc.stdout.strip()
    jsonschema.validate(json.loads(answer), SCHEMA)
    assert answer.startswith('{"city"'), answer  # declared order
    assert "(ended with the JSON document)" in proc.stderr  # not --n-tokens


def test_short_flag_sampled_and_json_figures() -> None:
    schema = {"enum": ["red", "green", "blue"]}
    proc = run("-p", "Pick a colour.", "-j", json.dumps(schema), "--temp", "0.9", "-s", "4",
               "--json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(proc.stdout)
    jsonschema.validate(json.loads(figures["answer"]), schema)
    assert figures["stopped_at_document_end"] and not figures["stopped_at_stop_string"]


def test_json_object() -> None:
    proc = run("-p", "Describe a cat (name, age) as a JSON object.", "-n", "100",
               "--json-object")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert isinstance(json.loads(proc.stdout), dict), proc.stdout


def test_chat_replies_are_constrained() -> None:
    proc = run("-n", "60", "--json-schema", json.dumps(SCHEMA), sub="chat",
               stdin="Describe Paris.\nAnd Rome?\n")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    replies = [t.strip() for t in proc.stdout.split("> ")[1:] if t.strip()]
    assert len(replies) == 2, proc.stdout
    for reply in replies:
        jsonschema.validate(json.loads(reply), SCHEMA)


@pytest.mark.parametrize(
    "schema,needle",
    [
        ({"type": "string", "pattern": "^a+$"}, "'pattern'"),
        ({"type": "number", "minimum": 1}, "'minimum'"),
        ({"oneOf": [{"type": "string"}, {"type": "null"}]}, "'oneOf'"),
    ],
)
def test_refused_schema_is_one_error_line(schema: dict, needle: str) -> None:
    proc = run("--json-schema", json.dumps(schema))
    assert_one_line_error(proc, "--json-schema", needle, "cannot enforce", code=2)


def test_malformed_and_missing_files_are_one_error_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"type": "object", "properties": {')
    assert_one_line_error(run("--json-schema", str(bad)), "parse error", code=2)
    assert_one_line_error(run("--json-schema", '{"type": '), "parse error", code=2)
    missing = tmp_path / "missing.json"
    assert_one_line_error(run("--json-schema", str(missing)), str(missing), code=2)


def test_schema_and_json_object_exclude_each_other() -> None:
    proc = run("--json-schema", "{}", "--json-object")
    assert_one_line_error(proc, "--json-object", code=2)
