"""Diagnosis plot: per-layer closeness of our engine to HF bf16 and to HF fp32, as a PNG.

Cosines of healthy layers sit at 1 - 1e-4 (vs bf16) and 1 - 1e-9 (vs fp32); on a linear axis
both are a flat line at 1. So the plot shows 1 - cosine and the relative error on log axes,
where a broken layer stands out by orders of magnitude. matplotlib is imported here only
(Agg backend, no display), so the gate itself never needs it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from verify.comparators import PairStats
from verify.errors import VerifyError

TINY = 1e-16  # floor for log axes: a cosine of exactly 1 or an error of 0


def write_layer_plot(
    layers: list[PairStats], truth: list[PairStats], path: Path, title: str
) -> None:
    """Two panels over the decoder layers: 1 - cosine (min, p5, median) and relative error."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise VerifyError(
            f"no plot: matplotlib is not installed ({e}); run `make bootstrap`"
        ) from None
    series = [("HF bf16", layers, "tab:blue")]
    if truth:
        series.append(("HF fp32", truth, "tab:red"))
    fig, (ax_cos, ax_err) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    for label, stats, color in series:
        rows = [s for s in stats if s.layer is not None]
        x = [s.layer for s in rows]
        for field, style in (("cos_min", ":"), ("cos_p5", "--"), ("cos_median", "-")):
            y = np.maximum(1 - np.array([getattr(s, field) for s in rows]), TINY)
            name = field.removeprefix("cos_")
            ax_cos.plot(x, y, style, color=color, marker=".", label=f"vs {label}: {name}")
        err = np.maximum([s.rel_err for s in rows], TINY)
        ax_err.plot(x, err, "-", color=color, marker=".", label=f"vs {label}")
    ax_cos.set_yscale("log")
    ax_cos.set_ylabel("1 - cosine per position")
    ax_cos.legend(fontsize=7, ncol=2)
    ax_cos.set_title(title, fontsize=9)
    ax_err.set_yscale("log")
    ax_err.set_ylabel("relative error ||ours - ref|| / ||ref||")
    ax_err.set_xlabel("decoder layer (block output)")
    ax_err.legend(fontsize=7)
    for ax in (ax_cos, ax_err):
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as e:
        raise VerifyError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        plt.close(fig)
