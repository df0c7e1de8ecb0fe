"""The ``turbine-aot`` command line: export, compile, run, bundle, inspect, demo, llm.

``main`` (the console script ``turbine-aot`` and ``python -m turbine_aot``) is in :mod:`.main`;
it is re-exported here as the entry point the package metadata names.

Modules, lowest first:

- :mod:`.progress`: stage progress and timings.
- :mod:`.errors`: ordinary mistakes as one-line errors (user code, input tensors, dtypes).
- :mod:`.inputs`: model sources (``file.py[:NAME]``), example-input specs, ``CliError``.
- :mod:`.inspection`: ``turbine-aot inspect``: what a ``.vmfb``, bundle or ``.mlir`` holds.
- :mod:`.demo`: the embedded transformer demo.
- :mod:`.llm_commands`: ``turbine-aot llm``.
- :mod:`.commands`: the other commands.
- :mod:`.output`: results as text.
- :mod:`.parser`: the argument parser.
- :mod:`.main`: the entry point.
"""

from __future__ import annotations

from .main import main

__all__ = ["main"]
