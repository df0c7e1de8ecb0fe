"""``turbine_aot.exporter``: the reference path of :func:`export` and :class:`ExportOutput`."""

from __future__ import annotations

from ._exporter import ExportOutput, export

__all__ = ["ExportOutput", "export"]
