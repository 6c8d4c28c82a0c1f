"""The engine's own objects: Model (loaded once), Context (one sequence), generate() (streams).

python docs/example/low_level.py [checkpoint directory] [question]
"""

import sys
from pathlib import Path

import edgellm

model_dir = (
    sys.argv[1] if len(sys.argv) > 1 else Path(edgellm.model_store()) / "smollm2-135m-instruct"
)
question = sys.argv[2] if len(sys.argv) > 2 else "What is the capital of France?"

model = edgellm.Model()
model.setup(str(model_dir), max_context=1024)  # config, tokenizer, packed weights, threads
context = edgellm.Context(model)  # a KV cache; several may share one model
prompt = edgellm.encode_conversation(model.tokenizer, model.chat_template, [("user", question)])
stream = edgellm.generate(context, prompt, max_tokens=64)  # greedy: temperature 0
for text in stream:
    print(text, end="", flush=True)
print(f"\n[{len(stream.tokens)} tokens, finish_reason {stream.finish_reason}]")
