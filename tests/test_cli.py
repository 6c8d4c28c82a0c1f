"""`edgellm run` and `make run` as a user drives them (the real binary, real model).

Output contract: the answer alone on stdout, figures on stderr (or one JSON object with
--json); sampling knobs reachable from make; TPS timed over N_TOKENS; numeric errors that
say the bound; PROMPT passed literally; a note while waiting on the CPU lock.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import EDGELLM_BIN, REPO, assert_one_line_error

pytestmark = pytest.mark.usefixtures("smollm2_run")
DEPLOYMENT = REPO / "llms" / "smollm2_135m"


def run(cmd: list[str], *args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*cmd, "--threads", "2", *args], capture_output=True, text=True, timeout=180, **kw
    )


def as_json(cmd: list[str], *args: str) -> dict:
    proc = run(cmd, "--json", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_version() -> None:
    proc = subprocess.run([str(EDGELLM_BIN), "--version"], capture_output=True, text=True)
    assert proc.returncode == 0
    assert re.fullmatch(r"edgellm \d+\.\d+\.\d+\n", proc.stdout)


def test_answer_alone_on_stdout_figures_on_stderr(smollm2_run: list[str]) -> None:
    proc = run(smollm2_run, "--n-tokens", "12")
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout
    assert "TTFT" not in proc.stdout and "TPS" not in proc.stdout
    assert "TTFT (prefill)" in proc.stderr and "TPS (decode)" in proc.stderr


def test_json_figures(smollm2_run: list[str]) -> None:
    j = as_json(smollm2_run, "--n-tokens", "6")
    assert j["deployment"] == "smollm2_135m" and j["model"] == "instruct"
    assert j["answer"].startswith("The capital of France")
    assert j["prompt_tokens"] > 0 and j["answer_tokens"] == 6 and not j["stopped_at_eos"]
    assert j["decode_steps"] == 5 and j["tokens_per_s"] > 0 and j["ttft_ms"] > 0


def test_fast_by_default_exact_on_request_and_reported(smollm2_run: list[str]) -> None:
    args = ["--n-tokens", "6", "--max-context", "256"]
    fast = as_json(smollm2_run, *args)
    exact = as_json(smollm2_run, *args, "--exact")
    fast_fp32_kv = as_json(smollm2_run, *args, "--kv-cache", "fp32")
    assert fast["precision"].startswith("fast (") and exact["precision"].startswith("exact (")
    assert fast["kv_cache_dtype"] == "bf16" and exact["kv_cache_dtype"] == "fp32"
    assert fast_fp32_kv["kv_cache_dtype"] == "fp32" and "GEMM" in fast_fp32_kv["precision"]
    assert fast["kv_cache_bytes"] * 2 == exact["kv_cache_bytes"] > 0
    for r in (fast, exact):
        assert r["answer"].startswith("The capital of France"), r["answer"]
    proc = run(smollm2_run, "--n-tokens", "2", "--max-context", "256")
    assert "KV cache:         bf16, 5.9 MB for 256 positions" in proc.stderr, proc.stderr
    assert "arithmetic:       fast (" in proc.stderr, proc.stderr
    env = {**os.environ, "EDGELLM_PRECISION": "exact"}  # the front end's default
    proc = subprocess.run(
        [*smollm2_run, "--n-tokens", "2", "--max-context", "256"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert "arithmetic:       exact (" in proc.stderr, proc.stderr


def test_resident_memory_is_reported(smollm2_run: list[str]) -> None:
    """`run` prints the process's resident set: the KV cache is touched at setup, so 8192
    positions hold ~180 MB more than 256 do, and the peak is never below the present."""
    small = as_json(smollm2_run, "--n-tokens", "2", "--max-context", "256")
    large = as_json(smollm2_run, "--n-tokens", "2", "--max-context", "8192")
    grown = large["resident_bytes"] - small["resident_bytes"]
    kv_grown = large["kv_cache_bytes"] - small["kv_cache_bytes"]
    assert 0.9 * kv_grown <= grown <= 1.1 * kv_grown + 20e6, (grown, kv_grown)
    for r in (small, large):
        assert r["peak_resident_bytes"] >= r["resident_bytes"] > 100e6, r
    proc = run(smollm2_run, "--n-tokens", "2", "--max-context", "256")
    assert re.search(r"resident memory:  \d+\.\d MB \(peak \d+\.\d MB\)", proc.stderr), proc.stderr


def test_tps_over_all_n_tokens_with_ignore_eos(smollm2_run: list[str]) -> None:
    """The default answer ends at EOS after a few tokens; --ignore-eos still times them all."""
    stopped = as_json(smollm2_run, "--n-tokens", "30")
    assert stopped["stopped_at_eos"] and stopped["decode_steps"] < 29
    timed = as_json(smollm2_run, "--n-tokens", "30", "--ignore-eos")
    assert timed["decode_steps"] == 29 and timed["stopped_at_eos"]
    assert timed["answer"] == stopped["answer"]  # nothing past EOS is printed
    early = run(smollm2_run, "--n-tokens", "30")
    assert f"TPS over {stopped['decode_steps']} steps only" in early.stderr, early.stderr


def test_stop_string_ends_the_answer(smollm2_run: list[str]) -> None:
    """--stop goes to generate(): the answer is cut before it; --ignore-eos still times all."""
    plain = as_json(smollm2_run, "--n-tokens", "20")
    assert "Paris" in plain["answer"] and not plain["stopped_at_stop_string"]
    cut = as_json(smollm2_run, "--n-tokens", "20", "--stop", "Paris", "--stop", "Berlin")
    assert cut["answer"] == plain["answer"][: plain["answer"].index("Paris")]
    assert cut["stopped_at_stop_string"] and not cut["stopped_at_eos"]
    assert cut["decode_steps"] < plain["decode_steps"]
    timed = as_json(smollm2_run, "--n-tokens", "20", "--stop", "Paris", "--ignore-eos")
    assert timed["answer"] == cut["answer"] and timed["decode_steps"] == 19
    text = run(smollm2_run, "--n-tokens", "20", "--stop", "Paris")
    assert text.stdout.strip() == cut["answer"].strip()
    assert "ended at a --stop string" in text.stderr, text.stderr


def test_greedy_equals_sampling_from_the_top_token_only(smollm2_run: list[str]) -> None:
    # Temperature 0 is the default, so comparing it to itself proves nothing; the sampling
    # path (temperature > 0) with top-k 1 must pick the argmax too, whatever the seed, and
    # without the cut-off the same seed samples something else.
    prompt = ["--n-tokens", "24", "--prompt", "Tell me about cats.", "--ignore-eos"]
    greedy = as_json(smollm2_run, *prompt)
    for seed in ("1", "2"):
        top1 = as_json(smollm2_run, *prompt, "--temperature", "1.5", "--top-k", "1", "--seed", seed)
        assert top1["answer"] == greedy["answer"], seed
    hot = as_json(smollm2_run, *prompt, "--temperature", "1.5", "--seed", "1")
    assert hot["answer"] != greedy["answer"]


def test_seed_reproduces_and_random_seed_is_printed(smollm2_run: list[str]) -> None:
    args = ["--n-tokens", "16", "--prompt", "Tell me about cats.", "--temperature", "1.2"]
    a = as_json(smollm2_run, *args, "--seed", "7")
    b = as_json(smollm2_run, *args, "--seed", "7")
    c = as_json(smollm2_run, *args, "--seed", "8")
    assert a["answer"] == b["answer"] and a["seed"] == 7
    assert c["answer"] != a["answer"]
    proc = run(smollm2_run, "--json", *args)
    m = re.search(r"random seed (\d+)", proc.stderr)
    assert m, proc.stderr
    again = as_json(smollm2_run, *args, "--seed", m.group(1))
    assert json.loads(proc.stdout)["answer"] == again["answer"]


@pytest.mark.parametrize(
    "args,message",
    [
        (["--n-tokens", "0"], "--n-tokens: must be >= 1 (got 0)"),
        (["--n-tokens", "many"], "--n-tokens: must be an integer >= 1 (got many)"),
        (["--max-context", "-5"], "--max-context: must be >= 1 (got -5)"),
        (["--threads", "-1"], "--threads: must be >= 0 (got -1)"),
        (["--temperature", "-0.5"], "--temperature: must be >= 0 (got -0.5)"),
        (["--top-p", "1.5"], "--top-p: must be in [0, 1] (got 1.5)"),
        (["--top-k", "-2"], "--top-k: must be >= 0 (got -2)"),
        (["--seed", "-1"], "--seed: must be an integer >= 0 (got -1)"),
    ],
)
def test_numeric_option_errors_name_the_bound(
    smollm2_run: list[str], args: list[str], message: str
) -> None:
    assert_one_line_error(run(smollm2_run, *args), message, code=2)


def test_empty_prompt_is_an_error(smollm2_run: list[str]) -> None:
    assert_one_line_error(run(smollm2_run, "--prompt", ""), "--prompt is empty", code=2)


def test_prefill_progress_on_a_terminal(smollm2_run: list[str]) -> None:
    """On a terminal a slow prefill shows a note, erased when done (delay lowered to 0 here)."""
    pid, fd = pty.fork()
    if pid == 0:
        os.environ["EDGELLM_PROGRESS_DELAY_MS"] = "0"
        os.execv(smollm2_run[0], [*smollm2_run, "--threads", "1", "--n-tokens", "2"])
    out = b""
    while True:
        ready, _, _ = select.select([fd], [], [], 120)
        if not ready:
            break
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    os.waitpid(pid, 0)
    text = out.decode(errors="replace")
    assert re.search(r"\[prefill of \d+ tokens: \d+\.\d s\]", text), text
    assert "\x1b[K" in text  # the note is erased before the answer
    # Not on a pipe: the same run without a terminal prints no note.
    piped = run(
        smollm2_run, "--n-tokens", "2", env={**os.environ, "EDGELLM_PROGRESS_DELAY_MS": "0"}
    )
    assert "[prefill" not in piped.stderr


# --- make -------------------------------------------------------------------------------


@pytest.fixture
def echo_bin(tmp_path: Path) -> Path:
    """A stand-in for the edgellm command that prints the argv it was given."""
    script = tmp_path / "echo_args"
    script.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    script.chmod(0o755)
    return script


def make_argv(*args: str) -> list[str]:
    """A deployment target without rebuilding or fetching (CI's `make test` covers those), on
    a lock of its own: the shared CPU lock may be held by someone's timed run for minutes."""
    lock = Path(os.environ.get("TMPDIR", "/tmp")) / f"edgellm-test-{os.getpid()}.lock"
    return ["make", "--no-print-directory", "-C", str(DEPLOYMENT)] + [
        "-o", "compile", "-o", "fetch", f"LOCK={lock}", *args
    ]  # fmt: skip


def make(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        make_argv(*args),
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def argv_of(proc: subprocess.CompletedProcess[str]) -> list[str]:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_make_run_passes_prompt_literally(echo_bin: Path) -> None:
    prompt = "cost is $5 and $HOME, \"quoted\" 'single' `tick` $(echo no)"
    argv = argv_of(make("run", f"BIN={echo_bin}", f"PROMPT={prompt}"))
    assert argv[argv.index("--prompt") + 1] == prompt
    from_env = argv_of(make("run", f"BIN={echo_bin}", env={"PROMPT": prompt}))
    assert from_env[from_env.index("--prompt") + 1] == prompt


def test_make_run_defaults_and_knobs(echo_bin: Path) -> None:
    argv = argv_of(make("run", f"BIN={echo_bin}"))
    assert argv[:3] == ["run", "--deployment", "smollm2_135m"]  # the deployment is a preset
    assert "--prompt" not in argv  # unset PROMPT: the descriptor's default prompt
    assert argv[argv.index("--model") + 1] == "instruct"  # deployment.json's default_model
    assert argv[argv.index("--n-tokens") + 1] == "100" and "--ignore-eos" in argv
    knobs = argv_of(
        make("run", f"BIN={echo_bin}", "TEMPERATURE=0.8", "TOP_K=40", "TOP_P=0.9", "SEED=3")
    )
    for flag, value in [
        ("--temperature", "0.8"),
        ("--top-k", "40"),
        ("--top-p", "0.9"),
        ("--seed", "3"),
    ]:
        assert knobs[knobs.index(flag) + 1] == value
    profile = argv_of(make("profile", f"BIN={echo_bin}", "N_TOKENS=7"))
    assert profile[profile.index("--n-tokens") + 1] == "7" and "--profile" in profile
    gguf = "/somewhere/model.gguf"  # a path goes through as it is (nothing to fetch)
    path = argv_of(make("run", f"BIN={echo_bin}", f"MODEL={gguf}"))
    assert path[path.index("--model") + 1] == gguf


def test_make_run_empty_prompt_is_an_error() -> None:
    proc = make("run", "PROMPT=", f"BIN={EDGELLM_BIN}")
    assert proc.returncode != 0
    assert "error: --prompt is empty" in proc.stderr


def test_make_says_when_it_waits_for_the_cpu_lock(echo_bin: Path) -> None:
    argv = make_argv("run", f"BIN={echo_bin}")
    lock_path = next(a for a in argv if a.startswith("LOCK=")).removeprefix("LOCK=")
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1.5)
        assert proc.poll() is None  # still waiting
        fcntl.flock(lock, fcntl.LOCK_UN)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "waiting for the CPU lock" in err
    assert json.loads(out)[0] == "run"  # and then it ran


def test_fetch_progress_only_on_a_terminal() -> None:
    """fetch_model.py's long steps (dequantizing hundreds of tensors) count on a terminal."""
    code = (
        "import fetch_model as f\nfor i in range(1, 4): f.progress(i, 3, 'dequantizing tensor')\n"
    )
    argv = [sys.executable, "-c", code]
    env = {**os.environ, "PYTHONPATH": str(REPO / "scripts")}
    pid, fd = pty.fork()
    if pid == 0:
        os.execve(sys.executable, argv, env)
    out = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    os.waitpid(pid, 0)
    assert "\r[fetch_model] dequantizing tensor 3/3" in out.decode(), out
    piped = subprocess.run(argv, capture_output=True, text=True, env=env, check=True)
    assert piped.stdout == ""


# --- the one command: subcommands, llama.cpp's short flags, -f, --system, --min-p --------

VARYING = (  # timings and resident memory differ run to run
    "setup_ms",
    "ttft_ms",
    "decode_ms",
    "tokens_per_s",
    "resident_bytes",
    "peak_resident_bytes",
)


def same_run(a: dict, b: dict) -> bool:
    return {k: v for k, v in a.items() if k not in VARYING} == {
        k: v for k, v in b.items() if k not in VARYING
    }


def test_short_flags_equal_long_flags(smollm2_run: list[str], smollm2_checkpoint: Path) -> None:
    """Each short (or llama.cpp) name sets what its long name sets: the same seeded sample,
    the same context, threads and length (a flag bound to the wrong option changes one)."""
    prompt = "Tell me about cats."
    sampled = ["--top-k", "40", "--top-p", "0.95", "--min-p", "0.02", "--ignore-eos"]

    def as_json(*args: str) -> dict:  # without run()'s --threads
        proc = subprocess.run([*args, "--json"], capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    long = as_json(
        str(EDGELLM_BIN), "run", "--deployment", "smollm2_135m",
        "--model", str(smollm2_checkpoint), "--prompt", prompt, "--n-tokens", "12",
        "--max-context", "192", "--threads", "1", "--seed", "11", "--temperature", "1.3", *sampled,
    )  # fmt: skip
    short = as_json(
        str(EDGELLM_BIN), "run",
        "-m", str(smollm2_checkpoint), "-p", prompt, "-n", "12",
        "-c", "192", "-t", "1", "-s", "11", "--temp", "1.3", *sampled,
    )  # fmt: skip
    llama = as_json(
        str(EDGELLM_BIN), "run",
        "-m", str(smollm2_checkpoint), "-p", prompt, "--n-predict", "12",
        "--ctx-size", "192", "-t", "1", "-s", "11", "--temp", "1.3", *sampled,
    )  # fmt: skip
    assert same_run(long, short) and same_run(long, llama), (long, short, llama)
    assert long["threads"] == 1 and long["seed"] == 11 and long["answer_tokens"] == 12
    assert (
        long["kv_cache_bytes"] == 2 * as_json(*smollm2_run, "-n", "1", "-c", "96")["kv_cache_bytes"]
    )


def test_prompt_file_equals_the_prompt(smollm2_run: list[str], tmp_path: Path) -> None:
    text = "Name three colours, please."
    path = tmp_path / "prompt.txt"
    path.write_text(text + "\n")  # one trailing newline is dropped, as llama.cpp's -f does
    from_file = as_json(smollm2_run, "-f", str(path), "-n", "10")
    inline = as_json(smollm2_run, "-p", text, "-n", "10")
    default = as_json(smollm2_run, "-n", "10")
    assert same_run(from_file, inline)
    assert from_file["prompt_tokens"] != default["prompt_tokens"]  # the file was read
    path.write_text(text + "\n\n")
    assert (
        as_json(smollm2_run, "--file", str(path), "-n", "1")["prompt_tokens"]
        > (inline["prompt_tokens"])
    )


def test_system_message_is_in_the_prompt_tokens(
    smollm2_run: list[str], smollm2_checkpoint: Path
) -> None:
    """--system replaces the template's default system turn: the prompt is HF's rendering."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_checkpoint)
    prompt, system = "What is the capital of France?", "You are a pirate. Answer like one."

    def hf_tokens(messages: list[dict[str, str]]) -> int:
        return len(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))

    user = {"role": "user", "content": prompt}
    plain = as_json(smollm2_run, "-p", prompt, "-n", "1")
    with_system = as_json(smollm2_run, "-p", prompt, "--system", system, "-n", "1")
    assert plain["prompt_tokens"] == hf_tokens([user])
    assert with_system["prompt_tokens"] == hf_tokens([{"role": "system", "content": system}, user])
    assert with_system["prompt_tokens"] != plain["prompt_tokens"]


def test_min_p_one_is_greedy(smollm2_run: list[str]) -> None:
    """--min-p reaches the sampler: 1 keeps only the top token whatever the temperature."""
    args = ["-n", "16", "-p", "Tell me about cats.", "--ignore-eos"]
    greedy = as_json(smollm2_run, *args)
    top = as_json(smollm2_run, *args, "--temp", "1.5", "--min-p", "1", "-s", "1")
    hot = as_json(smollm2_run, *args, "--temp", "1.5", "-s", "1")
    assert top["answer"] == greedy["answer"] and hot["answer"] != greedy["answer"]


def test_bench_times_all_tokens_and_prints_figures_only(smollm2_run: list[str]) -> None:
    bench = [str(EDGELLM_BIN), "bench", "--deployment", "smollm2_135m"]
    j = as_json(bench, "-n", "30", "-c", "256")
    assert j["decode_steps"] == 29 and j["stopped_at_eos"]  # past EOS, as --ignore-eos
    proc = run(bench, "-n", "4", "-c", "256")
    assert proc.returncode == 0, proc.stderr
    assert "TPS (decode)" in proc.stdout and "Paris" not in proc.stdout


@pytest.mark.parametrize(
    "subcommand,flags",
    [
        (
            "run",
            [
                "-m,--model",
                "-p,--prompt",
                "-f,--file",
                "--system",
                "--min-p",
                "--json",
                "-j,--json-schema",
                "--json-object",
            ],
        ),
        (
            "chat",
            [
                "-n,--n-tokens,--n-predict",
                "-c,--max-context,--ctx-size",
                "--system",
                "-j,--json-schema",
                "--json-object",
            ],
        ),
        ("bench", ["-t,--threads", "-s,--seed", "--temperature,--temp", "--profile"]),
        ("serve", ["--host", "--port", "--parallel", "-m,--model", "--deployment"]),
        ("verify", ["--full", "--max-prompts", "--weights", "-m,--model"]),
    ],
)
def test_each_subcommand_lists_its_flags(subcommand: str, flags: list[str]) -> None:
    proc = subprocess.run([str(EDGELLM_BIN), subcommand, "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout.splitlines()[1].startswith(f"Usage: edgellm {subcommand} [OPTIONS]")
    for flag in flags:
        assert f"  {flag} " in proc.stdout, (flag, proc.stdout)


def test_help_lists_the_subcommands() -> None:
    proc = subprocess.run([str(EDGELLM_BIN), "--help"], capture_output=True, text=True)
    assert proc.returncode == 0
    listed = re.findall(r"^  (\w+) ", proc.stdout.split("Subcommands:")[1], re.M)
    assert listed == ["run", "chat", "bench", "serve", "verify"]


def test_verify_execs_the_runner_in_the_venv(echo_bin: Path, tmp_path: Path) -> None:
    """A venv whose python prints its argv: verify hands the gate's flags to the runner."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(echo_bin)
    env = {**os.environ, "EDGELLM_VENV": str(venv)}
    proc = subprocess.run(
        [str(EDGELLM_BIN), "verify", "--deployment", "gemma3_270m", "--", "--spec-gate"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    argv = json.loads(proc.stdout)
    assert argv[0].endswith("llms/verify/verify_runner.py")
    assert argv[1:] == [
        "--runner=gemma3_270m.verify_adapter", "--prompts", "topk_token", "--model", "base",
        "--threads", "0", "--max-prompts", "2", "--spec-gate",
    ]  # fmt: skip
    full = json.loads(
        subprocess.run(
            [str(EDGELLM_BIN), "verify", "-m", "gguf", "--full", "--weights", "q8_0"],
            capture_output=True, text=True, env=env, timeout=60, check=True,
        ).stdout
    )  # fmt: skip
    assert "--max-prompts" not in full and full[full.index("--model") + 1] == "gguf"
    assert full[full.index("--weights") + 1] == "q8_0"
