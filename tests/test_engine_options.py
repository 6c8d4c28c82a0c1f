"""Options no other test reaches: chunked prefill, --raw, and a whole model off the best tier.

Each compares two ways of asking for the same thing, so a wrong option shows as a difference:
a prompt prefilled in chunks of 7 must continue exactly as one prefilled whole; --raw must feed
exactly the tokenizer's ids of the text (no chat template); and under EDGELLM_ISA=avx2 or
scalar the whole model must still pass the gate's stage 1 against HF, with every kernel on that
tier (the report names the tier the engine ran).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import PYTHON, REPO, VERIFY_RUNNER, verify_env

TIERS = ["scalar", "avx2", "avx512", "amx"]


@pytest.fixture(scope="module")
def model(engine_binding: Any, smollm2_checkpoint: Path) -> Any:
    m = engine_binding.Model()
    m.setup(str(smollm2_checkpoint), threads=2, max_context=1024)
    return m


def drain(stream: Any) -> str:
    data, done = b"", False
    while not done:
        piece, done, _ = stream.wait(1000)
        data += piece
    return data.decode()


def test_prefill_chunks_do_not_change_the_answer(engine_binding: Any, model: Any) -> None:
    text = (REPO / "tests" / "data" / "english_paragraph.txt").read_text().strip()
    conversation = [("user", f"Which sentence repeats?\n\n{text}\n\n{text}")]
    ids = engine_binding.encode_conversation(model.tokenizer, model.chat_template, conversation)
    assert len(ids) > 256, len(ids)  # longer than the default chunk: several chunks below
    whole = "".join(engine_binding.generate(engine_binding.Context(model), ids, max_tokens=16))
    assert whole.strip()
    for chunk in (7, 64, 256):
        scheduler = engine_binding.Scheduler(model, max_batch=2, max_queue=2, prefill_chunk=chunk)
        stream = scheduler.submit(ids, 16)
        assert drain(stream) == whole, f"prefill_chunk={chunk}"
        assert stream.prompt_tokens == len(ids)
        scheduler.shutdown(0)


def run_cli(command: list[str], checkpoint: Path, *args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [*command, "--model", str(checkpoint), "--n-tokens", "4", "--json", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_raw_feeds_the_text_without_the_chat_template(
    engine_binding: Any, model: Any, smollm2_run: list[str], smollm2_checkpoint: Path
) -> None:
    prompt = "The three primary colours are"
    raw = run_cli(smollm2_run, smollm2_checkpoint, "--prompt", prompt, "--raw")
    chat = run_cli(smollm2_run, smollm2_checkpoint, "--prompt", prompt)
    plain = model.tokenizer.encode(prompt, True)
    templated = engine_binding.encode_conversation(
        model.tokenizer, model.chat_template, [("user", prompt)]
    )
    assert raw["prompt_tokens"] == len(plain)
    assert chat["prompt_tokens"] == len(templated) > len(plain)


@pytest.mark.parametrize("tier", ["scalar", "avx2"])
def test_a_whole_model_off_the_best_tier_passes_stage_1(
    tier: str, engine_binding: Any, smollm2_checkpoint: Path, tmp_path: Path
) -> None:
    if TIERS.index(tier) > TIERS.index(engine_binding.detected_isa()):
        pytest.skip(f"ISA tier {tier}: this CPU lacks it (not testable here)")
    proc = subprocess.run(
        [PYTHON, str(VERIFY_RUNNER), "--runner=smollm2_135m.verify_adapter", "--max-prompts",
         "1", "--stage", "1", "--report-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=900, cwd=REPO,
        env={**verify_env(), "EDGELLM_ISA": tier},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (path,) = tmp_path.glob("*.json")
    report = json.loads(path.read_text())
    assert report["verdict"] == "pass" and report["meta"]["engine_isa"] == tier, report["meta"]
    assert report["prompts"][0]["calibrated"]["passed"], report["prompts"][0]["calibrated"]
