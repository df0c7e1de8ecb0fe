"""A loaded VM module's functions and their records: the module's name, its public functions
with their reflection (read once), and each function's signature (flat ABI and call record)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from .abi import FlatSignature, TensorSpec, parse_abi_declaration
from .call import CallSignature
from .errors import damaged_module_error
from .keys import COMPILE_KEY

__all__ = [
    "compile_record_of",
    "compiled_with_flags",
    "function_signature",
    "module_functions",
    "module_name",
]

logger = logging.getLogger("turbine.aot.runtime")


def function_signature(
    name: str,
    reflection: Mapping[str, str] | None,
    given: FlatSignature | None = None,
    *,
    where: str = "the module",
) -> FlatSignature:
    """A compiled function's signature from its reflection: the flat ABI from
    ``iree.abi.declaration`` (else ``given``, else the recorded call signature) and the call
    signature turbine records at export (else ``given``'s).

    Raises:
        TurbineRuntimeError: the call signature record is damaged (``where`` names the module
            in the message).
    """
    call = CallSignature.from_reflection(reflection, where=f"{where}: function {name!r}")
    decl = (reflection or {}).get("iree.abi.declaration", "")
    if not isinstance(decl, str):
        decl = ""
    if decl:
        sig = parse_abi_declaration(name, decl)
    elif given is not None and (given.inputs or given.outputs):
        sig = FlatSignature(name, given.inputs, given.outputs)
    elif call is not None:
        sig = FlatSignature(
            name,
            tuple(_leaf_spec(x) for x in call.flat_inputs()),
            tuple(_leaf_spec(x) for x in call.flat_results()),
        )
    else:
        sig = FlatSignature(name, (), ())
    if call is None and given is not None:
        call = given.call
    if call is not None and (
        (sig.inputs and len(call.flat_inputs()) != len(sig.inputs))
        or (sig.outputs and any((r.index or 0) >= len(sig.outputs) for r in call.flat_results()))
    ):
        logger.warning("%s: recorded call signature does not fit its ABI; flat calls", name)
        call = None
    return FlatSignature(sig.name, sig.inputs, sig.outputs, call)


def module_name(vm_module: Any, where: str) -> str:
    """``VmModule.name``; a name IREE cannot hand to Python (not UTF-8) is a damaged module."""
    try:
        return str(vm_module.name)
    except Exception as e:
        raise damaged_module_error(where, "the module's name", e) from e


def module_functions(vm_module: Any, where: str) -> list[tuple[str, Any, dict[str, str]]]:
    """The public functions of a loaded ``iree.runtime.VmModule``: (name, function,
    reflection), leaving out ``__init`` and the ``$async`` variants (which take fences).

    Raises:
        TurbineRuntimeError: a function name or reflection string is unreadable (not UTF-8:
            IREE's binding raises a bare ``RuntimeError`` for those), naming ``where``.
    """
    try:
        names = [str(n) for n in vm_module.function_names]
    except Exception as e:
        raise damaged_module_error(where, "the module's function table", e) from e
    out = []
    for i, name in enumerate(names):
        if name.startswith("__") or "$" in name:
            continue
        try:
            fn = vm_module.lookup_function(name)
            reflection = dict(fn.reflection or {})
        except Exception as e:
            raise damaged_module_error(
                where, f"the reflection (signature record) of function {i} ({name!r})", e
            ) from e
        out.append((name, fn, reflection))
    return out


def _leaf_spec(leaf: Any) -> TensorSpec:
    if leaf.kind != "tensor":
        return TensorSpec((), leaf.dtype or "?", is_tensor=False, device=leaf.device)
    shape = tuple(d if isinstance(d, int) else None for d in leaf.shape)
    return TensorSpec(shape, leaf.dtype, device=leaf.device)


def compile_record_of(reflection: Mapping[str, str] | None) -> dict[str, Any] | None:
    """What a function's reflection records of the module's compile (``{"flags": [...],
    "compiler": version}``, written by ``_signatures.recording.compile_record``), or ``None``
    when it records none or the record is not a JSON object."""
    text = (reflection or {}).get(COMPILE_KEY)
    if not isinstance(text, str):
        return None
    try:
        record = json.loads(text)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def compiled_with_flags(reflection: Mapping[str, str] | None) -> list[str] | None:
    """The compile flags a function's reflection records the module was built with (the flags
    IREE got: without the speed-only defaults when a compile with them failed), or ``None``."""
    flags = (compile_record_of(reflection) or {}).get("flags")
    if isinstance(flags, list) and all(isinstance(f, str) for f in flags):
        return flags
    return None
