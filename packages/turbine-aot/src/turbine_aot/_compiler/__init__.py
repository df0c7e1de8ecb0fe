"""turbine-aot's compiler layer: everything between an imported MLIR module and a ``.vmfb``.

Below the export side (``_export``: ``export``, ``ExportOutput``) and the runtime (``_runtime``,
``_bundle``), which both use it; it imports neither (``tools/check_layers.py`` enforces it).

- :mod:`.targets`: the target registry (turbine's target names, the IREE device and backend
  each selects, its runtime driver).
- :mod:`.traits`: what a program's IR says its default flags depend on (dynamic dimensions,
  fp32 only, narrow matmuls, narrow integer types), as :class:`.traits.ProgramTraits`.
- :mod:`.flags`: the flag policy, for every target and program trait (defaults, tuned CPU and
  CUDA flags, the speed-only groups, runtime flags).
- :mod:`.refusals`: program and target combinations IREE miscompiles, refused before compiling.
- :mod:`.fallback`: the retry rule for speed-only defaults (``compile_with_fallback``).
- :mod:`.rewrites`: the copy of a module handed to IREE for given flags, with
  :mod:`.attention` (CPU attention as matmul + softmax) and :mod:`.casts` (float -> integer
  casts IREE 3.13 gets wrong) and :mod:`.convs` (stem and 1x1 convolutions as matmuls on
  llvm-cpu) applied, all over :mod:`.torch_ir` (module walking and torch types), and
  :mod:`.globals` (mutable globals of one type and initial value, which IREE 3.13 gives one
  buffer).
- :mod:`.session`: in-process compiler sessions and invocations, diagnostics captured.
- :mod:`.invoke`: one compile of a module with final flags, in process or with the
  ``iree-compile`` tool in a subprocess.
- :mod:`.cache`: the content-addressed compile cache (``CompileCache``, ``compile_mlir``); the
  export side compiles an ``ExportOutput`` through it (``_export.cached_compile``).
"""
