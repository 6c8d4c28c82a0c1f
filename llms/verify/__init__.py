"""Shared, model-agnostic verify subsystem: every deployment is gated against HF transformers bf16.

Import as ``verify.<module>`` with ``llms/`` on ``sys.path`` (the make targets set PYTHONPATH).
"""
