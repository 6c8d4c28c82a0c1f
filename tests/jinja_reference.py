"""The reference side of the Jinja differential tests: transformers' own chat-template
environment (ImmutableSandboxedEnvironment(trim_blocks, lstrip_blocks, loopcontrols,
{% generation %}) with its tojson, raise_exception and strftime_now) over jinja2==3.1.6,
and the binding's render_jinja on the other side, both given the same variables.

strftime_now reads one fixed clock on both sides (UTC), so a render does not depend on
the hour it runs at.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import jinja2
from transformers.utils.chat_template_utils import _compile_jinja_template

NOW = 1_735_732_800  # 2025-01-01 12:00 UTC


def _strftime_now(fmt: str) -> str:
    return datetime.fromtimestamp(NOW, UTC).strftime(fmt)


def compile_reference(source: str) -> jinja2.Template:
    template = _compile_jinja_template(source)
    template.globals["strftime_now"] = _strftime_now
    return template


class Raised(Exception):
    """The template called raise_exception(message)."""


class Failed(Exception):
    """Any other failure to parse or render."""


def render_reference(source: str, context: dict[str, Any]) -> str:
    """jinja2's text, or Raised / Failed."""
    try:
        return compile_reference(source).render(**context)
    except jinja2.TemplateError as e:
        # raise_exception raises the base class itself; jinja2's own errors are subclasses.
        if type(e) is jinja2.TemplateError:
            raise Raised(str(e)) from e
        raise Failed(f"{type(e).__name__}: {e}") from e
    except Exception as e:  # a Python error inside the template (TypeError, ...)
        raise Failed(f"{type(e).__name__}: {e}") from e


def render_ours(binding: Any, source: str, context: dict[str, Any], fault: str = "none") -> str:
    """Our interpreter's text, or Raised / Failed as the reference has them."""
    try:
        return binding.render_jinja(source, json.dumps(context), now=NOW, fault=fault)
    except binding.TemplateRaised as e:
        raise Raised(str(e)) from e
    except binding.TemplateError as e:
        raise Failed(str(e)) from e


def outcome(render: Any, *args: Any, **kwargs: Any) -> tuple[str, str]:
    """("text", rendered) or ("raised", message) or ("failed", why)."""
    try:
        return "text", render(*args, **kwargs)
    except Raised as e:
        return "raised", str(e)
    except Failed as e:
        return "failed", str(e)


def same(ref: tuple[str, str], ours: tuple[str, str]) -> bool:
    """Byte-identical text, or the same raise_exception message, or both failing."""
    if ref[0] != ours[0]:
        return False
    return ref[0] == "failed" or ref[1] == ours[1]
