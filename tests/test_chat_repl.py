"""`make chat`: the REPL keeps one warm session, answers each turn, and exits cleanly on EOF."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = REPO / "build" / "smollm2_135m_inference"
CKPT = Path(os.environ.get("EDGELLM_MODELS", REPO / "models")) / "smollm2-135m-instruct"

pytestmark = pytest.mark.skipif(
    not BIN.exists() or not (CKPT / "config.json").exists(),
    reason="needs build/smollm2_135m_inference and the smollm2 checkpoint (make build fetch)",
)


def chat(stdin: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN), "--chat", "--threads", "2", "--n-tokens", "24"],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=180,
    )


def replies(stdout: str) -> list[str]:
    turns = stdout.split("> ")[1:]  # text after each prompt marker
    return [t.strip() for t in turns if t.strip()]


def test_two_turns_then_eof() -> None:
    proc = chat("What is the capital of France?\nAnd of Italy?\n")
    assert proc.returncode == 0, proc.stderr
    answers = replies(proc.stdout)
    assert len(answers) == 2, proc.stdout
    assert "Paris" in answers[0], answers[0]
    assert "Rome" in answers[1], answers[1]


def test_reset_forgets_the_conversation() -> None:
    """After /reset the same question gets the same answer as in a fresh session."""
    fresh = replies(chat("Name a color.\n").stdout)
    after_reset = replies(chat("Tell me a joke.\n/reset\nName a color.\n").stdout)
    assert after_reset[-1] == fresh[0]
    assert "(conversation cleared)" in after_reset[-2]
