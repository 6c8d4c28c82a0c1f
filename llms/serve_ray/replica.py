"""One Ray Serve replica: one edgellm Model and the server's continuous-batching Scheduler.

The batching is the C++ Scheduler of edgellm_server, through the binding (edgellm.Scheduler):
requests join and leave between steps and one decode step serves every running sequence.
Python here only turns a validated request into prompt tokens and streams the text back.
"""

from __future__ import annotations

import asyncio
import codecs
import os
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from common.server.openai_schema import ApiError


def engine() -> Any:
    """The installed `edgellm` package, else the build tree's binding (the same module)."""
    try:
        import edgellm

        if hasattr(edgellm, "Scheduler"):
            return edgellm
    except ImportError:
        pass
    import edgellm_py

    return edgellm_py


class EdgeLLMReplica:
    def __init__(
        self,
        model_path: str,
        threads: int,
        max_context: int,
        parallel: int,
        queue: int,
        prefill_chunk: int,
        cache_mb: int,
        lookup: bool = True,
        reasoning_budget: int = -1,
    ) -> None:
        eg = engine()
        self.model = eg.Model()
        self.model.setup(model_path, threads=threads, max_context=max_context)
        self.scheduler = eg.Scheduler(
            self.model, parallel, queue, prefill_chunk, cache_mb, lookup=lookup
        )
        self.eg = eg
        self.reasoning_budget = reasoning_budget  # --reasoning-budget: a request's own wins
        self.encode_chat = eg.encode_chat
        self.compile_response_format = eg.compile_response_format
        # Threads that wait on RequestStream.wait (the GIL released): one per admitted or
        # queued request, so no stream waits behind another.
        self.waiters = ThreadPoolExecutor(parallel + queue + 2, thread_name_prefix="edgellm-wait")

    def info(self) -> dict[str, Any]:
        return {"max_context": self.model.max_context, "pid": os.getpid()}

    def load(self) -> tuple[int, int]:
        return self.scheduler.load()

    def metrics(self) -> str:
        return self.scheduler.metrics()

    def tools_of(self, job: dict[str, Any]) -> Any:
        """The request's edgellm.Tools, checked by the engine as server.cpp checks them."""
        try:
            return self.eg.Tools.parse(**job.get("tools", {}))
        except self.eg.ToolRequestError as e:
            raise ApiError(400, str(e), e.param) from None

    def prompt_tokens(self, job: dict[str, Any], tools: Any = None) -> list[int]:
        """The engine's chat encoder with tools (encode_chat, as server.cpp) or the prompt's
        encode."""
        if "messages" in job:
            tools = tools if tools is not None else self.tools_of(job)
            if not self.model.chat_template.available():
                raise ApiError(
                    400, "this model has no chat template; use /v1/completions", "messages"
                )
            try:
                return self.encode_chat(
                    self.model.tokenizer,
                    self.model.chat_template,
                    job["messages"],
                    tools,
                    job.get("template_kwargs", "null"),
                )
            except self.eg.ToolRequestError as e:
                raise ApiError(400, str(e), e.param) from None
            except Exception as e:  # the engine's one-line reason
                raise ApiError(400, str(e), "messages") from None
        ids = self.model.tokenizer.encode(job["prompt"], True)
        if not ids:
            raise ApiError(400, "'prompt' is empty", "prompt")
        return ids

    def max_tokens(self, prompt: list[int], asked: int | None) -> int:
        """server.cpp's rule: what fits in the context, or 400 context_length_exceeded."""
        context = self.model.max_context
        room = max(0, context - len(prompt))
        if room == 0 or (asked is not None and asked > room):
            n = asked or 0
            raise ApiError(
                400,
                f"This model's maximum context length is {context} tokens. However, you "
                f"requested {len(prompt) + n} tokens ({len(prompt)} in the prompt, {n} for the "
                "completion).",
                "max_tokens" if asked else "messages",
                "context_length_exceeded",
            )
        return asked or room

    def grammar(self, job: dict[str, Any], tools: Any = None) -> Any:
        """server.cpp's rules: a response_format it cannot enforce is 400 naming the construct;
        a forced call's grammar takes the place of a response_format one (parameters it cannot
        enforce: 400 naming them)."""
        grammar = None
        if job.get("response_format") is not None:
            try:
                grammar = self.compile_response_format(job["response_format"])
            except ValueError as e:  # JsonSchemaError
                raise ApiError(400, str(e), "response_format") from None
        if tools is not None and tools.forced:
            try:
                grammar = tools.call_grammar()
            except self.eg.ToolRequestError as e:
                raise ApiError(400, str(e), e.param) from None
        return grammar

    def submit(self, job: dict[str, Any]) -> tuple[Any, Any, Any]:
        """The request's stream, its edgellm.Tools (None for a completion) and, for a chat
        reply, the engine's edgellm.ReplySplitter for its text (else None)."""
        tools = self.tools_of(job) if "messages" in job else None
        prompt = self.prompt_tokens(job, tools)
        grammar = self.grammar(job, tools)
        reasoning = None
        if tools is not None:  # a chat request: server.cpp's think()
            reasoning = self.eg.chat_reasoning(
                self.model, prompt, tools.forced, job.get("reasoning_budget", self.reasoning_budget)
            )
        stream = self.scheduler.submit(
            prompt,
            self.max_tokens(prompt, job["max_tokens"]),
            temperature=job["temperature"],
            top_k=job["top_k"],
            top_p=job["top_p"],
            seed=job["seed"],
            stop=job["stop"],
            stop_at_eos=job["stop_at_eos"],
            min_p=job["min_p"],
            frequency_penalty=job["frequency_penalty"],
            presence_penalty=job["presence_penalty"],
            logprobs=job["logprobs"],
            grammar=grammar,
            reasoning=reasoning,
        )
        if stream is None:
            if self.scheduler.stopping:
                raise ApiError(503, "the server is shutting down")
            raise ApiError(429, "the request queue is full; retry later", None, "queue_full")
        split = self.eg.ReplySplitter(reasoning) if tools is not None else None
        return stream, tools, split

    def logprob_entry(self, token: int, logprob: float) -> dict[str, Any]:
        """server.cpp's logprob_entry: the token's text (U+FFFD for part of a character),
        logprob, and raw bytes."""
        tokenizer = self.model.tokenizer
        return {
            "token": tokenizer.decode([token]),
            "logprob": logprob,
            "bytes": list(tokenizer.token_bytes(token)),
        }

    def logprobs(self, records: list[Any]) -> list[dict[str, Any]]:
        """choices[].logprobs.content entries of the stream's (token, logprob, top) records."""
        return [
            {
                **self.logprob_entry(token, logprob),
                "top_logprobs": [self.logprob_entry(t, lp) for t, lp in top],
            }
            for token, logprob, top in records
        ]

    def outcome(
        self, stream: Any, tools: Any = None, text: str = "", split: Any = None
    ) -> dict[str, Any]:
        """How the request ended; where the reply's end is read (split.end: active tools, or
        harmony's calls) also what it holds: {"content" (`text`, the content held or whole, less
        the calls), "tool_calls": [(id, name, arguments)]}, finish_reason tool_calls if any."""
        parsed: dict[str, Any] = {}
        finish = "length" if stream.finish_reason == "length" else "stop"
        end = split.end(text, tools) if split is not None and not stream.error else None
        if end is not None:
            content, calls = end
            parsed = {"content": content, "tool_calls": [list(c) for c in calls]}
            finish = "tool_calls" if calls else finish
        return {
            **parsed,
            "finish_reason": finish,
            "stop_string": stream.stop_string,
            "error": stream.error,
            "prompt_tokens": stream.prompt_tokens,
            "completion_tokens": stream.completion_tokens,
            "cached_tokens": stream.cached_tokens,
        }

    async def complete(self, job: dict[str, Any]) -> dict[str, Any]:
        """A whole completion in one call: {"text"} (a reasoning reply's content, its block
        as "reasoning") and the outcome (one Ray round trip)."""
        stream, tools, split = self.submit(job)
        loop = asyncio.get_running_loop()
        data, done, records = b"", False, []
        try:
            while not done:
                piece, done, lp = await loop.run_in_executor(self.waiters, stream.wait, 1000)
                data += piece
                records += lp
        except BaseException:  # cancelled (the client went away): free the slot
            stream.cancel()
            raise
        text, reasoning = data.decode("utf-8", "replace"), ""
        if split is not None:
            reasoning, text = split.feed(text, True)
        return {
            "text": text,
            "reasoning": reasoning,
            "logprobs": self.logprobs(records),
            **self.outcome(stream, tools, text, split),
        }

    async def generate(self, job: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Events: {"prompt_tokens"} once admitted, {"text", "reasoning"} pieces (the
        reasoning block's apart), then the outcome. With active tools the text is held (harmony:
        only its calls): the outcome carries the parsed reply."""
        stream, tools, split = self.submit(job)
        hold = split is not None and split.holds_content(tools)
        held = ""
        yield {"prompt_tokens": stream.prompt_tokens}
        loop = asyncio.get_running_loop()
        utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        try:
            done = False
            while not done:
                data, done, lp = await loop.run_in_executor(self.waiters, stream.wait, 1000)
                text, reasoning = utf8.decode(data, final=done), ""
                if split is not None:
                    reasoning, text = split.feed(text, done)
                if hold:
                    held, text = held + text, ""
                if text or reasoning or lp:
                    yield {"text": text, "reasoning": reasoning, "logprobs": self.logprobs(lp)}
        except BaseException:  # the client went away (Ray cancels this generator): free the slot
            stream.cancel()
            raise
        yield self.outcome(stream, tools, held, split)

    def __del__(self) -> None:
        scheduler = getattr(self, "scheduler", None)
        if scheduler is not None:
            scheduler.shutdown(0)
