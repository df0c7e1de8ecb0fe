"""Build actions: export model variants as actions of an ``iree.build`` graph.

``turbine_generate(generator, *args, name=..., out_of_process=True, **kwargs)`` runs a generator
(a module-level function returning ``ExportOutput``) as a build action whose outputs are
``{name}.mlir`` files, ready for ``iree.build``'s ``compile``. See ``docs/build-actions.md``.
"""

from __future__ import annotations

from ._build_actions import action as _action
from ._build_actions.action import *  # noqa: F403  (the public names are its __all__)
from ._build_actions.pool import shutdown_generator_pools

__all__ = [*_action.__all__, "shutdown_generator_pools"]
