"""The export side: ``export()`` and ``ExportOutput``, from a torch program to an imported MLIR
module, compiled to a ``.vmfb`` and loaded through the runtime.

Modules, lowest first:

- :mod:`.diagnosis`: what ``export()`` says when ``torch.export`` fails (torch's whole message,
  the hints that apply, the CLI's wording).
- :mod:`.cached_compile`: an ``ExportOutput`` compiled through the compile cache, its flags
  computed once (``compile_export_output``).
- :mod:`.output`: :class:`~.output.ExportOutput` (the IR, ``compile``, ``load``).
- :mod:`.exporter`: ``export()``.
"""
