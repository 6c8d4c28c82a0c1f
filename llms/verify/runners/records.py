"""What a runner hands back per call, and the protocol both runners follow.

Our engine and the HF reference return the same records, so the gate and the diagnosis
compare like with like and never know which side they are looking at.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


@dataclass
class PrefillRecord:
    """Prefill of a whole prompt.

    layer_outputs[l] is the residual stream after decoder layer l, [n_tokens, hidden]
    (HF ``hidden_states[l + 1]``, except that HF's last entry is already normed: its runner
    hooks the last layer for the pre-norm value). final_hidden is after the final norm.
    Both are empty unless the prefill ran with capture=True (diagnosis).
    """

    logits: np.ndarray  # [vocab] float32, at the last prompt position
    top1: int
    layer_outputs: list[np.ndarray] = field(default_factory=list)
    final_hidden: np.ndarray | None = None


@dataclass
class DecodeStepRecord:
    """One decode step: the logits for the position after ``pos``."""

    logits: np.ndarray  # [vocab] float32
    top1: int


class Runner(Protocol):
    """One side of the comparison. Positions are absolute; the KV cache is the runner's own."""

    name: str
    max_context: int
    eos_token_ids: tuple[int, ...]

    def encode_prompt(self, text: str, chat: bool) -> list[int]:
        """Token ids of a prompt as production feeds it (chat template or raw text)."""
        ...

    def decode(self, ids: list[int]) -> str:
        """Text of ids, special tokens kept (the report shows exactly what was generated)."""
        ...

    def prefill(self, tokens: list[int], capture: bool = False) -> PrefillRecord:
        """Runs the prompt at positions [0, n); overwrites any earlier KV entries there."""
        ...

    def decode_step(self, token: int, pos: int) -> DecodeStepRecord:
        """Runs ``token`` at ``pos`` (writing its KV entry) and returns the next logits."""
        ...

    def close(self) -> None:
        """Frees the model (a phase may load the other side next)."""
        ...
