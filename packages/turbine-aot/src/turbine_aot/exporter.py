"""``turbine_aot.exporter``: the reference path of :func:`export` and :class:`ExportOutput`."""

from __future__ import annotations

from ._export.exporter import export
from ._export.output import ExportOutput

__all__ = ["ExportOutput", "export"]
