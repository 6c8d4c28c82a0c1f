"""docs/example/'s Python programs run from the build tree and answer (greedy SmolLM2)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import PYTHON, REPO, STORE


@pytest.mark.parametrize(
    "example, args",
    [("chat.py", []), ("low_level.py", ["{checkpoint}"])],
    ids=["short_form", "low_level"],
)
def test_example_answers(
    example: str, args: list[str], edgellm_package: Any, smollm2_checkpoint: Path, tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "build" / "python"), "EDGELLM_MODELS": str(STORE)}
    cmd = [PYTHON, str(REPO / "docs" / "example" / example)]
    cmd += [a.format(checkpoint=smollm2_checkpoint) for a in args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Paris" in r.stdout, r.stdout
