"""Bad input to verify_runner.py: one `error:` line on stderr, exit status 2, no traceback.

Most cases need no model: they point --model at a stub checkpoint (config.json and a chat
template only) or at an empty model store, and fail before anything loads. The prompt that
does not fit the context needs the real tokenizer.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import PYTHON, REPO, VERIFY_RUNNER, assert_one_line_error, verify_env

ADAPTER = "--runner=smollm2_135m.verify_adapter"


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, str(VERIFY_RUNNER), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**verify_env(), **(env or {})},
        cwd=REPO,
    )


@pytest.fixture
def stub_ckpt(tmp_path: Path) -> Path:
    """Enough of a checkpoint for everything before a model loads."""
    d = tmp_path / "stub"
    d.mkdir()
    cfg = {"num_hidden_layers": 2, "vocab_size": 10, "max_position_embeddings": 64}
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    return d


def test_unknown_runner_module() -> None:
    assert_one_line_error(run("--runner=no_such_model.verify_adapter"), "no such module", code=2)


def test_runner_not_a_dotted_path() -> None:
    assert_one_line_error(run("--runner=../etc/passwd"), "not a dotted module path", code=2)


def test_adapter_missing_part_of_the_contract(tmp_path: Path) -> None:
    (tmp_path / "half_adapter.py").write_text(
        'MODEL_CHOICES = {"instruct": "x"}\nDEFAULT_MODEL = "instruct"\n'
    )
    env = {"PYTHONPATH": f"{tmp_path}:{verify_env()['PYTHONPATH']}"}
    assert_one_line_error(
        run("--runner=half_adapter", env=env),
        "resolve_model",
        "hf_reference",
        "build_config",
        "build_runner",
    )


def test_adapter_that_fails_to_import(tmp_path: Path) -> None:
    (tmp_path / "broken_adapter.py").write_text("import not_a_package_anywhere\n")
    env = {"PYTHONPATH": f"{tmp_path}:{verify_env()['PYTHONPATH']}"}
    assert_one_line_error(run("--runner=broken_adapter", env=env), "not_a_package_anywhere", code=2)


def test_missing_runner_flag() -> None:
    assert_one_line_error(run("--prompts", "topk_token"), "--runner", code=2)


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--max-prompts", "0"], "at least 1"),
        (["--prompts", "everything"], "invalid choice"),
        (["--gate-phase", "later"], "invalid choice"),
        (["--gate-phase", "compare"], "needs --work-dir"),
    ],
)
def test_bad_options(args: list[str], needle: str) -> None:
    assert_one_line_error(run(ADAPTER, *args), needle, code=2)


def test_base_checkpoint_absent_offline(tmp_path: Path) -> None:
    store = tmp_path / "empty_store"
    store.mkdir()
    proc = run(ADAPTER, "--model", "base", env={"EDGELLM_MODELS": str(store)})
    assert_one_line_error(
        proc, "--model base", "smollm2-135m", "--model /path/to/checkpoint", code=2
    )


def test_checkpoint_path_that_does_not_exist(tmp_path: Path) -> None:
    proc = run(ADAPTER, "--model", str(tmp_path / "nowhere"))
    assert_one_line_error(proc, "neither a known choice", "instruct", code=2)


def test_directory_that_is_not_a_checkpoint(tmp_path: Path) -> None:
    assert_one_line_error(run(ADAPTER, "--model", str(tmp_path)), "no config.json", code=2)


def test_missing_prompts_file(stub_ckpt: Path, tmp_path: Path) -> None:
    proc = run(ADAPTER, "--model", str(stub_ckpt), "--prompts-file", str(tmp_path / "none.txt"))
    assert_one_line_error(proc, "not found", code=2)


def test_empty_prompts_file(stub_ckpt: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("# only a comment\n\n   \n")
    assert_one_line_error(
        run(ADAPTER, "--model", str(stub_ckpt), "--prompts-file", str(empty)), "no prompts"
    )


def test_empty_prompt(stub_ckpt: Path) -> None:
    assert_one_line_error(
        run(ADAPTER, "--model", str(stub_ckpt), "--prompt", "  "), "empty", code=2
    )


def test_report_dir_not_writable(stub_ckpt: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    proc = run(ADAPTER, "--model", str(stub_ckpt), "--report-dir", str(blocker / "reports"))
    assert_one_line_error(proc, "not writable", "--report-dir", code=2)


def test_compare_phase_without_captures(stub_ckpt: Path, tmp_path: Path) -> None:
    proc = run(
        ADAPTER,
        "--model",
        str(stub_ckpt),
        "--gate-phase",
        "compare",
        "--work-dir",
        str(tmp_path / "work"),
        "--report-dir",
        str(tmp_path / "r"),
    )
    assert_one_line_error(proc, "no reference capture", code=2)


def test_compare_phase_without_the_truth(stub_ckpt: Path, tmp_path: Path) -> None:
    """A work dir holding the bf16 and engine captures but no fp32 one is refused by name."""
    from verify.gate import Capture, save_capture

    work = tmp_path / "work"
    meta = {"model_dir": str(stub_ckpt.resolve()), "diagnose": False}
    for side, name in (("reference", "reference.pkl"), ("engine", "engine.pkl")):
        save_capture(Capture(side, "stub", meta, []), work / name)
    args = ("--gate-phase", "compare", "--work-dir", str(work), "--report-dir", str(tmp_path))
    proc = run(ADAPTER, "--model", str(stub_ckpt), *args)
    assert_one_line_error(proc, "no truth capture", "--gate-phase truth", code=2)


def test_prompt_longer_than_the_context(smollm2_checkpoint: Path, tmp_path: Path) -> None:
    long_prompt = "The quick brown fox jumps over the lazy dog. " * 500  # ~5000 tokens
    proc = run(
        ADAPTER, "--model", "instruct", "--prompt", long_prompt, "--report-dir", str(tmp_path)
    )
    assert_one_line_error(proc, "does not fit the context", "shorten", code=2)
    assert not list(tmp_path.glob("*.json"))  # nothing half-written
