"""Bad input to `edgellm run`: one clear line on stderr, non-zero exit.

Each case damages a copy of the real checkpoint in a temp dir (truncation,
bit flips, shape/config disagreements) or passes a bad option.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import assert_one_line_error, edgellm_cmd

REPO = Path(__file__).resolve().parents[1]
RUN = edgellm_cmd("run")  # on the smollm2 deployment
STORE = Path(os.environ.get("EDGELLM_MODELS", REPO / "models"))
CKPT = STORE / "smollm2-135m-instruct"

# Skipped only without the checkpoint; a missing binary fails (conftest.smollm2_run).
pytestmark = pytest.mark.usefixtures("smollm2_run")


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RUN, "--n-tokens", "2", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def ckpt_copy(tmp_path: Path) -> Path:
    """A copy of the checkpoint whose files can be damaged (weights symlinked until replaced)."""
    dst = tmp_path / "ckpt"
    dst.mkdir()
    for f in CKPT.iterdir():
        if f.is_file():
            if f.suffix in (".safetensors", ".gguf"):
                os.symlink(f, dst / f.name)
            else:
                shutil.copy(f, dst / f.name)
    return dst


def materialize(path: Path) -> None:
    if path.is_symlink():
        target = path.resolve()
        path.unlink()
        shutil.copy(target, path)


def test_missing_model_store(tmp_path: Path) -> None:
    assert_one_line_error(run(env={"EDGELLM_MODELS": str(tmp_path / "nowhere")}), "not found")


def test_missing_checkpoint_dir(tmp_path: Path) -> None:
    assert_one_line_error(run("--model", str(tmp_path / "absent")), "absent")


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "model.safetensors"])
def test_missing_file(ckpt_copy: Path, name: str) -> None:
    (ckpt_copy / name).unlink()
    assert_one_line_error(run("--model", str(ckpt_copy)), name)


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "model.safetensors"])
def test_truncated_file(ckpt_copy: Path, name: str) -> None:
    path = ckpt_copy / name
    materialize(path)
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    assert_one_line_error(run("--model", str(ckpt_copy)), name)


def test_bitflipped_safetensors_header(ckpt_copy: Path) -> None:
    path = ckpt_copy / "model.safetensors"
    materialize(path)
    with open(path, "r+b") as f:
        f.seek(8 + 40)  # inside the JSON header
        byte = f.read(1)
        f.seek(8 + 40)
        f.write(bytes([byte[0] ^ 0x80]))
    assert_one_line_error(run("--model", str(ckpt_copy)), "model.safetensors")


def test_bitflipped_weight_exponent(ckpt_copy: Path) -> None:
    """Setting a bf16 exponent to all ones makes inf/NaN: caught at load, not at run."""
    path = ckpt_copy / "model.safetensors"
    materialize(path)
    with open(path, "r+b") as f:
        header_len = int.from_bytes(f.read(8), "little")
        f.seek(8 + header_len + 1001)  # high byte of one bf16 value
        f.write(b"\x7f")
        f.seek(8 + header_len + 1000)
        f.write(b"\x80")
    assert_one_line_error(run("--model", str(ckpt_copy)), "non-finite")


def test_shape_disagrees_with_config(ckpt_copy: Path) -> None:
    cfg = json.loads((ckpt_copy / "config.json").read_text())
    cfg["intermediate_size"] += 64
    (ckpt_copy / "config.json").write_text(json.dumps(cfg))
    assert_one_line_error(run("--model", str(ckpt_copy)), "gate_proj", "config.json implies")


def test_unsupported_architecture(ckpt_copy: Path) -> None:
    cfg = json.loads((ckpt_copy / "config.json").read_text())
    cfg["architectures"] = ["FalconForCausalLM"]
    (ckpt_copy / "config.json").write_text(json.dumps(cfg))
    assert_one_line_error(run("--model", str(ckpt_copy)), "FalconForCausalLM", "architectures")


def test_prompt_longer_than_context() -> None:
    assert_one_line_error(run("--max-context", "16", "--prompt", "word " * 40), "context")


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_bad_n_tokens(value: str) -> None:
    proc = subprocess.run([*RUN, "--n-tokens", value], capture_output=True, text=True, timeout=60)
    assert_one_line_error(proc, "--n-tokens")


def test_unknown_option() -> None:
    assert_one_line_error(run("--frobnicate"), "frobnicate")


def test_unknown_kv_cache_dtype() -> None:
    assert_one_line_error(run("--kv-cache", "fp16"), "--kv-cache", "fp16")
    proc = run(env={"EDGELLM_KV_CACHE": "int8"})
    assert_one_line_error(proc, "--kv-cache (EDGELLM_KV_CACHE) int8: expected fp32, bf16 or q8_0")


# --- Regressions from the robustness review (issue 8): each crashed, hung or was
# accepted silently before its fix.

DEEP = "[" * 100_000 + "]" * 100_000


def edit_json(path: Path, **fields: object) -> None:
    data = json.loads(path.read_text())
    data.update(fields)
    path.write_text(json.dumps(data))


def set_raw_field(path: Path, field: str, raw_value: str) -> None:
    """Sets a top-level field to raw JSON text (for values json.dumps cannot nest this deep)."""
    data = json.loads(path.read_text())
    data[field] = None
    text = json.dumps(data)
    key = f'"{field}": null'
    path.write_text(text.replace(key, f'"{field}": {raw_value}', 1))


@pytest.mark.parametrize(
    ("name", "field"),
    [
        ("config.json", "hidden_size"),
        ("generation_config.json", "eos_token_id"),
        ("tokenizer_config.json", "bos_token"),
    ],
)
def test_deeply_nested_json_value(ckpt_copy: Path, name: str, field: str) -> None:
    set_raw_field(ckpt_copy / name, field, DEEP)
    assert_one_line_error(run("--model", str(ckpt_copy)), name, "nested deeper than")


@pytest.mark.parametrize("component", ["pre_tokenizer", "normalizer", "decoder"])
def test_deeply_nested_tokenizer_sequence(ckpt_copy: Path, component: str) -> None:
    key = {"pre_tokenizer": "pretokenizers", "normalizer": "normalizers", "decoder": "decoders"}
    opening = f'{{"type": "Sequence", "{key[component]}": ['
    value = opening * 20_001 + "]}" * 20_001
    set_raw_field(ckpt_copy / "tokenizer.json", component, value)
    assert_one_line_error(run("--model", str(ckpt_copy)), "tokenizer.json", "nested deeper than")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("rope_theta", 1e300),
        ("eos_token_id", 2**32 + 2),
        ("bos_token_id", 2**32 + 1),
        ("num_hidden_layers", 10**9),
    ],
)
def test_config_value_out_of_range(ckpt_copy: Path, field: str, value: float) -> None:
    edit_json(ckpt_copy / "config.json", **{field: value})
    assert_one_line_error(run("--model", str(ckpt_copy)), "config.json", f"'{field}'")


def test_generation_config_eos_does_not_wrap(ckpt_copy: Path) -> None:
    edit_json(ckpt_copy / "generation_config.json", eos_token_id=2**32 + 2)
    assert_one_line_error(
        run("--model", str(ckpt_copy)), "generation_config.json", "outside the vocabulary"
    )


def test_more_layers_than_the_checkpoint_has(ckpt_copy: Path) -> None:
    """Named before anything is packed (it used to fail only after packing every layer)."""
    layers = json.loads((ckpt_copy / "config.json").read_text())["num_hidden_layers"]
    edit_json(ckpt_copy / "config.json", num_hidden_layers=layers + 1)
    assert_one_line_error(run("--model", str(ckpt_copy)), f"model.layers.{layers}.", "is missing")


def test_context_that_cannot_fit_in_memory(ckpt_copy: Path) -> None:
    edit_json(ckpt_copy / "config.json", max_position_embeddings=2**31 - 1)
    proc = run("--model", str(ckpt_copy), "--max-context", str(2**31 - 1))
    assert_one_line_error(proc, "setup needs", "GB available", "--max-context")


def test_out_of_memory_names_the_step() -> None:
    """Was `internal error: std::bad_alloc`. An address-space limit of 450 MB lets the
    270 MB checkpoint map but not be packed; MemAvailable alone cannot see the limit."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (450 << 20, 450 << 20))

    proc = subprocess.run(
        [*RUN, "--n-tokens", "2", "--threads", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=limit,
    )
    assert_one_line_error(proc, "out of memory while packing")


def test_threads_beyond_the_hardware() -> None:
    assert_one_line_error(run("--threads", "1000"), "threads must be at most", "got 1000")


BINDING_SCRIPT = r"""
import sys, edgellm_py
s = edgellm_py.Session()
for name in ("tokenizer", "chat_template", "max_context", "weight_bytes", "vocab_size",
             "num_layers", "hidden_size", "eos_token_ids"):
    try:
        getattr(s, name)
    except edgellm_py.Error as e:
        assert "not set up" in str(e), (name, e)
    else:
        raise SystemExit(f"{name}: no error before setup")
try:
    s.setup(sys.argv[1] + "/absent")
except edgellm_py.Error:
    pass
for call in (lambda: s.prefill([1, 2]), lambda: s.decode_step(1, 0), lambda: s.tokenizer):
    try:
        call()
    except edgellm_py.Error as e:
        assert "not set up" in str(e), e
    else:
        raise SystemExit("no error after a failed setup")
print("ok")
"""


def run_python(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    from conftest import PYTHON, verify_env

    return subprocess.run(
        [PYTHON, "-c", script, *args], capture_output=True, text=True, timeout=300, env=verify_env()
    )


def test_binding_before_and_after_failed_setup(tmp_path: Path) -> None:
    """Was a segfault: Session properties dereferenced the state setup() creates."""
    proc = run_python(BINDING_SCRIPT, str(tmp_path))
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr


TRUNCATE_SCRIPT = r"""
import sys, numpy as np, edgellm_py
ckpt, mode = sys.argv[1], sys.argv[2]
s = edgellm_py.Session()
s.setup(ckpt, threads=2, max_context=64)
ids = s.tokenizer.encode("The capital of France is")
before = s.prefill(ids)
path = ckpt + "/model.safetensors"
if mode == "truncate":
    open(path, "r+b").truncate(0)
else:  # overwrite every byte after the first 4 KiB in place with 0xff (NaN as bf16)
    with open(path, "r+b") as f:
        size = f.seek(0, 2)
        f.seek(4096)
        f.write(b"\xff" * (size - 4096))
after = s.prefill(ids)
assert np.array_equal(before, after), "logits changed after the model file changed"
step = s.decode_step(int(np.argmax(after)), len(ids))
assert np.isfinite(step).all()
print("ok")
"""


@pytest.mark.parametrize("mode", ["truncate", "overwrite"])
def test_model_file_changed_after_setup(ckpt_copy: Path, mode: str) -> None:
    """Was SIGBUS (truncate) or silent NaN (overwrite): the embedding was read from the mapping."""
    materialize(ckpt_copy / "model.safetensors")
    proc = run_python(TRUNCATE_SCRIPT, str(ckpt_copy), mode)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr


# --- the command line of the one `edgellm` command --------------------------------------


def edgellm(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [RUN[0], *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize(
    "args,message",
    [
        (["frobnicate"], "unknown subcommand 'frobnicate' (expected run, chat, bench, serve"),
        ([], "a subcommand is needed"),
        (["run", "-x"], "-x"),
        (["serve", "--prompt", "hi"], "--prompt"),
        (["run", "--min-p", "1.5"], "--min-p: must be in [0, 1] (got 1.5)"),
        (["run", "-n", "0"], "--n-tokens: must be >= 1 (got 0)"),
        (["run", "-p", "a", "-f", "b"], "--prompt excludes --file"),
        (["verify", "--full", "--max-prompts", "3"], "--full excludes --max-prompts"),
    ],
)
def test_bad_command_line(args: list[str], message: str) -> None:
    assert_one_line_error(edgellm(*args), message, code=2)


def test_unknown_deployment_names_the_known_ones() -> None:
    proc = edgellm("run", "--deployment", "nope")
    assert_one_line_error(proc, "--deployment nope: no ", "known: gemma3_270m", code=2)
    # --version and --help still answer without a readable preset.
    assert edgellm("--version", env={"EDGELLM_DEPLOYMENT": "nope"}).returncode == 0


def test_prompt_file_that_cannot_be_read(tmp_path: Path) -> None:
    assert_one_line_error(run("-f", str(tmp_path / "absent.txt")), "absent.txt: cannot read")
    (tmp_path / "empty.txt").write_text("\n")
    assert_one_line_error(run("-f", str(tmp_path / "empty.txt")), "the prompt file is empty")


def test_system_message_needs_a_chat_template() -> None:
    assert_one_line_error(run("--raw", "--system", "Be brief."), "--system needs the chat template")


def test_verify_without_the_venv(tmp_path: Path) -> None:
    proc = edgellm("verify", env={"EDGELLM_VENV": str(tmp_path / "no-venv")})
    assert_one_line_error(proc, "no-venv", "make bootstrap", code=2)
