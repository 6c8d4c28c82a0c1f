"""`edgellm serve --slot-save-path`: POST /slots/{id}?action=save|restore|erase (SmolLM2).

A long system prompt's KV, saved from one server and restored into a new one, serves the next
request that starts with it: the same greedy answer as a cold server, its prefix reported as
cached, and a time to first token a fraction of the cold one. Bad names, ids, actions and files
(truncated, corrupt, another arithmetic's or model's) get one 400 each; the server stays up.
A hostile slot folder (symbolic links at a saved or temporary name, a FIFO, a leased file) never
makes the server write outside it or stall: each refusal comes at once, /health answers within
a second and a stream decoding meanwhile keeps its pace.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import shutil
import signal
import statistics
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import report_line
from pydantic import BaseModel
from test_server import JSON, NAME, Server

CONTEXT = 2048
BLOCK = 16  # the prefix cache's block of tokens
BYTES_PER_TOKEN = 23040  # SmolLM2-135M's bf16 KV: 30 layers x 3 KV heads x 64 dims x 2 x 2 bytes
# About 1,900 tokens of house rules: a system prompt worth keeping across restarts.
SYSTEM = "You are the assistant of the Riverside Bakery. House rules follow.\n" + "\n".join(
    f"Rule {i}: on day {i} of the month the bakery opens at {6 + i % 4} am, bakes "
    f"{['rye', 'spelt', 'sourdough', 'brioche', 'barley'][i % 5]} bread and closes at "
    f"{2 + i % 5} pm; orders over {10 + i} loaves need a day's notice."
    for i in range(1, 41)
)
SAVED_QUESTION = "What are the opening hours?"
# Each differs from the others (and the saved one) from its first word: each request reuses
# the restored system prompt and nothing it stored itself.
QUESTIONS = [
    "Which bread is baked on day 7?",
    "Summarise rule 12 in one sentence.",
    "How many loaves need a day's notice on day 3?",
]


class SlotSaved(BaseModel):
    id_slot: int
    filename: str
    n_saved: int
    n_written: int
    timings: dict[str, float]


class SlotRestored(BaseModel):
    id_slot: int
    filename: str
    n_restored: int
    n_cached: int
    n_read: int
    timings: dict[str, float]


class ErrorReply(BaseModel):
    error: dict[str, Any]


def post(server: Server, path: str, body: Any, timeout: float = 120) -> tuple[int, dict[str, Any]]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(server.url + path, data=data, method="POST", headers=JSON)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        reply = json.loads(e.read())
        ErrorReply.model_validate(reply)
        return e.code, reply


def slot(server: Server, action: str, filename: str, slot_id: int | str = 0) -> Any:
    status, reply = post(server, f"/slots/{slot_id}?action={action}", {"filename": filename})
    assert status == 200, reply
    return (SlotSaved if action == "save" else SlotRestored).model_validate(reply)


def refused(server: Server, path: str, body: Any, *words: str) -> dict[str, Any]:
    status, reply = post(server, path, body)
    assert status == 400, (path, body, reply)
    for w in words:
        assert w in reply["error"]["message"], (path, body, reply)
    return reply["error"]


def messages(question: str, system: str = SYSTEM) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def tokens(server: Server, question: str) -> list[int]:
    status, reply = post(server, "/tokenize", {"model": NAME, "messages": messages(question)})
    assert status == 200, reply
    return reply["tokens"]


def ask(server: Server, question: str) -> tuple[str, int, float]:
    """Greedy, streamed: the answer, its cached prompt tokens and the time to its first token
    (the first chunk with text: the role chunk comes before the prefill)."""
    start = time.perf_counter()
    stream = server.client.chat.completions.create(
        model=NAME,
        messages=messages(question),
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, ttft, usage = "", None, None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            ttft = ttft or time.perf_counter() - start
            text += chunk.choices[0].delta.content
        usage = chunk.usage or usage
    assert ttft is not None and usage is not None
    return text, usage.prompt_tokens_details.cached_tokens, ttft


def test_a_saved_system_prompt_survives_a_restart(smollm2_checkpoint: Path, tmp_path: Path) -> None:
    saving = Server(smollm2_checkpoint, "--slot-save-path", str(tmp_path), max_context=CONTEXT)
    try:
        body = {"model": NAME, "messages": messages(SAVED_QUESTION), "max_tokens": 8}
        status, reply = post(saving, "/v1/chat/completions", {**body, "temperature": 0})
        assert status == 200 and reply["id_slot"] == 0, reply  # one request after another: slot 0
        n = reply["usage"]["prompt_tokens"]
        assert n >= 1000
        saved = slot(saving, "save", "system.bin")
        assert saved.n_saved == n // BLOCK * BLOCK  # every whole block of the prompt
        assert saved.n_written == (tmp_path / "system.bin").stat().st_size
        assert saved.n_written > saved.n_saved * BYTES_PER_TOKEN
        saved_tokens = tokens(saving, SAVED_QUESTION)
        expected = {q: tokens(saving, q) for q in QUESTIONS}
    finally:
        assert saving.stop() == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["system.bin"]  # no temporary left

    cold_server = Server(smollm2_checkpoint, "--cache-mb", "0", max_context=CONTEXT)
    try:
        cold = {q: ask(cold_server, q) for q in QUESTIONS}
    finally:
        assert cold_server.stop() == 0
    assert all(cached == 0 for _, cached, _ in cold.values())

    restored_server = Server(
        smollm2_checkpoint, "--slot-save-path", str(tmp_path), max_context=CONTEXT
    )
    try:
        restored = slot(restored_server, "restore", "system.bin")
        assert restored.n_restored == restored.n_cached == saved.n_saved
        assert restored.n_read == saved.n_written
        warm = {q: ask(restored_server, q) for q in QUESTIONS}
    finally:
        assert restored_server.stop() == 0

    for q in QUESTIONS:
        assert warm[q][0] == cold[q][0], q  # greedy: the cold server's answer
        # What the restored blocks cover of this prompt: the whole blocks it shares with the
        # saved one, leaving at least a block to compute.
        shared = 0
        while saved_tokens[shared] == expected[q][shared]:
            shared += 1
        reuse = min(shared // BLOCK, (len(expected[q]) - BLOCK) // BLOCK) * BLOCK
        assert warm[q][1] == reuse > 1000, q
    cold_ttft = statistics.median(t for _, _, t in cold.values())
    warm_ttft = statistics.median(t for _, _, t in warm.values())
    line = (
        f"TTFT of a {len(expected[QUESTIONS[0]])}-token prompt: cold {cold_ttft * 1e3:.0f} ms, "
        f"with {warm[QUESTIONS[0]][1]} tokens restored from a slot file {warm_ttft * 1e3:.0f} ms "
        f"({warm_ttft / cold_ttft:.1%}); save {saved.timings['save_ms']:.0f} ms, "
        f"restore {restored.timings['restore_ms']:.0f} ms ({saved.n_written / 1e6:.1f} MB)"
    )
    print(line)
    report_line("slot save/restore", line)
    assert warm_ttft <= 0.1 * cold_ttft, line


@pytest.fixture(scope="module")
def other_arithmetic_file(
    smollm2_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A slot file of the same model with an fp32 KV cache (another layout of block bytes)."""
    d = tmp_path_factory.mktemp("fp32")
    s = Server(
        smollm2_checkpoint, "--slot-save-path", str(d), "--kv-cache", "fp32", max_context=CONTEXT
    )
    try:
        post(
            s, "/v1/chat/completions", {"model": NAME, "messages": messages("Hi"), "max_tokens": 1}
        )
        slot(s, "save", "fp32.bin")
    finally:
        assert s.stop() == 0
    return d / "fp32.bin"


def test_names_ids_actions_and_files_are_checked(
    smollm2_checkpoint: Path, tmp_path: Path, other_arithmetic_file: Path
) -> None:
    d = tmp_path / "slots"
    s = Server(smollm2_checkpoint, "--slot-save-path", str(d), max_context=CONTEXT)
    try:
        refused(s, "/slots/1?action=save", {"filename": "a.bin"}, "slot 1 has no prompt to save")
        post(
            s, "/v1/chat/completions", {"model": NAME, "messages": messages("Hi"), "max_tokens": 1}
        )
        good = slot(s, "save", "good.bin")
        assert good.n_saved > 1000

        for name in ["../x.bin", "/etc/passwd", "a/b", "", ".hidden", "..", "x" * 129, "a\\b"]:
            for action in ("save", "restore"):
                e = refused(s, f"/slots/0?action={action}", {"filename": name}, "plain file name")
                assert e["param"] == "filename"
        assert not (tmp_path / "x.bin").exists() and sorted(p.name for p in d.iterdir()) == [
            "good.bin"
        ]
        for path in ["/slots/8?action=save", "/slots/-1?action=save", "/slots/x?action=save"]:
            refused(s, path, {"filename": "a.bin"}, "no slot")
        refused(s, "/slots/0?action=load", {"filename": "a.bin"}, "unknown action 'load'")
        refused(s, "/slots/0", {"filename": "a.bin"}, "unknown action")
        refused(s, "/slots/0?action=save", {}, "'filename'")
        refused(s, "/slots/0?action=save", {"filename": "a.bin", "mode": 1}, "'mode'")
        refused(s, "/slots/0?action=save", b"{not json", "")

        data = (d / "good.bin").read_bytes()
        model_hash = 8 + 5 * 4 + 8 + 8  # magic, five u32, the dtype, block_bytes
        files = {
            "short.bin": (data[: len(data) // 2], "truncated"),
            "tiny.bin": (data[:20], "shorter than the header"),
            "junk.bin": (b"not a slot file at all" * 10, "not a prefix-cache file"),
            "other.bin": (
                data[:model_hash] + bytes(8) + data[model_hash + 8 :],
                "saved by another model",
            ),
            "flipped.bin": (data[:-100] + bytes([data[-100] ^ 1]) + data[-99:], "corrupt"),
        }
        for name, (content, _) in files.items():
            (d / name).write_bytes(content)
        shutil.copy(other_arithmetic_file, d / "fp32.bin")
        files["fp32.bin"] = (b"", "KV dtype fp32 (here bf16)")
        files["missing.bin"] = (b"", "missing.bin: cannot open")
        for name, (_, words) in files.items():
            e = refused(s, "/slots/0?action=restore", {"filename": name}, words)
            assert str(d) not in e["message"], e  # the client's name, not the server's path

        status, body = s.get("/health")
        assert status == 200
        again = slot(s, "restore", "good.bin")
        assert again.n_restored == good.n_saved
        status, erased = post(s, "/slots/0?action=erase", {})
        assert status == 200 and erased == {"id_slot": 0, "n_erased": good.n_saved}
        refused(s, "/slots/0?action=save", {"filename": "a.bin"}, "no prompt to save")
    finally:
        assert s.stop() == 0


def test_slot_routes_are_off_by_default(smollm2_checkpoint: Path) -> None:
    s = Server(smollm2_checkpoint)
    try:
        e = refused(s, "/slots/0?action=save", {"filename": "a.bin"}, "--slot-save-path DIR")
        assert e["code"] == "slot_saving_off"
    finally:
        assert s.stop() == 0


class Stream:
    """A greedy stream of `n` tokens decoding in the background: the times its chunks came."""

    def __init__(self, server: Server, n: int) -> None:
        self.times: list[float] = []
        self.completion_tokens = 0
        self.thread = threading.Thread(target=self.run, args=(server, n))
        self.thread.start()

    def run(self, server: Server, n: int) -> None:
        stream = server.client.chat.completions.create(
            model=NAME,
            messages=[{"role": "user", "content": "Tell me a long story about a bakery."}],
            max_tokens=n,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                self.times.append(time.perf_counter())
            if chunk.usage:
                self.completion_tokens = chunk.usage.completion_tokens

    def wait_for_tokens(self, n: int) -> None:
        deadline = time.perf_counter() + 60
        while len(self.times) < n and self.thread.is_alive() and time.perf_counter() < deadline:
            time.sleep(0.01)
        assert len(self.times) >= n, "the stream did not start"

    def join(self) -> None:
        self.thread.join(timeout=120)
        assert not self.thread.is_alive()

    def during(self, start: float, end: float) -> int:
        return sum(start <= t <= end for t in self.times)


def quick_refusal(server: Server, name: str, *words: str) -> float:
    """Restores `name`: a 400 naming it and `words`; returns how long it took. /health answers
    within a second right after."""
    start = time.perf_counter()
    status, reply = post(server, "/slots/0?action=restore", {"filename": name}, timeout=30)
    took = time.perf_counter() - start
    assert status == 400, reply
    for w in (name, *words):
        assert w in reply["error"]["message"], reply
    health = time.perf_counter()
    assert server.get("/health")[0] == 200
    assert time.perf_counter() - health < 1.0
    return took


@pytest.fixture
def sigio_ignored():
    """A broken lease signals its holder with SIGIO, whose default action ends the process."""
    previous = signal.signal(signal.SIGIO, signal.SIG_IGN)
    yield
    signal.signal(signal.SIGIO, previous)


def test_a_hostile_slot_folder_neither_leaks_nor_stalls(
    smollm2_checkpoint: Path, tmp_path: Path, sigio_ignored: None
) -> None:
    d, outside = tmp_path / "slots", tmp_path / "outside"
    d.mkdir()
    outside.mkdir()
    victim = outside / "victim"
    victim.write_text("keep")
    s = Server(
        smollm2_checkpoint, "--slot-save-path", str(d), "--parallel", "2", max_context=CONTEXT
    )
    try:
        body = {"model": NAME, "messages": messages(SAVED_QUESTION), "max_tokens": 1}
        post(s, "/v1/chat/completions", body)
        good = slot(s, "save", "good.bin")

        # A link at the saved name, and at the temporary name a save used to write first
        # (DIR/.NAME.tmp<pid>): the save replaces the first and never touches the second.
        (d / "link.bin").symlink_to(victim)
        (d / f".old.bin.tmp{s.proc.pid}").symlink_to(victim)
        assert slot(s, "save", "link.bin").n_written == good.n_written
        assert slot(s, "save", "old.bin").n_written == good.n_written
        assert victim.read_text() == "keep" and sorted(p.name for p in outside.iterdir()) == [
            "victim"
        ]
        assert (d / "link.bin").is_file() and not (d / "link.bin").is_symlink()
        assert (d / f".old.bin.tmp{s.proc.pid}").is_symlink()

        # A link to a good slot file outside the folder is not followed.
        shutil.copy(d / "good.bin", outside / "good.bin")
        (d / "out.bin").symlink_to(outside / "good.bin")
        quick_refusal(s, "out.bin", "a symbolic link, which is not followed")

        # While a stream decodes: a FIFO nobody writes to (an open() that waits for a writer)
        # and a leased file (an open() that waits up to /proc/sys/fs/lease-break-time, 45 s, for
        # the lease's holder) are refused at once, and the stream never pauses for them.
        os.mkfifo(d / "fifo.bin")
        shutil.copy(d / "good.bin", d / "leased.bin")
        lease = os.open(d / "leased.bin", os.O_RDONLY)
        fcntl.fcntl(lease, fcntl.F_SETLEASE, fcntl.F_WRLCK)
        stream = Stream(s, 400)
        try:
            stream.wait_for_tokens(5)
            start = time.perf_counter()
            took = [
                quick_refusal(s, "fifo.bin", "not a regular file (a FIFO)"),
                quick_refusal(s, "leased.bin", "busy (another process holds a lease"),
                quick_refusal(s, "fifo.bin", "not a regular file (a FIFO)"),
            ]
            end = time.perf_counter()
        finally:
            stream.join()
            os.close(lease)
        assert max(took) < 1.0, took
        assert stream.during(end, end + 3600) > 0, "the stream went on after the attack"
        assert stream.completion_tokens == 400
        status, reply = post(s, "/slots/0?action=restore", {"filename": "leased.bin"})
        assert status == 200, reply  # the lease gone, the file restores
        report_line(
            "slot save/restore",
            f"hostile slot folder: FIFO and leased file refused in {max(took) * 1e3:.0f} ms "
            f"(a stream decoding meanwhile: {stream.during(start, end)} tokens during the attack)",
        )
    finally:
        assert s.stop() == 0
    assert victim.read_text() == "keep"


def test_a_stream_keeps_its_pace_while_slots_are_saved_and_restored(
    smollm2_checkpoint: Path, tmp_path: Path
) -> None:
    """The scheduler thread only copies a slot's blocks; writing and reading the file (here
    43 MB, written and flushed to disk each time) happen beside the decoding streams. A budget,
    not a proof: from the page cache a file this size takes about a decode step either way (the
    file I/O on the scheduler thread measured the same); the files that did stall every stream,
    a FIFO and a leased file, are the hostile folder's test above."""
    s = Server(
        smollm2_checkpoint,
        "--slot-save-path",
        str(tmp_path),
        "--parallel",
        "2",
        max_context=CONTEXT,
    )
    try:
        body = {"model": NAME, "messages": messages(SAVED_QUESTION), "max_tokens": 1}
        post(s, "/v1/chat/completions", body)
        warm = slot(s, "save", "warm.bin")  # the fingerprint's probe prefill, once
        stream = Stream(s, 600)
        ops: list[tuple[float, float]] = []
        try:
            stream.wait_for_tokens(5)
            for i in range(4):
                start = time.perf_counter()
                slot(s, "save", f"s{i}.bin")
                slot(s, "restore", f"s{i}.bin")
                ops.append((start, time.perf_counter()))
        finally:
            stream.join()
    finally:
        assert s.stop() == 0
    gaps = [b - a for a, b in itertools.pairwise(stream.times)]
    tokens_during = sum(stream.during(a, b) for a, b in ops)
    op_ms = statistics.median(b - a for a, b in ops) * 1e3
    line = (
        f"a stream beside 4 save+restore pairs of a {warm.n_written / 1e6:.0f} MB slot file: "
        f"pair median {op_ms:.0f} ms, {tokens_during} tokens streamed during them, longest gap "
        f"{max(gaps) * 1e3:.0f} ms (median {statistics.median(gaps) * 1e3:.0f} ms)"
    )
    print(line)
    report_line("slot save/restore", line)
    assert stream.completion_tokens == 600 and tokens_during > 0, line
    assert max(gaps) < 1.0, line  # the budget /health has too
