"""edgellm: a C++20 LLM inference engine for CPUs, embedded in Python.

    import edgellm

    model = edgellm.Model()
    model.setup("models/smollm2-135m-instruct", max_context=2048)  # once: load, pack, threads
    context = edgellm.Context(model)  # one sequence (KV cache); many may share the model
    prompt = model.tokenizer.encode(model.chat_template.render([("user", "Hi!")], True))
    for text in edgellm.generate(context, prompt, max_tokens=32):
        print(text, end="", flush=True)

Objects used before setup raise edgellm.Error. Scheduler is edgellm_server's continuous
batching over one Model (the Ray Serve replicas use it, llms/serve_ray/).
"""

from ._core import (
    ChatTemplate,
    Context,
    Error,
    Model,
    RequestStream,
    Sampler,
    SamplerOptions,
    Scheduler,
    Session,
    TextStream,
    Tokenizer,
    active_isa,
    checkpoint_dir,
    decode_batch,
    encode_conversation,
    generate,
    model_store,
)

__all__ = [
    "ChatTemplate",
    "Context",
    "Error",
    "Model",
    "RequestStream",
    "Sampler",
    "SamplerOptions",
    "Scheduler",
    "Session",
    "TextStream",
    "Tokenizer",
    "active_isa",
    "checkpoint_dir",
    "decode_batch",
    "encode_conversation",
    "generate",
    "model_store",
]
