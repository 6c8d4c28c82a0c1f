"""The OpenAI-compatible ingress on Ray Serve: `make serve`'s routes, replies and errors.

Requests are parsed with the shared schema (common/server/openai_schema.py, the one the
server tests check both servers against), then streamed from a model replica through a Ray
Serve handle. A replica that dies under a request ends it with a clean 503 (an SSE error
event once a stream has started); the ingress itself keeps serving, and Serve routes new
requests to the live replicas while it restarts the dead one.
"""

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator
from typing import Any

import edgellm_anthropic as messages_api
import ray.exceptions
from common.server.openai_schema import (
    DEFAULT_MIN_P,
    DEFAULT_TEMPERATURE,
    ApiError,
    ChatRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
    check_body,
    parse_request,
    parse_tokenize,
)
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from ray import serve
from ray.serve.exceptions import BackPressureError
from starlette.exceptions import HTTPException

app = FastAPI(title="edgellm on Ray Serve", docs_url=None, redoc_url=None, openapi_url=None)


def error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers())


@app.exception_handler(HTTPException)
async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    """Statuses FastAPI sets itself (no route, wrong method) in the same JSON shape."""
    message = f"HTTP error {exc.status_code}"
    if exc.status_code == 404:
        message = f"no route for {request.method} {request.url.path}"
    return error_response(ApiError(exc.status_code, message))


def as_api_error(e: BaseException) -> ApiError:
    """A replica's ApiError as it was raised; a dead replica or other failure as a 5xx."""
    cause = e.cause if isinstance(e, ray.exceptions.RayTaskError) else e
    if isinstance(cause, ApiError):
        return cause
    if isinstance(e, BackPressureError):
        return ApiError(429, "the request queue is full; retry later", None, "queue_full")
    if isinstance(e, ray.exceptions.RayActorError | ray.exceptions.ActorUnavailableError):
        return ApiError(503, "the replica serving this request died; retry", None, "replica_died")
    first = str(cause).strip().splitlines()
    return ApiError(500, f"internal error: {first[-1] if first else type(cause).__name__}")


def job_of(r: ChatRequest | CompletionRequest) -> dict[str, Any]:
    """What the replica needs, as plain data (the defaults as server.cpp applies them)."""
    job: dict[str, Any] = {
        "max_tokens": r.limit(),
        "temperature": DEFAULT_TEMPERATURE if r.temperature is None else r.temperature,
        "top_k": r.top_k or 0,
        "top_p": 1.0 if r.top_p is None else r.top_p,
        "min_p": DEFAULT_MIN_P if r.min_p is None else r.min_p,
        "frequency_penalty": r.frequency_penalty or 0.0,
        "presence_penalty": r.presence_penalty or 0.0,
        "seed": (r.seed if r.seed is not None else random.getrandbits(64)) % (1 << 64),
        "stop": r.stop_strings(),
        "stop_at_eos": not r.ignore_eos,
        "logprobs": r.logprobs_count(),
        # The JSON text: the replica's engine compiles it (properties in the client's order).
        "response_format": None if r.response_format is None else json.dumps(r.response_format),
    }
    job.update(prompt_of(r))
    if getattr(r, "reasoning_budget", None) is not None:
        job["reasoning_budget"] = r.reasoning_budget
    return job


def prompt_of(r: Any) -> dict[str, Any]:
    """{"messages": OpenAI messages as JSON text, "tools": {field: JSON text},
    "template_kwargs": JSON text} or {"prompt": text}: what the replica encodes (checking the
    messages and tool fields with the engine, as server.cpp does)."""
    if getattr(r, "messages", None) is not None:
        messages = [m.model_dump(exclude_none=True) for m in r.messages]
        kwargs = getattr(r, "chat_template_kwargs", None)
        return {
            "messages": json.dumps(messages),
            "tools": r.tool_fields(),
            "template_kwargs": json.dumps(kwargs),
        }
    return {"prompt": r.prompt if isinstance(r.prompt, str) else r.prompt[0]}


def tool_calls_json(calls: list[list[str]], streamed: bool) -> list[dict[str, Any]]:
    """server.cpp's tool_calls_json: OpenAI's message.tool_calls (streamed: with an index)."""
    out = []
    for i, (call_id, name, arguments) in enumerate(calls):
        c: dict[str, Any] = {
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        out.append({**c, "index": i} if streamed else c)
    return out


def tool_call_deltas(content: str, calls: list[list[str]]) -> list[dict[str, Any]]:
    """server.cpp's streamed calls: per call a delta with its id and name (and the content
    before the calls with the first), then one with its arguments."""
    deltas = []
    for call in tool_calls_json(calls, streamed=True):
        arguments = call["function"]["arguments"]
        call["function"]["arguments"] = ""
        first: dict[str, Any] = {"tool_calls": [call]}
        if call["index"] == 0 and content:
            first["content"] = content
        deltas.append(first)
        deltas.append(
            {"tool_calls": [{"index": call["index"], "function": {"arguments": arguments}}]}
        )
    return deltas


def choice_logprobs(chat: bool, entries: list[dict[str, Any]], offset: list[int]) -> Any:
    """server.cpp's choice_logprobs: chat's content list, or the legacy completions shape
    (the sampled token always in its top_logprobs map; text_offset in characters from
    offset[0], which it advances)."""
    if chat:
        return {"content": entries, "refusal": None}
    legacy: dict[str, list[Any]] = {
        "tokens": [],
        "token_logprobs": [],
        "top_logprobs": [],
        "text_offset": [],
    }
    for e in entries:
        legacy["tokens"].append(e["token"])
        legacy["token_logprobs"].append(e["logprob"])
        top = {t["token"]: t["logprob"] for t in e["top_logprobs"]}
        legacy["top_logprobs"].append({**top, e["token"]: e["logprob"]})
        legacy["text_offset"].append(offset[0])
        offset[0] += sum(1 for b in e["bytes"] if b & 0xC0 != 0x80)  # bytes that start a char
    return legacy


def usage(last: dict[str, Any]) -> dict[str, Any]:
    p, c = last["prompt_tokens"], last["completion_tokens"]
    return {
        "prompt_tokens": p,
        "completion_tokens": c,
        "total_tokens": p + c,
        "prompt_tokens_details": {"cached_tokens": last["cached_tokens"]},
    }


async def sse(
    events: Any, head: dict[str, Any], chat: bool, include_usage: bool, ended: Any
) -> AsyncIterator[str]:
    """server.cpp's event stream: a role chunk (chat), text chunks, a last chunk with the
    finish_reason and usage, the usage chunk if asked, then [DONE]."""

    pending: list[dict[str, Any]] = []  # logprobs whose text is still held back
    offset = [0]  # the legacy text_offset so far

    def chunk(
        text: str, finish: str | None, with_logprobs: bool = False, reasoning: str = ""
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
        if chat:
            if reasoning:  # a reasoning block's piece (with the content after it, if any)
                choice["delta"] = {
                    "reasoning_content": reasoning,
                    **({"content": text} if text else {}),
                }
            elif not text and finish is None:
                choice["delta"] = {"role": "assistant", "content": ""}
            else:
                choice["delta"] = {"content": text} if finish is None else {}
        else:
            choice["text"] = text
        choice["logprobs"] = None
        if with_logprobs and pending:
            choice["logprobs"] = choice_logprobs(chat, list(pending), offset)
            pending.clear()
        return {**head, "choices": [choice]}

    def data(obj: dict[str, Any]) -> str:
        return f"data: {json.dumps(obj)}\n\n"

    try:
        if chat:
            yield data(chunk("", None))
        async for event in events:
            pending.extend(event.get("logprobs", ()))
            if event.get("text") or event.get("reasoning"):
                yield data(chunk(event["text"], None, True, event.get("reasoning", "")))
            elif "finish_reason" in event:
                if event["error"]:
                    yield data({"error": {"message": event["error"], "type": "server_error"}})
                else:
                    if event.get("tool_calls"):  # a held reply with tools: its calls
                        for delta in tool_call_deltas(event["content"], event["tool_calls"]):
                            choice = {"index": 0, "delta": delta, "logprobs": None}
                            yield data({**head, "choices": [{**choice, "finish_reason": None}]})
                    elif event.get("content"):  # a held reply with tools, no call in it
                        yield data(chunk(event["content"], None, with_logprobs=True))
                    last = chunk("", event["finish_reason"], with_logprobs=True)
                    yield data({**last, "usage": usage(event)})
                    if include_usage:
                        yield data({**head, "choices": [], "usage": usage(event)})
        yield "data: [DONE]\n\n"
    except Exception as e:  # noqa: BLE001 - the replica died mid-stream: say so, then end
        err = as_api_error(e)
        yield data({"error": {"message": err.message, "type": "server_error", "code": err.code}})
        yield "data: [DONE]\n\n"
    finally:
        events.cancel()  # a client gone mid-stream frees its sequence in the replica
        ended()


def anthropic_error(e: ApiError) -> Response:
    """An ApiError in the Messages API's error shape (server.cpp's wrap_post, anthropic)."""
    return Response(
        messages_api.error_body(e.status, e.message),
        status_code=e.status,
        media_type="application/json",
        headers=e.headers(),
    )


def reply_of(last: dict[str, Any]) -> tuple[str, list[Any]]:
    """The reply's text and calls: parsed by the replica when tools were active."""
    if "tool_calls" in last:
        return last["content"], [tuple(c) for c in last["tool_calls"]]
    return last.get("text", ""), []


def outcome_args(last: dict[str, Any]) -> tuple[Any, ...]:
    return (
        last["finish_reason"],
        last["stop_string"],
        last["prompt_tokens"],
        last["cached_tokens"],
        last["completion_tokens"],
    )


async def anthropic_sse(events: Any, mid: str, model: str, ended: Any):
    """server.cpp's Messages stream (anthropic_reply.cpp): the events are the shapes of
    anthropic_messages.h, written by the same C++ through edgellm_anthropic."""
    blocks = messages_api.StreamEvents(mid, model)
    try:
        yield blocks.start()
        async for event in events:
            if event.get("reasoning") or event.get("text"):
                yield blocks.thinking(event.get("reasoning", "")) + blocks.text(
                    event.get("text", "")
                )
            elif "finish_reason" in event:
                if event["error"]:
                    yield messages_api.error_event(500, event["error"])
                else:
                    # The replica read the reply's end (tools, harmony's calls): its blocks.
                    held = "tool_calls" in event
                    content, calls = reply_of(event)
                    yield blocks.end(held, content, calls, *outcome_args(event))
    except Exception as e:  # noqa: BLE001 - the replica died mid-stream: say so, then end
        err = as_api_error(e)
        yield messages_api.error_event(err.status, err.message)
    finally:
        events.cancel()
        ended()


# After the helpers: Ray pickles this (decorated, so dynamic) class with the globals it sees.
@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1000)
@serve.ingress(app)
class OpenAIIngress:
    def __init__(self, replica: Any, model_name: str) -> None:
        self.replica = replica
        self.name = model_name
        self.next_id = 1
        self.max_context: int | None = None
        self.inflight = 0  # generation requests not yet answered in full (streams included)
        self.draining = False

    async def drain(self, seconds: float) -> int:
        """Shutdown, as edgellm_server's SIGTERM: new requests get 503, running ones get up to
        `seconds` to finish; returns how many were still running."""
        self.draining = True
        deadline = time.monotonic() + seconds
        while self.inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return self.inflight

    @app.get("/v1/models")
    async def models(self) -> Response:
        if self.max_context is None:
            try:
                self.max_context = (await self.replica.info.remote())["max_context"]
            except Exception as e:  # noqa: BLE001
                return error_response(as_api_error(e))
        card = ModelCard(
            id=self.name,
            object="model",
            created=int(time.time()),
            owned_by="edgellm",
            max_model_len=self.max_context,
        )
        return JSONResponse(ModelList(object="list", data=[card]).model_dump())

    @app.get("/health")
    async def health(self) -> Response:
        if self.draining:
            return error_response(ApiError(503, "the server is shutting down"))
        try:
            active, waiting = await self.replica.load.remote()
        except Exception as e:  # noqa: BLE001
            return error_response(as_api_error(e))
        return JSONResponse({"status": "ok", "active": active, "waiting": waiting})

    @app.get("/metrics")
    async def metrics(self) -> Response:
        """One replica's scheduler metrics (Ray's own cover the cluster: docs/scale_out.md)."""
        try:
            text = await self.replica.metrics.remote()
        except Exception as e:  # noqa: BLE001
            return error_response(as_api_error(e))
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.post("/tokenize")
    async def tokenize(self, request: Request) -> Response:
        """server.cpp's /tokenize: the prompt tokens of a chat or completion request."""
        try:
            r = parse_tokenize(await request.body(), self.name)
            tokens = await self.replica.prompt_tokens.remote(prompt_of(r))
            if self.max_context is None:
                self.max_context = (await self.replica.info.remote())["max_context"]
        except Exception as e:  # noqa: BLE001
            return error_response(as_api_error(e))
        return JSONResponse(
            {"count": len(tokens), "max_model_len": self.max_context, "tokens": tokens}
        )

    @app.post("/v1/chat/completions")
    async def chat(self, request: Request) -> Response:
        return await self.generate(request, chat=True)

    @app.post("/v1/completions")
    async def completions(self, request: Request) -> Response:
        return await self.generate(request, chat=False)

    @app.post("/v1/messages")
    async def messages(self, request: Request) -> Response:
        """Anthropic's Messages API: translated into the chat request it means (the C++
        translation, as edgellm serve's), then served like the chat route."""
        if self.draining:
            return anthropic_error(ApiError(503, "the server is shutting down"))
        return await self.counted(self.answer_messages(request))

    async def generate(self, request: Request, chat: bool) -> Response:
        if self.draining:
            return error_response(ApiError(503, "the server is shutting down"))
        return await self.counted(self.answer(request, chat))

    async def counted(self, answer: Any) -> Response:
        """Counts a generation request in `inflight` until it is answered in full."""
        self.inflight += 1
        streaming = False
        try:
            response = await answer
            streaming = isinstance(response, StreamingResponse)
            return response
        finally:
            if not streaming:  # a stream counts itself out when it ends (sse's finally)
                self.inflight -= 1

    async def admitted(self, r: Any) -> tuple[Any, dict[str, Any]]:
        """The replica's event stream for `r` and its first event once admitted, or its
        refusal as an ApiError."""
        events = self.replica.options(stream=True).generate.remote(job_of(r))
        try:
            first = await events.__anext__()
        except Exception as e:  # noqa: BLE001
            raise as_api_error(e) from None
        return events, first

    def stream_ended(self) -> None:
        self.inflight -= 1

    async def answer(self, request: Request, chat: bool) -> Response:
        try:
            r = parse_request(await request.body(), chat, self.name)
        except ApiError as e:
            return error_response(e)
        head = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{self.next_id}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.name,
        }
        self.next_id += 1
        if r.stream:
            try:
                events, _ = await self.admitted(r)
            except ApiError as e:
                return error_response(e)
            head["object"] = "chat.completion.chunk" if chat else "text_completion"
            include_usage = bool(r.stream_options and r.stream_options.include_usage)
            return StreamingResponse(
                sse(events, head, chat, include_usage, self.stream_ended),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        try:  # not streamed: one call, one reply (a stream's per-piece hops cost ~3 ms each)
            last = await self.replica.complete.remote(job_of(r))
        except Exception as e:  # noqa: BLE001
            return error_response(as_api_error(e))
        if last["error"]:
            return error_response(ApiError(500, last["error"]))
        choice: dict[str, Any] = {"index": 0, "finish_reason": last["finish_reason"]}
        if chat:
            head["object"] = "chat.completion"
            choice["message"] = {"role": "assistant", "content": last["text"]}
            if last.get("tool_calls"):
                choice["message"] = {
                    "role": "assistant",
                    "content": last["content"] or None,
                    "tool_calls": tool_calls_json(last["tool_calls"], streamed=False),
                }
            elif "content" in last:  # parsed with tools, no call: the text as generated
                choice["message"]["content"] = last["content"]
            if last.get("reasoning"):
                choice["message"]["reasoning_content"] = last["reasoning"]
        else:
            choice["text"] = last["text"]
        asked = r.logprobs_count() >= 0
        choice["logprobs"] = choice_logprobs(chat, last["logprobs"], [0]) if asked else None
        return JSONResponse({**head, "choices": [choice], "usage": usage(last)})

    async def answer_messages(self, request: Request) -> Response:
        body = await request.body()
        try:
            check_body(body, self.name)
            text, param, message = messages_api.to_chat_request(body.decode())
            if param:
                raise ApiError(400, message, param)
            r = parse_request(text.encode(), True, self.name)
        except ApiError as e:
            return anthropic_error(e)
        mid = f"msg_{self.next_id}"
        self.next_id += 1
        if r.stream:
            try:
                events, _ = await self.admitted(r)
            except ApiError as e:
                return anthropic_error(e)
            return StreamingResponse(
                anthropic_sse(events, mid, self.name, self.stream_ended),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        try:
            last = await self.replica.complete.remote(job_of(r))
        except Exception as e:  # noqa: BLE001
            return anthropic_error(as_api_error(e))
        if last["error"]:
            return anthropic_error(ApiError(500, last["error"]))
        content, calls = reply_of(last)
        reply = messages_api.message(
            mid, self.name, content, calls, *outcome_args(last), last.get("reasoning", "")
        )
        return Response(reply, media_type="application/json")
