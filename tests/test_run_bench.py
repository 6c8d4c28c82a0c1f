"""bench/run_bench.py runs end to end and its tables carry every row asked for.

One repetition at two short lengths on SmolLM2 without the HF rows: a smoke test of the
benchmark's plumbing (workers, --lengths, --weights rows, the ratio lines), not a timing.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from conftest import PYTHON, REPO, verify_env

RUN_BENCH = REPO / "bench" / "run_bench.py"


def run_bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, str(RUN_BENCH), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=verify_env(),
        cwd=REPO,
    )


def test_bench_tables_hold_the_requested_rows(
    smollm2_checkpoint: Path, engine_binding: Any
) -> None:
    proc = run_bench(
        *("--model", str(smollm2_checkpoint), "--no-hf", "--reps", "1"),
        *("--lengths", "32,512", "--decode-after", "32,512", "--weights", "q8_0"),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "| engine | TTFT 32 | TTFT 512 | decode @32 | decode @512 | peak RSS (MB) |" in out
    table = out.split("| engine |", 1)[1].split("\n\n", 1)[0]
    rows = [ln for ln in table.splitlines() if ln.startswith("| ours")]
    assert [r.split(" | ")[0] for r in rows] == [
        "| ours",
        "| ours exact",
        "| ours gguf",
        "| ours q8_0",
    ], rows
    for row in rows:  # every cell a positive number
        cells = [c.strip() for c in row.strip("|").split("|")[1:]]
        assert len(cells) == 5 and all(float(c) > 0 for c in cells), row
    assert "`ours q8_0` (the checkpoint quantized at setup, `--weights q8_0`)" in out
    assert "the bf16 deployment" in out and "decode at" not in out  # no position > 512 timed
    # Each worker's own peak (not the parent's, which ru_maxrss would report): the GGUF
    # deployment's 4-bit weights take less than the bf16 one's.
    rss = {r.split(" | ")[0]: float(r.strip("|").split("|")[-1]) for r in rows}
    assert rss["| ours gguf"] < rss["| ours"], rss


def test_bench_rejects_bad_lengths_in_one_line() -> None:
    proc = run_bench("--lengths", "32,x", "--no-hf")
    assert proc.returncode == 2 and "expected comma-separated token counts" in proc.stderr
    proc = run_bench("--lengths", "32,128", "--no-hf")
    assert proc.returncode == 2 and "must include 512" in proc.stderr
    assert "Traceback" not in proc.stderr
