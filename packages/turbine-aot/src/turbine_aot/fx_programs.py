"""``turbine_aot.fx_programs``: the reference path of ``FxPrograms`` and ``FxProgramsBuilder``
(implemented in ``turbine_fx``)."""

from __future__ import annotations

from turbine_fx import FxPrograms, FxProgramsBuilder

__all__ = ["FxPrograms", "FxProgramsBuilder"]
