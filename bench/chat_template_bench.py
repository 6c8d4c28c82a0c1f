"""Chat-template cost: a 20-turn conversation (41 messages) rendered by every template of the
test corpus through the engine's chat encoder (not a test).

Two timings per template, medians of --reps calls after a warm-up, the template parsed once
beforehand as the server caches it:
- render: ChatTemplate.render_conversation, the text alone (OpenAI messages in, as the
  server hands them over);
- encode: encode_conversation, what a request pays before prefill: the render, the second
  render that finds each content's bytes, and tokenization (SmolLM2's tokenizer).
Python's call overhead (a few microseconds) is included in both.

    .venv/bin/python bench/chat_template_bench.py [--reps 200]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "build" / "python"))
TEMPLATES = REPO / "tests" / "data" / "chat_templates"
MODEL = REPO / "models" / "smollm2-135m-instruct"


def conversation(turns: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "You are a helpful assistant."}]
    for k in range(turns):
        messages.append({"role": "user", "content": f"Question {k}: what is {k} squared?"})
        messages.append({"role": "assistant", "content": f"{k} squared is {k * k}."})
    messages.append({"role": "user", "content": "And 20?"})
    return messages


def median_ms(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=200)
    args = parser.parse_args()
    import edgellm_py as ep

    tokenizer = ep.Tokenizer.load(str(MODEL))
    messages = conversation(20)
    text = json.dumps(messages)
    pairs = [(m["role"], m["content"]) for m in messages]
    print(f"# 20-turn chat template cost ({len(messages)} messages), {cpu_name()}, 1 thread")
    print(f"median of {args.reps} calls, ms\n")
    print("| template | render | encode (render + spans + tokenize) | tokens |")
    print("|---|---:|---:|---:|")
    worst = 0.0
    for path in sorted(TEMPLATES.glob("*.jinja")):
        t = ep.ChatTemplate.from_text(path.read_text(), "<s>", path.name, "</s>")
        try:
            ids = ep.encode_conversation(tokenizer, t, pairs, True)
        except ep.Error as e:  # a template that refuses this conversation
            print(f"| {path.stem} | refused: {str(e)[:60]} | | |")
            continue
        render = median_ms(lambda t=t: t.render_conversation(text, True), args.reps)
        encode = median_ms(lambda t=t: ep.encode_conversation(tokenizer, t, pairs, True), args.reps)
        worst = max(worst, encode)
        print(f"| {path.stem} | {render:.3f} | {encode:.3f} | {len(ids)} |")
    print(f"\nslowest encode: {worst:.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
