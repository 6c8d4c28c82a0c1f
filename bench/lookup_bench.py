"""Prompt-lookup decoding's speed: greedy decode tokens/s with and without
lookup (same output) on an input-grounded task (repeat a code block) and on
open-ended text; medians of --repeats runs, after the first token.

    PYTHONPATH=build/python python bench/lookup_bench.py MODEL [--threads 2]
"""

import argparse
import statistics
import time

import edgellm_py as e

CODE = "\n".join(
    f"def f{i}(x, y):\n    total = x * {i} + y\n    return total - {i}\n" for i in range(8)
)
TASKS = {
    "grounded": "Repeat this Python code exactly:\n\n" + CODE,
    "open-ended": "Write a short story about a dragon who learns to paint.",
}


def decode_tps(context, prompt, lookup: bool, n: int) -> tuple[float, list[int]]:
    stream = e.generate(context, prompt, max_tokens=n, lookup=lookup)
    next(stream)  # the prefill and the first token: not decode
    start = time.perf_counter()
    for _ in stream:
        pass
    elapsed = time.perf_counter() - start
    return (len(stream.tokens) - 1) / elapsed, list(stream.tokens)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=150)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    model = e.Model()
    model.setup(a.model, threads=a.threads)
    context = e.Context(model)
    for name, text in TASKS.items():
        prompt = e.encode_conversation(model.tokenizer, model.chat_template, [("user", text)], True)
        tps = {}
        for lookup in (False, True):
            runs = [decode_tps(context, prompt, lookup, a.tokens) for _ in range(a.repeats)]
            tps[lookup] = statistics.median(r[0] for r in runs)
            tokens = runs[0][1]
        print(
            f"{name:10s} {len(tokens):4d} tokens  plain {tps[False]:7.1f} tok/s  "
            f"lookup {tps[True]:7.1f} tok/s  x{tps[True] / tps[False]:.2f}"
        )


if __name__ == "__main__":
    main()
