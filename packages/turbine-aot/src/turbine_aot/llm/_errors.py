"""Errors of :mod:`turbine_aot.llm`."""

from __future__ import annotations

from .._errors import ExportError, TurbineAotError

__all__ = ["LLMError", "LLMExportError"]


class LLMError(TurbineAotError):
    """Something about an LLM export or generation a user can fix (the message says what)."""


class LLMExportError(LLMError, ExportError):
    """A model or option that :func:`~turbine_aot.llm.export_causal_lm` cannot export."""
