"""The short API: `edgellm.load(model).chat(messages)` returns an OpenAI-shaped dict.

    llm = edgellm.load("smollm2-135m-instruct")
    print(llm.chat([{"role": "user", "content": "Hi!"}])["choices"][0]["message"]["content"])

A thin layer over Model / Context / generate(): the conversation is encoded by the engine's
encode_conversation (message content is plain text: special-token text typed by a user stays
text), the tokens come from the one generate() loop, and the replies have the shapes of
edgellm_server's /v1/chat/completions and /v1/completions.
"""

from __future__ import annotations

import itertools
import json
import os
import secrets
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ._core import (
    Context,
    Error,
    Model,
    ReplySplitter,
    Tools,
    chat_reasoning,
    compile_response_format,
    embed,
    encode_conversation,
    generate,
    model_store,
    parse_tool_calls,
    rerank,
)

ROLES = ("system", "user", "assistant", "tool")  # "developer" is read as system, as the server


def resolve(model: str | os.PathLike[str]) -> Path:
    """A checkpoint directory, a .gguf file inside one, or a name in the model store."""
    given = os.fspath(model)
    path = Path(given).expanduser()
    store = Path(model_store())
    if not _is_model(path):
        in_store = store / given
        if given and not path.is_absolute() and ".." not in path.parts and _is_model(in_store):
            path = in_store
        else:
            entries = sorted(store.iterdir()) if store.is_dir() else []
            held = [p.name for p in entries if p.is_dir() and not p.name.startswith(".")]
            raise Error(
                f"model {given!r}: not a checkpoint directory, a .gguf file or a name in the "
                f"model store {store} (tried {path.absolute()} and {in_store}; the store holds: "
                f"{', '.join(held) or 'nothing'}; EDGELLM_MODELS sets it, `make fetch` fills it)"
            )
    # A .gguf runs with or without a converted checkpoint beside it; a directory must be one.
    if path.suffix != ".gguf" and not (path / "config.json").is_file():
        raise Error(f"model {given!r}: {path} is not a HF-format checkpoint (no config.json)")
    return path


def _is_model(path: Path) -> bool:
    return path.is_dir() or (path.suffix == ".gguf" and path.is_file())


def load(
    model: str | os.PathLike[str],
    weights: str = "",
    precision: str = "fast",
    threads: int = 0,
    max_context: int = 4096,
    kv_cache: str = "",
) -> LLM:
    """Loads a model (store name, checkpoint directory or .gguf file) once, for many calls.

    precision: fast (bf16 arithmetic where the CPU has it) or exact (the gate's fp32 tier);
    weights: q8_0 | q4_0 quantizes a bf16 checkpoint at setup; kv_cache: fp32 | bf16 | q8_0;
    threads 0 = all cores. Empty strings take the EDGELLM_* environment defaults.
    """
    path = resolve(model)
    m = Model()
    m.setup(
        str(path),
        threads=threads,
        max_context=max_context,
        kv_cache=kv_cache,
        precision=precision,
        weights=weights,
    )
    return LLM(m, os.fspath(model), path)


class LLM:
    """A loaded model with chat(), complete(), tokenize() and detokenize().

    Each call runs in a Context of the model (reused between calls; a call made while a stream
    is still open gets its own), so `model` may also be used with the low-level API.
    """

    def __init__(self, model: Model, name: str, path: Path) -> None:
        self.model, self.name, self.path = model, name, path
        self._idle: list[Context] = []

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; special-token text in it is read as those tokens."""
        return self.model.tokenizer.encode(text, add_special_tokens)

    def detokenize(self, ids: Sequence[int]) -> str:
        """The text of token ids, special tokens included."""
        return self.model.tokenizer.decode(list(ids), False)

    def chat(
        self,
        messages: Sequence[dict[str, Any]],
        max_tokens: int | None = None,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        stream: bool = False,
        response_format: dict[str, Any] | None = None,
        tools: Sequence[dict[str, Any]] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
        parallel_tool_calls: bool | None = None,
        reasoning_budget: int = -1,
    ) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """A chat.completion dict, or with stream=True an iterator of chat.completion.chunk dicts.

        max_tokens None: up to the end of the context. temperature 0 is greedy; seed None draws
        one. stop: strings that end the reply (not included in it). response_format: OpenAI's
        {"type": "json_object"} or {"type": "json_schema", "json_schema": {"schema": ...}}
        constrains the reply to such JSON; a schema it cannot enforce raises JsonSchemaError
        (a ValueError) naming the construct. tools / tool_choice / parallel_tool_calls as in
        the OpenAI API (the server's rules, README "Tool calls"): a forced call is generated
        under its JSON schema (in place of response_format's), an auto reply is parsed for calls.
        A template with <think> blocks (a reasoning model) gets the block as the message's
        reasoning_content (streamed as reasoning_content deltas), free of response_format;
        reasoning_budget >= 0 closes it after that many tokens (README "Reasoning models").
        A harmony template (gpt-oss) is read by its channels: analysis is reasoning_content,
        final the content, a message to functions.NAME a tool call.
        """
        if not self.model.chat_template.available():
            raise Error(f"{self.path}: this model has no chat template; use complete()")
        turns = _conversation(messages)
        fields = {"tools": tools, "tool_choice": tool_choice}
        fields["parallel_tool_calls"] = parallel_tool_calls
        spec = Tools.parse(**{k: "" if v is None else json.dumps(v) for k, v in fields.items()})
        prompt = encode_conversation(
            self.model.tokenizer, self.model.chat_template, turns, True, spec
        )
        options = self._options(
            len(prompt), max_tokens, temperature, top_p, top_k, seed, stop, response_format
        )
        if spec.forced:  # the call's grammar takes the place of a response_format one
            options["grammar"] = spec.call_grammar()
        if not _is_int(reasoning_budget) or reasoning_budget < -1:
            raise Error(f"reasoning_budget must be an integer >= -1, got {reasoning_budget!r}")
        reasoning = chat_reasoning(self.model, prompt, spec.forced, reasoning_budget)
        split = ReplySplitter(reasoning)  # the engine's one choice of how the reply reads
        if reasoning[0]:
            options["reasoning"] = reasoning
        head = self._head("chatcmpl", "chat.completion.chunk" if stream else "chat.completion")
        if stream:
            return self._chat_chunks(prompt, options, head, spec, split)
        text, run = self._run(prompt, options)
        thought, text = split.feed(text, True)
        message, finish = _reply(text, split.end(text, spec), _finish(run))
        if thought:
            message["reasoning_content"] = thought
        choice = {"index": 0, "message": message, "finish_reason": finish}
        return {**head, "choices": [choice], "usage": _usage(prompt, run)}

    def complete(
        self,
        prompt: str,
        max_tokens: int | None = None,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        stream: bool = False,
        response_format: dict[str, Any] | None = None,
    ) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """A text_completion dict for raw text (the tokenizer's specials, e.g. BOS, added and
        special-token text read as such), or with stream=True an iterator of its chunks.
        response_format: as chat()'s."""
        if not isinstance(prompt, str):
            raise Error(f"prompt must be a string, got {type(prompt).__name__}")
        ids = self.tokenize(prompt)
        if not ids:
            raise Error("prompt is empty")
        options = self._options(
            len(ids), max_tokens, temperature, top_p, top_k, seed, stop, response_format
        )
        head = self._head("cmpl", "text_completion")
        if stream:
            return self._completion_chunks(ids, options, head)
        text, run = self._run(ids, options)
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": _finish(run)}
        return {**head, "choices": [choice], "usage": _usage(ids, run)}

    # ---- the generation loop --------------------------------------------------------------

    def embed(
        self, inputs: str | Sequence[str] | Sequence[Sequence[int]], dimensions: int | None = None
    ) -> list[list[float]]:
        """Unit vectors of texts (tokenized with the special tokens) or token-id lists.

        Last-token pooling after the final norm (Qwen3-Embedding); `dimensions` keeps the first
        values and normalises again. The engine checks the inputs and `dimensions`.
        """
        items = [inputs] if isinstance(inputs, str) else list(inputs)
        ids = [self.tokenize(x) if isinstance(x, str) else list(x) for x in items]
        with self._context() as context:
            return embed(context, ids, dimensions)

    def rerank(
        self, query: str, documents: Sequence[str], top_n: int | None = None
    ) -> list[dict[str, Any]]:
        """[{"index", "relevance_score"}] by score, highest first (the first top_n).

        The score is p("yes") of Qwen3-Reranker's prompt for the (query, document) pair.
        """
        with self._context() as context:
            return rerank(context, query, list(documents), top_n)[0]

    @contextmanager
    def _context(self) -> Iterator[Context]:
        context = self._idle.pop() if self._idle else Context(self.model)
        try:
            yield context
        finally:
            self._idle.append(context)

    def _run(self, prompt: list[int], options: dict[str, Any]) -> tuple[str, Any]:
        with self._context() as context:
            run = generate(context, prompt, **options)
            return "".join(run), run

    def _chat_chunks(
        self,
        prompt: list[int],
        options: dict[str, Any],
        head: dict[str, Any],
        spec: Tools,
        split: ReplySplitter,
    ) -> Iterator[dict[str, Any]]:
        def chunk(delta: dict[str, str], finish: str | None) -> dict[str, Any]:
            return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        with self._context() as context:
            run = generate(context, prompt, **options)
            yield chunk({"role": "assistant", "content": ""}, None)
            held = ""  # with tools, the content is parsed once whole (as the server streams it)
            hold = split.holds_content(spec)
            for piece in itertools.chain(run, [None]):  # None: the reply ended
                thought, text = split.feed(piece or "", piece is None)
                if thought:
                    yield chunk({"reasoning_content": thought}, None)
                if text and hold:
                    held += text
                elif text:
                    yield chunk({"content": text}, None)
            finish = _finish(run)
            end = split.end(held, spec)
            if end is not None:  # the calls, and the content they leave that was not sent
                message, finish = _reply(held, end, finish)
                for i, call in enumerate(message.get("tool_calls", [])):
                    fn = call["function"]
                    first = {"index": i, "id": call["id"], "type": "function"}
                    first["function"] = {"name": fn["name"], "arguments": ""}
                    delta: dict[str, Any] = {"tool_calls": [first]}
                    if i == 0 and message["content"]:
                        delta["content"] = message["content"]
                    yield chunk(delta, None)
                    yield chunk({"tool_calls": [{"index": i, "function": fn}]}, None)
                if "tool_calls" not in message and message["content"]:
                    yield chunk({"content": message["content"]}, None)
            yield {**chunk({}, finish), "usage": _usage(prompt, run)}

    def _completion_chunks(
        self, prompt: list[int], options: dict[str, Any], head: dict[str, Any]
    ) -> Iterator[dict[str, Any]]:
        def chunk(text: str, finish: str | None) -> dict[str, Any]:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            return {**head, "choices": [choice]}

        with self._context() as context:
            run = generate(context, prompt, **options)
            for text in run:
                if text:
                    yield chunk(text, None)
            yield {**chunk("", _finish(run)), "usage": _usage(prompt, run)}

    def _head(self, prefix: str, kind: str) -> dict[str, Any]:
        return {
            "id": f"{prefix}-{uuid.uuid4().hex}",
            "object": kind,
            "created": int(time.time()),
            "model": self.name,
        }

    def _options(
        self,
        prompt_tokens: int,
        max_tokens: int | None,
        temperature: float,
        top_p: float,
        top_k: int,
        seed: int | None,
        stop: str | Sequence[str] | None,
        response_format: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """generate()'s keyword arguments; bad values raise one line naming the parameter."""
        room = self.model.max_context - prompt_tokens
        if room <= 0:
            raise Error(
                f"the prompt ({prompt_tokens} tokens) fills the context ({self.model.max_context} "
                "tokens; load(max_context=...) sets it)"
            )
        if max_tokens is None:
            max_tokens = room
        elif not _is_int(max_tokens) or max_tokens < 1:
            raise Error(f"max_tokens must be a positive integer, got {max_tokens!r}")
        elif max_tokens > room:
            raise Error(
                f"max_tokens {max_tokens} does not fit: the prompt has {prompt_tokens} tokens and "
                f"the context {self.model.max_context} (load(max_context=...) sets it)"
            )
        if not _is_number(temperature) or temperature < 0:
            raise Error(f"temperature must be a number >= 0, got {temperature!r}")
        if not _is_number(top_p) or not 0 < top_p <= 1:
            raise Error(f"top_p must be a number in (0, 1], got {top_p!r}")
        if not _is_int(top_k) or top_k < 0:
            raise Error(f"top_k must be an integer >= 0 (0 = off), got {top_k!r}")
        if seed is None:
            seed = secrets.randbits(64)
        elif not _is_int(seed) or not 0 <= seed < 1 << 64:
            raise Error(f"seed must be an integer in [0, 2^64), got {seed!r}")
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if not all(isinstance(s, str) and s for s in stops):
            raise Error(f"stop must be a non-empty string or a list of them, got {stop!r}")
        options = {
            "max_tokens": max_tokens,
            "temperature": float(temperature),
            "top_k": top_k,
            "top_p": float(top_p),
            "seed": seed,
            "stop": stops,
        }
        if response_format is not None:
            if not isinstance(response_format, dict):
                raise Error(f"response_format must be a dict, got {response_format!r}")
            grammar = compile_response_format(json.dumps(response_format))
            if grammar is not None:
                options["grammar"] = grammar
        return options


def _reply(text: str, end: Any, finish: str) -> tuple[dict[str, Any], str]:
    """The assistant message of a reply and its finish_reason: `end` (ReplySplitter.end) holds
    the calls the engine read from it (finish_reason tool_calls); None: `text` is the content."""
    if end is None:
        return {"role": "assistant", "content": text}, finish
    content, calls = end
    if not calls:
        return {"role": "assistant", "content": content}, finish
    tool_calls = [
        {"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in calls
    ]
    return {"role": "assistant", "content": content or None, "tool_calls": tool_calls}, "tool_calls"


def _conversation(messages: Any) -> list[tuple[str, str, list[tuple[str, str, str]]]]:
    """(role, text, tool calls) of OpenAI-style messages; a bad one raises naming index and
    field (an assistant's tool_calls are checked by the engine)."""
    if isinstance(messages, (str, bytes, dict)) or not isinstance(messages, Sequence):
        raise Error("messages must be a list of {'role': ..., 'content': ...} dicts")
    if not messages:
        raise Error("messages must not be empty")
    turns = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise Error(f"{where} must be a dict with 'role' and 'content', got {type(m).__name__}")
        role = m.get("role")
        role = "system" if role == "developer" else role
        if role not in ROLES:
            raise Error(f"{where}.role must be system, user, assistant or tool, got {role!r}")
        calls = []
        if m.get("tool_calls") is not None:
            if role != "assistant":
                raise Error(f"{where}.tool_calls is only allowed on assistant messages")
            calls = parse_tool_calls(json.dumps(m["tool_calls"]), f"{where}.tool_calls")
        if m.get("content") is None and not calls:
            raise Error(f"{where}.content is missing")
        content = m.get("content")
        turns.append((role, "" if content is None else _text(content, f"{where}.content"), calls))
    return turns


def _text(content: Any, where: str) -> str:
    """A message's content: a string, or a list of {'type': 'text', 'text': ...} parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    ):
        return "".join(p["text"] for p in content)
    raise Error(f"{where} must be a string or a list of text parts, got {content!r:.60}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finish(run: Any) -> str:
    # generate() ends on "stop" or "length" here (nothing cancels it).
    return "length" if run.finish_reason == "length" else "stop"


def _usage(prompt: list[int], run: Any) -> dict[str, int]:
    completion = len(run.tokens)
    return {
        "prompt_tokens": len(prompt),
        "completion_tokens": completion,
        "total_tokens": len(prompt) + completion,
    }
