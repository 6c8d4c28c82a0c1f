"""SmolLM2-135M verify adapter: what the shared gate (llms/verify/) needs from this deployment.

Everything this deployment decides is in its deployment.json (checkpoint choices, default
model and prompt, prompt format, context); the rules that apply it (--model resolution,
chat template or raw text) are llms/common/deployment.h's, so make run and make verify agree.
build_runner returns the shared EngineRunner over the production Session::setup /
prefill / decode_step, as for every deployment.
"""

from __future__ import annotations

from verify.adapter_support import adapter_module

globals().update(adapter_module(__file__))
