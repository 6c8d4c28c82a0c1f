"""Llama-3.2-1B verify adapter: names the checkpoints; everything else is shared.

``fixture`` is the seeded random-initialised checkpoint of the real config
(``make -C llms/llama32_1b fixture``); a user with the real weights passes
``MODEL=/path/to/Llama-3.2-1B-Instruct`` and the identical gate runs on them.
Random weights give near-flat distributions, so benign top-1 flips are common
there; the gate is never loosened for that.
"""

from __future__ import annotations

from verify.adapter_support import StandardAdapter

DEPLOYMENT = "llama32_1b"
MODEL_CHOICES = {"fixture": "llama32-1b-fixture"}
DEFAULT_MODEL = "fixture"

_adapter = StandardAdapter(DEPLOYMENT, MODEL_CHOICES)
resolve_model = _adapter.resolve_model
hf_reference = _adapter.hf_reference
build_config = _adapter.build_config
build_runner = _adapter.build_runner
