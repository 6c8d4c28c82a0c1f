"""The C++ library installs with CMake and docs/example builds against it with find_package."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from conftest import REPO


def run(*cmd: str, **kw) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stdout}\n{r.stderr}"
    return r


def test_example_builds_against_the_installed_package(
    tmp_path: Path, smollm2_checkpoint: Path
) -> None:
    prefix, build = tmp_path / "prefix", tmp_path / "example"
    run("cmake", "--install", str(REPO / "build"), "--prefix", str(prefix))
    assert (prefix / "lib" / "cmake" / "edgellm" / "edgellmConfig.cmake").is_file()
    run(
        "cmake", "-S", str(REPO / "docs" / "example"), "-B", str(build), "-G", "Ninja",
        f"-DCMAKE_PREFIX_PATH={prefix}",
    )  # fmt: skip
    run("cmake", "--build", str(build))
    out = run(
        str(build / "edgellm_example"), str(smollm2_checkpoint), "What is the capital of France?"
    )
    assert "Paris" in out.stdout


def test_make_install_puts_edgellm_on_the_path(tmp_path: Path, smollm2_checkpoint: Path) -> None:
    """`make install PREFIX=...` (the build already made): PREFIX/bin/edgellm answers
    --version and runs a short generation from PATH alone."""
    prefix = tmp_path / "prefix"
    run(
        "make",
        "--no-print-directory",
        "-C",
        str(REPO),
        "-o",
        "build",
        "install",
        f"PREFIX={prefix}",
    )
    assert (prefix / "bin" / "edgellm").is_file()
    env = {"PATH": f"{prefix / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}
    version = run("edgellm", "--version", env=env)
    assert version.stdout.startswith("edgellm ") and version.stdout.split()[1][0].isdigit()
    gguf = smollm2_checkpoint / "model.gguf"
    args = ["run", "-m", str(gguf), "-p", "What is the capital of France?", "-n", "8", "-t", "2"]
    args += ["-c", "256", "--json"]
    store = {"EDGELLM_MODELS": str(smollm2_checkpoint.parent)}
    installed = json.loads(run("edgellm", *args, env={**env, **store}).stdout)
    built = json.loads(
        run(str(REPO / "build" / "edgellm"), *args, env={**os.environ, **store}).stdout
    )
    # The installed program is the built one: the same answer, token for token.
    assert installed["answer"] and installed["answer"] == built["answer"], (installed, built)
