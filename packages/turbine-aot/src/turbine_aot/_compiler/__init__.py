"""turbine-aot's compiler layer: everything between an imported MLIR module and a ``.vmfb``.

Below the exporter (``_exporter``: ``export``, ``ExportOutput``) and the runtime (``_runtime``,
``_bundle``), which both use it; it imports neither (``tools/check_layers.py`` enforces it).

- :mod:`.targets`: the flag policy, for every target and program trait (defaults, tuned CPU and
  CUDA flags, program-dependent flags, refusals of combinations IREE miscompiles) and the retry
  rule for speed-only defaults (``compile_with_fallback``).
- :mod:`.rewrites`: the copy of a module handed to IREE for given flags, with
  :mod:`.attention` (CPU attention as matmul + softmax) and :mod:`.casts` (float -> integer
  casts IREE 3.13 gets wrong) and :mod:`.convs` (stem and 1x1 convolutions as matmuls on
  llvm-cpu) applied, all over :mod:`.torch_ir`, and :mod:`.globals` (mutable globals of one
  type and initial value, which IREE 3.13 gives one buffer).
- :mod:`.session`: in-process compiler sessions and invocations, diagnostics captured.
- :mod:`.invoke`: one compile of a module with final flags, in process or with the
  ``iree-compile`` tool in a subprocess.
- :mod:`.cache`: the content-addressed compile cache (``compile_mlir``, ``compile_export_output``).
"""
