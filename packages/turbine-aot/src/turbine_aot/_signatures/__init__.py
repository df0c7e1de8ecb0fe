"""Call signatures recorded in compiled modules: call a compiled function like the eager one.

At export, each public function gets records of how the eager program was called, stored in the
function's ``iree.reflection`` dictionary so that they survive compilation into the ``.vmfb``
(IREE's runtime returns them from ``VmFunction.reflection``) and in bundle manifests:

- ``torch.args_schema``: torch's pytree spec of the call's ``(positional, keyword)`` arguments,
  serialized with ``torch.utils._pytree.treespec_dumps`` (the record procedural
  ``CompiledModule`` functions carry as a function attribute);
- ``torch.return_schema``: the pytree spec of the result (tuples, lists, dicts, dataclass-like
  outputs such as ``transformers``' ``ModelOutput``);
- ``turbine.signature``: JSON with the argument names and, per leaf of both trees, its path, kind
  (tensor, scalar or a constant specialized at export), the compiled function's argument/result
  index, dtype and shape, where a dynamic dimension is named by its symbol, with the symbol's
  ``min``/``max`` from the ``ExportedProgram``'s range constraints.

:class:`CallSignature` reads them back, binds a call's positional and keyword arguments the way
Python binds them, walks the recorded tree to flatten them (a dict may come in any key order),
checks every input (count, keywords, structure, dtype, rank, static dimensions, dynamic dimensions
against their range and against each other) before anything reaches IREE, and rebuilds the
recorded output structure from the flat results.

Modules, lowest first:

- :mod:`.keys`: the reflection keys turbine records.
- :mod:`.element_types`: the ABI's element type names (MLIR spelling) and their torch dtypes.
- :mod:`.errors`: the call-argument errors and the damaged-record error.
- :mod:`.leaf`: one leaf of a recorded argument or result tree (:class:`~.leaf.Leaf`).
- :mod:`.checks`: checking one argument against its leaf (dtype, rank, dimensions and ranges).
- :mod:`.trees`: torch pytree specs: reading them back, flattening a call along one, labels.
- :mod:`.call`: :class:`~.call.CallSignature`, the eager call's record: its checks on load,
  binding a call, rebuilding the results.
- :mod:`.abi`: the flat IREE ABI (:class:`~.abi.TensorSpec`, :class:`~.abi.FlatSignature`)
  from ``iree.abi.declaration`` text or a module's function types.
- :mod:`.reflection`: a loaded VM module's functions and their records, read once.
- :mod:`.recording`: the export side: the records computed and written into the module.
"""
