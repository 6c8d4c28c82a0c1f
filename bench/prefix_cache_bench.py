"""Prefix caching: time to first token with and without it, through `edgellm serve` (not a test).

Three scenarios, each on a server with the prefix cache (the default) and one with --cache-mb 0:
- a shared system prompt of ~1,500 tokens: the TTFT of a request that brings it first, then of
  requests that share it with another question (each repetition a new system prompt, so the first
  request is cold); target: the second <= 10% of the first. Once with the first reply read to its
  end, once with its client leaving after the first token of a longer reply (as clients that
  only want a short answer do): the second request must be as cheap either way.
- clients with system prompts of their own (3 by default), their requests interleaved: each
  second request must still find its own prefix among the others';
- a 10-turn chat: each turn sends the whole conversation so far plus a new question; with the
  cache only the last reply and the new question are prefilled, so the per-turn TTFT stays flat.
Holds the shared CPU lock (bench/serve_bench.py's) for the whole run.

    .venv/bin/python bench/prefix_cache_bench.py [--reps 3] [--turns 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from serve_bench import parse_and_lock, start_server

TOPICS = ["flour", "ovens", "yeast", "butter", "sugar", "salt", "water", "eggs", "milk", "honey"]


def system_prompt(rep: int) -> str:
    """About 1,500 tokens of rules, different from its first words on for each repetition."""
    rules = [
        f"Rule {i + 1}: when a customer asks about {t}, explain where the bakery buys its {t}, "
        f"how the {t} is stored, and why the bakers think good {t} matters for the taste."
        for i in range(38)
        for t in [TOPICS[i % len(TOPICS)]]
    ]
    return f"Edition {rep}. You are the assistant of a bakery. " + " ".join(rules)


class Server:
    def __init__(self, model: str, threads: int, *args: str) -> None:
        self.proc, self.client = start_server(
            ["--model", model, "--threads", str(threads), "--max-context", "4096"]
            + ["--parallel", "2", *args]
        )
        self.name = self.client.models.list().data[0].id

    def ask(
        self, messages: list[dict[str, str]], tokens: int, leave: bool = False
    ) -> tuple[float, str, int, int]:
        """(TTFT seconds, the reply, prompt tokens, those cached) of one streamed greedy request;
        `leave`: the client closes its stream after the first token."""
        start = time.perf_counter()
        ttft, text, prompt, cached = 0.0, "", 0, 0
        stream = self.client.chat.completions.create(
            model=self.name,
            messages=messages,
            max_tokens=tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                ttft = ttft or time.perf_counter() - start
                text += chunk.choices[0].delta.content
                if leave:
                    stream.close()
                    break
            if chunk.usage:
                prompt = chunk.usage.prompt_tokens
                cached = chunk.usage.prompt_tokens_details.cached_tokens
        return ttft, text, prompt, cached

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()


def shared_system_prompt(
    server: Server, reps: int, edition: int, leave: bool = False
) -> dict[str, float]:
    """`leave`: the first client asks for 64 tokens and leaves after the first."""
    first, second, cached = [], [], []
    for rep in range(reps):
        system = {"role": "system", "content": system_prompt(edition + rep)}
        question = [system, {"role": "user", "content": "When do you open?"}]
        t1, _, _, _ = server.ask(question, 64 if leave else 4, leave)
        t2, _, _, c = server.ask([system, {"role": "user", "content": "Do you sell cakes?"}], 4)
        first.append(t1)
        second.append(t2)
        cached.append(c)
    return {
        "first": statistics.median(first),
        "second": statistics.median(second),
        "cached": statistics.median(cached),
    }


def interleaved_clients(server: Server, clients: int) -> dict[str, float]:
    """Clients with system prompts of their own, their requests interleaved (A1 B1 C1, then
    A2 B2 C2): each second request finds its prefix among the others'."""
    systems = [{"role": "system", "content": system_prompt(100 + c)} for c in range(clients)]
    first = [server.ask([s, {"role": "user", "content": "When do you open?"}], 4) for s in systems]
    second = [
        server.ask([s, {"role": "user", "content": "Do you sell cakes?"}], 4) for s in systems
    ]
    return {
        "first": statistics.median(r[0] for r in first),
        "second": statistics.median(r[0] for r in second),
        "cached": statistics.median(r[3] for r in second),
    }


def chat_turns(server: Server, turns: int) -> list[tuple[float, int, int]]:
    """Per turn: (TTFT, prompt tokens, those cached)."""
    messages = [{"role": "system", "content": "You are a helpful assistant of a bakery."}]
    out = []
    for turn in range(turns):
        topic = TOPICS[turn % len(TOPICS)]
        messages.append({"role": "user", "content": f"Tell me something about {topic}."})
        ttft, reply, prompt, cached = server.ask(messages, 48)
        messages.append({"role": "assistant", "content": reply})
        out.append((ttft, prompt, cached))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--clients", type=int, default=3)
    args, lock = parse_and_lock(ap)
    shared, left, mixed, chats = {}, {}, {}, {}
    try:
        for label, extra in (("cache", []), ("no cache", ["--cache-mb", "0"])):
            server = Server(args.model, args.threads, *extra)
            try:
                server.ask([{"role": "user", "content": "Hi"}], 2)  # warm the pages, not timed
                shared[label] = shared_system_prompt(server, args.reps, 0)
                left[label] = shared_system_prompt(server, args.reps, 200, leave=True)
                mixed[label] = interleaved_clients(server, args.clients)
                chats[label] = chat_turns(server, args.turns)
            finally:
                server.stop()
    finally:
        lock.close()

    print(
        "| scenario | server | TTFT 1st request ms | TTFT 2nd request ms | 2nd / 1st "
        "| cached tokens |"
    )
    print("|---|---|---|---|---|---|")
    for scenario, runs in (
        ("shared system prompt", shared),
        ("shared system prompt, 1st client leaves early", left),
        (f"{args.clients} clients interleaved", mixed),
    ):
        for label, r in runs.items():
            print(
                f"| {scenario} | {label} | {r['first'] * 1e3:.0f} | {r['second'] * 1e3:.0f} | "
                f"{r['second'] / r['first']:.1%} | {r['cached']:.0f} |"
            )
    print()
    print("| turn | prompt tokens | " + " | ".join(f"TTFT ms, cached ({k})" for k in chats) + " |")
    print("|---" * (2 + len(chats)) + "|")
    for turn in range(args.turns):
        cells = [f"{chats[k][turn][0] * 1e3:.0f}, {chats[k][turn][2]}" for k in chats]
        print(f"| {turn + 1} | {chats['cache'][turn][1]} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
