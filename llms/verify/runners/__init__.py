"""Runners: one side of the comparison each (our engine through its binding, HF transformers)."""

from verify.runners.records import DecodeStepRecord, PrefillRecord, Runner

__all__ = ["DecodeStepRecord", "PrefillRecord", "Runner"]
