"""Support modules of the reference API path ``turbine_aot.support`` (see ``procedural``)."""

from __future__ import annotations

from . import procedural

__all__ = ["procedural"]
