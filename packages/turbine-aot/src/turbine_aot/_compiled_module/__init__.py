"""``CompiledModule``: class-based programs assembled into one MLIR module, and its import phases.

Modules, lowest first:

- :mod:`.program_calls`: calling a private ``ExportedProgram`` attribute from a procedure.
- :mod:`.info`: what a class declares (import phases, export descriptors, class and instance
  info, the metaclass).
- :mod:`.trace`: importing an instance's exports: programs, globals, procedures traced through
  proxies.
- :mod:`.custom_ops`: custom ops with an MLIR expansion (the ``custom_op_expansion`` phase).
- :mod:`.input_pipeline`: the IREE input pipeline (torch dialect -> IREE input), in place.
- :mod:`.module_io`: verifying and saving an MLIR module.
- :mod:`.module`: the :class:`~.module.CompiledModule` class.
"""
