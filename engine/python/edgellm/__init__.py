"""edgellm: a C++20 LLM inference engine for CPUs, embedded in Python.

Two lines, with OpenAI-shaped replies (llm.py; also complete(), tokenize(), stream=True):

    import edgellm

    llm = edgellm.load("smollm2-135m-instruct")  # a model-store name, checkpoint dir or .gguf
    reply = llm.chat([{"role": "user", "content": "Hi!"}], max_tokens=32)
    print(reply["choices"][0]["message"]["content"])

Underneath, the engine's own objects:

    model = edgellm.Model()
    model.setup("models/smollm2-135m-instruct", max_context=2048)  # once: load, pack, threads
    context = edgellm.Context(model)  # one sequence (KV cache); many may share the model
    prompt = edgellm.encode_conversation(model.tokenizer, model.chat_template, [("user", "Hi!")])
    for text in edgellm.generate(context, prompt, max_tokens=32):
        print(text, end="", flush=True)

Objects used before setup, bad arguments and unknown models raise edgellm.Error (one line).
Scheduler is edgellm_server's continuous batching over one Model (the Ray Serve replicas use
it).
"""

from ._core import (
    ChatTemplate,
    Context,
    Error,
    JsonGrammar,
    JsonSchemaError,
    Model,
    ReplySplitter,
    RequestStream,
    Sampler,
    SamplerOptions,
    Scheduler,
    Session,
    TextStream,
    Tokenizer,
    ToolRequestError,
    Tools,
    active_isa,
    chat_reasoning,
    checkpoint_dir,
    compile_json_schema,
    compile_response_format,
    decode_batch,
    encode_chat,
    encode_conversation,
    generate,
    grammar_index_builds,
    model_id,
    model_store,
    parse_tool_calls,
    parse_tool_output,
)
from .llm import LLM, load

__all__ = [
    "ChatTemplate",
    "Context",
    "Error",
    "JsonGrammar",
    "JsonSchemaError",
    "LLM",
    "Model",
    "ReplySplitter",
    "RequestStream",
    "Sampler",
    "SamplerOptions",
    "Scheduler",
    "Session",
    "TextStream",
    "Tokenizer",
    "ToolRequestError",
    "Tools",
    "active_isa",
    "chat_reasoning",
    "checkpoint_dir",
    "compile_json_schema",
    "compile_response_format",
    "decode_batch",
    "encode_chat",
    "encode_conversation",
    "generate",
    "grammar_index_builds",
    "load",
    "model_id",
    "model_store",
    "parse_tool_calls",
    "parse_tool_output",
]
