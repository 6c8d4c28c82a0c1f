"""One descriptor per deployment: make, the C++ program and the verify adapter agree.

Each deployment's facts live only in llms/<name>/deployment.json and its policy (--model
resolution, chat template or raw text) only in llms/common/deployment.cpp, which the edgellm
command links and Python reaches as edgellm_deployment; the model store is the engine's rule
with the source tree's models/ as the front ends' default. These tests check that every front
end reads the same answer from them.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import transformers
from conftest import PYTHON, REPO, edgellm_cmd, verify_env

DEPLOYMENTS = sorted(p.parent.name for p in (REPO / "llms").glob("*/deployment.json"))


def test_every_deployment_folder_has_a_descriptor() -> None:
    folders = {p.parent.name for p in (REPO / "llms").glob("*/Makefile")}
    assert folders == set(DEPLOYMENTS) and DEPLOYMENTS


@pytest.mark.parametrize("name", DEPLOYMENTS)
def test_make_cpp_and_python_read_the_same_descriptor(
    name: str, deployment_policy: Any, edgellm_bin: Path
) -> None:
    d = deployment_policy.Deployment.load(REPO / "llms" / name / "deployment.json")
    assert d.name == name
    # make: the default MODEL
    out = subprocess.run(
        ["make", "--no-print-directory", "-C", str(REPO / "llms" / name), "help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"MODEL={d.default_model} " in out
    # Python: the adapter's contract comes from the same file
    adapter = importlib.import_module(f"{name}.verify_adapter")
    assert adapter.MODEL_CHOICES == dict(d.models)
    assert adapter.DEFAULT_MODEL == d.default_model
    # C++: `edgellm run --deployment <name>` offers the same --model choices and defaults
    run = edgellm_cmd("run", name)
    proc = subprocess.run(
        [*run, "--model", "no-such-choice"], capture_output=True, text=True, timeout=60
    )
    assert f"neither a known choice ({', '.join(sorted(d.models))})" in proc.stderr
    help_text = subprocess.run([*run, "--help"], capture_output=True, text=True).stdout
    assert d.default_prompt[:30] in help_text
    assert f"--model TEXT={d.default_model} " in help_text


def run_base_model(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`edgellm run --model base` on the smollm2 deployment (its checkpoint is not fetched)."""
    return subprocess.run(
        [*edgellm_cmd("run"), "--model", "base"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_smollm2_base_choice_is_one_fact(
    engine_binding: Any, edgellm_bin: Path, tmp_path: Path
) -> None:
    """`base` (the drift the descriptor fixed) resolves the same way in C++ and Python."""
    env = {**os.environ, "EDGELLM_MODELS": str(tmp_path)}
    proc = run_base_model(env)
    assert f"checkpoint not found at {tmp_path / 'smollm2-135m'}" in proc.stderr
    verify = subprocess.run(
        [
            PYTHON,
            str(REPO / "llms" / "verify" / "verify_runner.py"),
            "--runner=smollm2_135m.verify_adapter",
            "--model",
            "base",
        ],
        capture_output=True,
        text=True,
        env={**verify_env(), "EDGELLM_MODELS": str(tmp_path)},
        timeout=120,
    )
    assert proc.stderr.strip().removeprefix("error: ") in verify.stderr


@pytest.mark.parametrize(
    "edit,message",
    [
        ({"colour": "blue"}, "unknown field 'colour'"),
        ({"default_model": "huge"}, "default_model 'huge' is not a key of models"),
        ({"prompt_format": "fancy"}, "prompt_format must be auto, chat or raw"),
        ({"fetch": ["elsewhere"]}, "is not a directory named in models"),
        ({"models": {"x": "../up"}}, "models.x must be a directory name"),
        ({"models": {"x": "d/../up.gguf"}}, "models.x must be a directory name"),
        ({"models": {"x": "d/a/b/m.gguf"}}, "models.x must be a directory name"),
        ({"models": {"x": "d/sub"}}, "models.x must be a directory name"),
        ({"max_context": 0}, "max_context must be an integer"),
        ({"hidden_act": "relu"}, "hidden_act must be silu or gelu_tanh"),
    ],
)
def test_bad_descriptor_is_one_clear_error(
    tmp_path: Path, deployment_policy: Any, edit: dict, message: str
) -> None:
    d = json.loads((REPO / "llms" / "smollm2_135m" / "deployment.json").read_text())
    d.update(edit)
    path = tmp_path / "deployment.json"
    path.write_text(json.dumps(d))
    with pytest.raises(deployment_policy.Error, match=message.replace("(", r"\(")):
        deployment_policy.Deployment.load(path)


def test_base_checkpoint_with_a_template_gets_raw_text_everywhere(
    smollm2_checkpoint: Path, smollm2_run: list[str], engine_binding: Any, tmp_path: Path
) -> None:
    """A base checkpoint that ships a chat template: make run and make verify both feed raw text."""
    ckpt = tmp_path / "base-with-template"
    ckpt.mkdir()
    for f in smollm2_checkpoint.iterdir():
        if f.is_file() and f.name != "edgellm.json":
            os.symlink(f, ckpt / f.name)
    (ckpt / "edgellm.json").write_text(json.dumps({"edgellm_variant": "base"}))
    prompt = "The capital of France is"
    proc = subprocess.run(
        [*smollm2_run, "--model", str(ckpt), "--prompt", prompt, "--n-tokens", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    tok = engine_binding.Tokenizer.load(ckpt)
    assert json.loads(proc.stdout)["prompt_tokens"] == len(tok.encode(prompt, True))
    adapter = importlib.import_module("smollm2_135m.verify_adapter")
    config = adapter.build_config(ckpt, str(ckpt))
    assert (config.variant, config.prompt_format) == ("base", "raw")
    shutil.rmtree(ckpt)


@pytest.mark.parametrize("name", DEPLOYMENTS)
def test_descriptor_hidden_act_is_the_checkpoints(name: str, deployment_policy: Any) -> None:
    """The descriptor's hidden_act (the kernel registry's "Used by") is what its checkpoints in
    the store say, read as the engine reads config.json."""
    d = deployment_policy.Deployment.load(REPO / "llms" / name / "deployment.json")
    checked = 0
    for entry in set(d.models.values()):
        folder = entry.split("/")[0]
        config = Path(deployment_policy.model_store()) / folder / "config.json"
        if config.is_file():
            c = json.loads(config.read_text())
        elif folder.endswith("-fixture"):  # made on first use: the config make_fixture.py writes
            sys.path.insert(0, str(REPO / "scripts"))
            from make_fixture import CONFIGS

            class_name, kwargs = CONFIGS[folder.removesuffix("-fixture")]
            c = getattr(transformers, class_name)(**kwargs).to_dict()
        else:
            continue
        c = c.get("text_config", c)
        gemma = c.get("model_type", "").startswith("gemma3")
        act = c.get("hidden_activation" if gemma else "hidden_act")
        act = act or ("gelu_pytorch_tanh" if gemma else "silu")
        assert {"gelu_pytorch_tanh": "gelu_tanh"}.get(act, act) == d.hidden_act, config
        checked += 1
    if not checked:
        pytest.skip(f"no checkpoint of {name} in the store")


def store_of(module: str, env: dict[str, str], setup: str = "") -> str:
    """<module>.model_store() in a fresh process with exactly the given store variables."""
    clean = {k: v for k, v in verify_env().items() if k not in ("EDGELLM_MODELS", "XDG_CACHE_HOME")}
    code = f"import {module} as m\n{setup}\nprint(m.model_store())"
    return subprocess.run(
        [PYTHON, "-c", code],
        env={**clean, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()


def test_model_store_rule(deployment_policy: Any, tmp_path: Path) -> None:
    """The engine: $EDGELLM_MODELS, else the front end's default, else the user cache; no path
    of the source tree. The front ends built from the tree default to its models/."""
    home = {"HOME": str(tmp_path / "home")}
    assert store_of("edgellm_py", home) == str(tmp_path / "home/.cache/edgellm/models")
    xdg = {**home, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    assert store_of("edgellm_py", xdg) == str(tmp_path / "xdg/edgellm/models")
    assert store_of("edgellm_py", {**xdg, "EDGELLM_MODELS": "/m"}) == "/m"
    set_default = "m.set_default_model_store('/front')"
    assert store_of("edgellm_py", xdg, set_default) == "/front"
    assert store_of("edgellm_py", {**xdg, "EDGELLM_MODELS": "/m"}, set_default) == "/m"
    assert store_of("edgellm_deployment", xdg) == str(REPO / "models")
    assert store_of("edgellm_deployment", {**xdg, "EDGELLM_MODELS": "/m"}) == "/m"


def test_the_command_defaults_to_the_source_tree_store(edgellm_bin: Path, tmp_path: Path) -> None:
    if (REPO / "models" / "smollm2-135m").exists():
        pytest.skip("models/smollm2-135m is present: the error this test reads does not happen")
    env = {k: v for k, v in os.environ.items() if k != "EDGELLM_MODELS"}
    env["XDG_CACHE_HOME"] = str(tmp_path)
    proc = run_base_model(env)
    assert f"checkpoint not found at {REPO / 'models' / 'smollm2-135m'}" in proc.stderr
