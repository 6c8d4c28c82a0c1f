"""kernel_registry/supported_kernels.md stays true to what the engine registers."""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "build" / "python"))
import edgellm_py  # noqa: E402  (an unbuilt binding fails the suite, never skips it)

REGISTRY = REPO / "kernel_registry" / "supported_kernels.md"


def registry_rows() -> list[dict[str, str]]:
    lines = [ln for ln in REGISTRY.read_text().splitlines() if ln.startswith("| `")]
    header = ["kernel", "dtypes", "shapes", "isa", "throughput", "used_by"]
    cells = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in lines]
    return [dict(zip(header, row, strict=True)) for row in cells]


def test_every_registered_kernel_has_a_row_and_no_row_is_stale() -> None:
    registered = dict(edgellm_py.registered_kernels())
    rows = registry_rows()
    documented = {re.match(r"`(\w+)`", r["kernel"]).group(1) for r in rows}
    assert documented == set(registered), (
        f"registry {sorted(documented)} vs engine {sorted(registered)}"
    )
    for row in rows:
        name = re.match(r"`(\w+)`", row["kernel"]).group(1)
        for isa in registered[name]:
            assert isa in row["isa"], f"{name}: ISA path {isa} missing from the registry row"


def test_used_by_names_real_deployments() -> None:
    deployments = {p.name for p in (REPO / "llms").iterdir() if (p / "Makefile").exists()}
    for row in registry_rows():
        used = re.findall(r"[a-z0-9]+_[a-z0-9_]+", row["used_by"])
        assert used, f"{row['kernel']}: empty Used by"
        assert set(used) <= deployments, f"{row['kernel']}: unknown deployment in {used}"
