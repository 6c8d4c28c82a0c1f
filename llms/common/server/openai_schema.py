"""The OpenAI-compatible API of `make serve` as data: requests, replies, errors (pydantic).

One definition, used twice: the Ray Serve ingress (llms/serve_ray/) parses requests and builds
replies with it, and the server tests (tests/test_server.py) check every reply of both servers
(edgellm_server in C++ and the Ray one) against it. The rules mirror
llms/common/server/server.cpp's: strict JSON types (a string is never coerced to a number),
the same ranges, the same `param` names in errors.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

MAX_BODY_BYTES = 1 << 20  # larger bodies get 413, as edgellm_server's --max-body
ROLES = ("system", "user", "assistant", "developer", "tool")  # developer is read as system
# Sampling where the request leaves it out (server.cpp's kDefaultTemperature, kDefaultMinP):
# OpenAI's temperature 1 with no cut-off makes small models ramble into noise words.
DEFAULT_TEMPERATURE = 0.7
DEFAULT_MIN_P = 0.05
# Unimplemented fields that clients often send with a value that asks for nothing: that value
# is accepted, any other gets 400 (server.cpp's kNoOpValues).
NO_OP_VALUES: dict[str, Any] = {
    "tools": [],
    "tool_choice": "none",
    "logit_bias": {},
    "echo": False,
    "best_of": 1,
    "suffix": "",
    "parallel_tool_calls": False,
}


class ApiError(Exception):
    """An OpenAI-style error reply: HTTP status, message, param, code."""

    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(status, message, param, code)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict[str, Any]:
        return ErrorReply(
            error=ErrorDetail(
                message=self.message, type=error_type(self.status), param=self.param, code=self.code
            )
        ).model_dump()

    def headers(self) -> dict[str, str]:
        return {"Retry-After": "1"} if self.status in (429, 503) else {}


def error_type(status: int) -> str:
    """server.cpp's error_type(): the OpenAI error class of an HTTP status."""
    if status == 404:
        return "not_found_error"
    if status == 429:
        return "rate_limit_error"
    if status == 503:
        return "service_unavailable"
    return "server_error" if status >= 500 else "invalid_request_error"


# --- requests --------------------------------------------------------------------------------

# Every field a route honours is declared; any other gets 400 naming it (server.cpp's
# check_fields): a field we ignored could change what the client expects to get.
_STRICT = ConfigDict(strict=True, extra="forbid")


class TextPart(BaseModel):
    model_config = _STRICT
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = _STRICT
    role: Literal[ROLES]  # type: ignore[valid-type]
    content: str | list[TextPart] | None = None  # absent only beside an assistant's tool_calls
    name: str | None = None  # a tool result's function name, for templates that show it
    tool_call_id: str | None = None
    tool_calls: Any = None  # an assistant's calls, checked by the engine (parse_tool_calls)
    reasoning_content: str | None = None  # an assistant's <think> block, for templates that read it

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class StreamOptions(BaseModel):
    model_config = _STRICT
    include_usage: bool | None = None


PositiveInt = Annotated[int, Field(ge=1, le=1 << 30)]


class GenerationRequest(BaseModel):
    """What /v1/chat/completions and /v1/completions share (model is checked before)."""

    model_config = _STRICT
    model: str
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=0, le=1 << 30)] | None = None
    min_p: Annotated[float, Field(ge=0, le=1)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    seed: int | None = None
    stop: str | Annotated[list[str], Field(max_length=4)] | None = None
    ignore_eos: bool | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    n: Annotated[int, Field(ge=1, le=1)] | None = None  # a strict int: true is not 1
    # Structured output: compiled by the engine (compile_response_format) in the replica, which
    # answers 400 naming a schema construct it cannot enforce.
    response_format: dict[str, Any] | None = None
    # Accepted, never change the output; typed as OpenAI documents them.
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None

    def limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class ToolFields(BaseModel):
    """tools, tool_choice, parallel_tool_calls: checked by the engine (edgellm/tool_calls.h),
    which names the bad field as server.cpp does."""

    model_config = _STRICT
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None

    def tool_fields(self) -> dict[str, str]:
        """The fields as JSON text ('' = absent): edgellm.Tools.parse's arguments."""
        import json

        names = ("tools", "tool_choice", "parallel_tool_calls")
        return {n: "" if getattr(self, n) is None else json.dumps(getattr(self, n)) for n in names}


class ChatRequest(GenerationRequest, ToolFields):
    messages: Annotated[list[Message], Field(min_length=1)]
    chat_template_kwargs: dict[str, Any] | None = None  # extra template variables
    # A reasoning template's <think> block: tokens before its close is forced (-1: no limit).
    reasoning_budget: Annotated[int, Field(ge=-1, le=1 << 30)] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None

    def logprobs_count(self) -> int:
        """GenerateOptions::logprobs: -1 off, else the alternatives per token."""
        return (self.top_logprobs or 0) if self.logprobs else -1


class CompletionRequest(GenerationRequest):
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)]
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None  # legacy: alternatives per token

    def logprobs_count(self) -> int:
        return -1 if self.logprobs is None else self.logprobs

    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


def _param(loc: tuple[Any, ...]) -> str | None:
    """A pydantic error location as server.cpp names it: messages[0].content[1].text,
    stream_options.include_usage, temperature. Union members' tags in it ('str',
    'list[TextPart]') name no field and are left out."""
    param = ""
    for part in loc:
        if isinstance(part, int):
            param += f"[{part}]"
        elif not _union_tag(str(part)):
            param += f".{part}" if param else str(part)
    return param or None


def _union_tag(part: str) -> bool:
    return part in ("str", "int", "float", "bool") or "[" in part or "-" in part


class TokenizeRequest(ToolFields):
    """POST /tokenize (vLLM's): the prompt tokens of a chat or completion request."""

    model_config = _STRICT
    model: str
    messages: Annotated[list[Message], Field(min_length=1)] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)] | None = None


TOOL_FIELDS = ("tools", "tool_choice", "parallel_tool_calls")  # implemented on chat


MAX_JSON_DEPTH = 64  # server.cpp's bound (edgellm/json_file.h kMaxJsonDepth)


def _depth(value: Any) -> int:
    """How deeply arrays and objects nest in a parsed value (iterative: no recursion limit)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, d + 1)
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return deepest


def _load(body: bytes, model_name: str, keep: tuple[str, ...] = ()) -> dict[str, Any]:
    """The body as a dict, null fields and no-op values (but of the fields in `keep`, which
    the route implements) dropped, its model checked."""
    if len(body) > MAX_BODY_BYTES:
        raise ApiError(413, f"the request body exceeds {MAX_BODY_BYTES} bytes")
    import json

    too_deep = ApiError(400, f"the request body is JSON nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        raw = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "the request body is not valid JSON") from None
    except RecursionError:  # deeper than Python's stack allows
        raise too_deep from None
    if _depth(raw) > MAX_JSON_DEPTH:
        raise too_deep
    if not isinstance(raw, dict):
        raise ApiError(400, "the request body must be a JSON object")
    # Null means absent, as in server.cpp; so does a no-op value of an unimplemented field.
    raw = {
        k: v
        for k, v in raw.items()
        if v is not None
        and not (k in NO_OP_VALUES and k not in keep and _same_json(v, NO_OP_VALUES[k]))
    }
    model = raw.get("model")
    if model is None:
        raise ApiError(400, "missing required field 'model'", "model")
    if not isinstance(model, str):
        raise ApiError(400, "'model' must be a string", "model")
    if model != model_name:
        raise ApiError(
            404,
            f"The model '{model}' does not exist (this server has '{model_name}')",
            "model",
            "model_not_found",
        )
    return raw


def _same_json(a: Any, b: Any) -> bool:
    """JSON equality as nlohmann's: 1 == 1.0, but True is no number."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def _message(m: dict[str, Any]) -> dict[str, Any]:
    """A message as server.cpp reads it: null fields absent, developer as system."""
    m = {k: v for k, v in m.items() if v is not None}
    if m.get("role") == "developer":
        m["role"] = "system"
    return m


def _validate(cls: type[BaseModel], raw: dict[str, Any]) -> Any:
    """cls from the body, or the ApiError server.cpp answers the first problem with."""
    import json

    if isinstance(raw.get("messages"), list):
        raw["messages"] = [_message(m) if isinstance(m, dict) else m for m in raw["messages"]]
    try:
        return cls.model_validate_json(json.dumps(raw))
    except ValidationError as e:
        # Unknown fields first, as server.cpp checks them before the values.
        errors = sorted(e.errors(), key=lambda err: err["type"] != "extra_forbidden")
        # Of one field's errors, the deepest: a union's member that got further (a text
        # part's 'text' in a content list) names the fault better than 'not a string'.
        first = errors[0]
        if first["type"] != "extra_forbidden":
            same_field = [err for err in errors if err["loc"][:3] == first["loc"][:3]]
            first = max(same_field, key=lambda err: len(err["loc"]))
        param = _param(tuple(first["loc"]))
        if first["type"] == "missing":
            raise ApiError(400, f"missing required field '{param}'", param) from None
        if first["type"] == "extra_forbidden":
            raise ApiError(
                400, f"unsupported field '{param}': this server does not implement it", param
            ) from None
        raise ApiError(400, f"'{param}': {first['msg']}", param) from None


def _check_messages(messages: list[Message] | None) -> None:
    """server.cpp's rules beyond the types: content may be absent only beside tool_calls, which
    only an assistant message carries."""
    for i, m in enumerate(messages or []):
        if m.tool_calls is not None and m.role != "assistant":
            where = f"messages[{i}].tool_calls"
            raise ApiError(400, f"{where} is only allowed on assistant messages", where)
        if m.content is None and m.tool_calls is None:
            raise ApiError(400, f"missing messages[{i}].content", f"messages[{i}].content")


def parse_request(body: bytes, chat: bool, model_name: str) -> ChatRequest | CompletionRequest:
    """The request of a generation route, or the ApiError edgellm_server answers it with."""
    raw = _load(body, model_name, TOOL_FIELDS if chat else ())
    r = _validate(ChatRequest if chat else CompletionRequest, raw)
    if isinstance(r, ChatRequest):
        _check_messages(r.messages)
    if isinstance(r, ChatRequest) and r.top_logprobs is not None and not r.logprobs:
        raise ApiError(400, "'top_logprobs' requires 'logprobs': true", "top_logprobs")
    return r


def check_body(body: bytes, model_name: str) -> None:
    """What every route checks first: size, JSON within the depth bound, an object, the model."""
    _load(body, model_name)


def parse_tokenize(body: bytes, model_name: str) -> TokenizeRequest:
    """POST /tokenize's request (a chat's messages or a completion's prompt)."""
    r = _validate(TokenizeRequest, _load(body, model_name, TOOL_FIELDS))
    _check_messages(r.messages)
    if r.messages is None and r.prompt is None:
        raise ApiError(400, "missing required field 'prompt'", "prompt")
    return r


# --- replies ---------------------------------------------------------------------------------


class ErrorDetail(BaseModel):
    message: Annotated[str, Field(min_length=1)]
    type: Annotated[str, Field(min_length=1)]
    param: str | None = None
    code: str | None = None


class ErrorReply(BaseModel):
    error: ErrorDetail


class PromptTokensDetails(BaseModel):
    cached_tokens: int  # prompt tokens whose KV came from the prefix cache


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class FunctionCall(BaseModel):
    name: Annotated[str, Field(min_length=1)]
    arguments: str  # JSON text of an object


class ToolCall(BaseModel):
    id: Annotated[str, Field(min_length=1)]
    type: Literal["function"]
    function: FunctionCall


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str | None  # None: the reply is tool_calls only
    tool_calls: Annotated[list[ToolCall], Field(min_length=1)] | None = None
    reasoning_content: str | None = None  # a reasoning template's <think> block


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None
    refusal: None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: Literal["stop", "length", "tool_calls"]


class _Head(BaseModel):
    id: str
    created: int
    model: str


class ChatCompletion(_Head):
    object: Literal["chat.completion"]
    choices: Annotated[list[ChatChoice], Field(min_length=1, max_length=1)]
    usage: Usage


class FunctionDelta(BaseModel):
    name: str | None = None
    arguments: str


class ToolCallDelta(BaseModel):
    """A streamed call: the first delta of a call has its id, type and name (arguments ""),
    the next ones add to its arguments."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionDelta


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: Annotated[list[ToolCallDelta], Field(min_length=1)] | None = None


class ChunkChoice(BaseModel):
    index: int
    delta: Delta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: Literal["stop", "length", "tool_calls"] | None


class ChatCompletionChunk(_Head):
    object: Literal["chat.completion.chunk"]
    choices: Annotated[list[ChunkChoice], Field(max_length=1)]
    usage: Usage | None = None


class CompletionLogprobs(BaseModel):
    """OpenAI's legacy logprobs of /v1/completions."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class TextChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: Literal["stop", "length"] | None


class Completion(_Head):
    """A /v1/completions reply, whole or one streamed chunk (OpenAI uses one shape)."""

    object: Literal["text_completion"]
    choices: Annotated[list[TextChoice], Field(max_length=1)]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"]
    data: Annotated[list[ModelCard], Field(min_length=1)]


class Tokenized(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class Health(BaseModel):
    status: Literal["ok"]
    active: int
    waiting: int
