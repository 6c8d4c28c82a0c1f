"""The short form: load a model once, then chat (python docs/example/chat.py [model] [question]).

The model is a model-store name, a checkpoint directory or a .gguf file inside one; the reply
is an OpenAI chat.completion dict.
"""

import sys

import edgellm

model = sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m-instruct"
question = sys.argv[2] if len(sys.argv) > 2 else "What is the capital of France?"

llm = edgellm.load(model)
reply = llm.chat([{"role": "user", "content": question}], max_tokens=64)

print(reply["choices"][0]["message"]["content"])
