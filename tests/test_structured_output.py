"""Structured output through the Python binding on SmolLM2: response_format json_object and
json_schema constrain decoding, so every reply parses and validates (jsonschema), greedy and
sampled; schemas the engine cannot enforce are refused naming the construct.

The servers' side (both the C++ one and Ray Serve, the official openai client) is in
test_server.py, on its shared `server` fixture.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

import jsonschema
import pytest
from pydantic import BaseModel, Field

MAX_TOKENS = 160


class Ingredient(BaseModel):
    name: str
    grams: int


class Recipe(BaseModel):
    """A pydantic model: its schema has $defs, $ref, titles, anyOf with null and defaults."""

    title: str
    servings: Annotated[int, Field(ge=1, le=12)]  # minimum, maximum
    vegetarian: bool
    ingredients: Annotated[list[Ingredient], Field(max_length=4)]  # maxItems
    difficulty: Literal["easy", "medium", "hard"]
    note: str | None = None


def obj(props: dict[str, Any], required: list[str] | None = None, **kw: Any) -> dict[str, Any]:
    required = list(props) if required is None else required
    return {"type": "object", "properties": props, "required": required, **kw}


STR = {"type": "string", "maxLength": 40}
INT = {"type": "integer"}

# (name, prompt, schema); schema None = {"type": "json_object"}.
SCHEMAS: list[tuple[str, str, dict[str, Any] | None]] = [
    ("json_object", "Describe a cat (name, age) as a JSON object.", None),
    ("person", "Invent a person.", obj({"name": STR, "age": INT})),
    (
        "nested_address",
        "Invent a company and its address.",
        obj({"company": STR, "address": obj({"street": STR, "city": STR, "zip": STR})}),
    ),
    (
        "string_array",
        "Name some fruits.",
        obj({"fruits": {"type": "array", "items": STR, "minItems": 2, "maxItems": 4}}),
    ),
    ("enum", "Pick a colour.", obj({"colour": {"enum": ["red", "green", "blue"]}})),
    (
        "optional_fields",
        "Describe a book.",
        obj(
            {"title": STR, "subtitle": STR, "year": INT, "isbn": STR},
            required=["title", "year"],
        ),
    ),
    (
        "number",
        "What is the weather in Paris?",
        obj({"temperature": {"type": "number"}, "unit": {"enum": ["C", "F"]}}),
    ),
    (
        "integer_array",
        "Give me some small prime numbers.",
        obj({"primes": {"type": "array", "items": INT, "minItems": 1, "maxItems": 3}}),
    ),
    (
        "boolean_and_null",
        "Is the sky blue?",
        obj(
            {"answer": {"type": "boolean"}, "caveat": {"type": ["string", "null"], "maxLength": 30}}
        ),
    ),
    (
        "any_of_scalar",
        "How many legs does a spider have?",
        obj({"legs": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 20}]}}),
    ),
    (
        "any_of_objects",
        "Describe a geometric shape.",
        {
            "anyOf": [
                obj({"kind": {"const": "circle"}, "radius": {"type": "number"}}),
                obj({"kind": {"const": "square"}, "side": {"type": "number"}}),
            ]
        },
    ),
    (
        "const",
        "Say which API version you use.",
        obj({"version": {"const": "v1"}, "ok": {"type": "boolean"}}),
    ),
    (
        "defs_ref",
        "Invent two pets.",
        {
            "$defs": {"pet": obj({"name": STR, "species": {"enum": ["cat", "dog"]}})},
            **obj({"pets": {"type": "array", "items": {"$ref": "#/$defs/pet"}, "maxItems": 2}}),
        },
    ),
    (
        "recursive_tree",
        "Show a family tree: Ann has two children, Bob and Cy; they have no children.",
        {
            "$ref": "#/definitions/node",
            "definitions": {
                "node": obj(
                    {
                        "name": STR,
                        "children": {
                            "type": "array",
                            "items": {"$ref": "#/definitions/node"},
                            "maxItems": 2,
                        },
                    },
                    required=["name"],
                )
            },
        },
    ),
    (
        "string_lengths",
        "Give a short nickname and a longer motto.",
        obj(
            {
                "nickname": {"type": "string", "minLength": 2, "maxLength": 8},
                "motto": {"type": "string", "minLength": 5, "maxLength": 60},
            }
        ),
    ),
    (
        "array_of_objects",
        "List a few cities and their countries.",
        obj(
            {
                "cities": {
                    "type": "array",
                    "items": obj({"city": STR, "country": STR}),
                    "minItems": 1,
                    "maxItems": 3,
                }
            }
        ),
    ),
    (
        "top_level_array",
        "List three animals.",
        {"type": "array", "items": STR, "minItems": 3, "maxItems": 3},
    ),
    ("top_level_string", "What is the capital of France?", {"type": "string", "maxLength": 30}),
    ("top_level_enum", "Is water wet? Answer yes or no.", {"enum": ["yes", "no"]}),
    (
        "deep_nesting",
        "Describe a university with one department and its head.",
        obj(
            {
                "university": obj(
                    {
                        "name": STR,
                        "department": obj({"name": STR, "head": obj({"name": STR, "age": INT})}),
                    }
                )
            }
        ),
    ),
    (
        "free_keys_map",
        "Give the ages of two people as a map from name to age.",
        {"type": "object", "propertyNames": {"maxLength": 40}, "additionalProperties": INT},
    ),
    (
        "type_list",
        "What is 6 times 7?",
        obj({"result": {"type": ["integer", "string"], "maxLength": 10}}),
    ),
    (
        "integer_bounds",
        "Rate this movie from 1 to 5 and give the year it came out.",
        obj(
            {
                "rating": {"type": "integer", "minimum": 1, "maximum": 5},
                "year": {"type": "integer", "exclusiveMinimum": 1900, "exclusiveMaximum": 2030},
            }
        ),
    ),
    ("pydantic_recipe", "Give me a pancake recipe.", Recipe.model_json_schema()),
]


@pytest.fixture(scope="module")
def llm(edgellm_package: Any, smollm2_checkpoint: Path) -> Any:
    return edgellm_package.load(smollm2_checkpoint, threads=2, max_context=1024)


def response_format(name: str, schema: dict[str, Any] | None) -> dict[str, Any]:
    if schema is None:
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
@pytest.mark.parametrize("name, prompt, schema", SCHEMAS, ids=[s[0] for s in SCHEMAS])
def test_every_reply_parses_and_validates(
    llm: Any, name: str, prompt: str, schema: dict[str, Any] | None, mode: str
) -> None:
    sampling = {"temperature": 0.0} if mode == "greedy" else {"temperature": 0.9, "seed": 11}
    reply = llm.chat(
        [{"role": "user", "content": prompt + " Answer in JSON."}],
        max_tokens=MAX_TOKENS,
        response_format=response_format(name, schema),
        **sampling,
    )
    choice = reply["choices"][0]
    text = choice["message"]["content"]
    assert choice["finish_reason"] == "stop", f"ran out of tokens: {text!r}"
    doc = json.loads(text)
    jsonschema.validate(doc, schema or {"type": "object"})


def test_completion_route_and_streaming_are_constrained(llm: Any) -> None:
    schema = obj({"answer": {"type": "integer"}})
    rf = response_format("answer", schema)
    reply = llm.complete("Q: What is 2 + 2?\nA:", max_tokens=40, response_format=rf)
    jsonschema.validate(json.loads(reply["choices"][0]["text"]), schema)
    chunks = llm.chat(
        [{"role": "user", "content": "What is 3 + 4?"}],
        max_tokens=40,
        response_format=rf,
        stream=True,
    )
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    jsonschema.validate(json.loads(text), schema)


def test_text_format_is_unconstrained(llm: Any) -> None:
    messages = [{"role": "user", "content": "Say hello."}]
    plain = llm.chat(messages, max_tokens=8)
    text = llm.chat(messages, max_tokens=8, response_format={"type": "text"})
    assert plain["choices"][0]["message"]["content"] == text["choices"][0]["message"]["content"]


@pytest.mark.parametrize(
    "schema, construct",
    [
        ({"type": "string", "pattern": "^[a-z]+$"}, "pattern"),
        ({"type": "string", "format": "email"}, "format"),
        ({"type": "number", "minimum": 0}, "minimum"),  # bounds: integers only
        ({"oneOf": [{"type": "string"}, {"type": "integer"}]}, "oneOf"),
        ({"allOf": [{"type": "string"}]}, "allOf"),
        (obj({"a": {"not": {"type": "null"}}}), "not"),
        ({"type": "object", "patternProperties": {"^x": {}}}, "patternProperties"),
        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
    ],
)
def test_unenforceable_schemas_are_refused_naming_the_construct(
    llm: Any, edgellm_package: Any, schema: dict[str, Any], construct: str
) -> None:
    with pytest.raises(edgellm_package.JsonSchemaError, match=f"'{construct}'"):
        llm.chat(
            [{"role": "user", "content": "Hi"}],
            max_tokens=4,
            response_format=response_format("x", schema),
        )
    with pytest.raises(ValueError, match=f"'{construct}'"):
        edgellm_package.compile_json_schema(json.dumps(schema))


def test_malformed_response_format_is_refused(edgellm_package: Any) -> None:
    for rf in [{"type": "yaml"}, {"type": "json_schema"}, {"type": "json_object", "extra": 1}]:
        with pytest.raises(ValueError, match="response_format"):
            edgellm_package.compile_response_format(json.dumps(rf))
    assert edgellm_package.compile_response_format('{"type": "text"}') is None
