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
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from turbine_aot._compiler.torch_ir import public_functions
from turbine_aot._errors import TurbineRuntimeError
from turbine_aot._runtime_tensors import element_type_name

__all__ = [
    "ARGS_SCHEMA",
    "RETURN_SCHEMA",
    "SIGNATURE_KEY",
    "CallArgumentTypeError",
    "CallArgumentValueError",
    "CallSignature",
    "Leaf",
    "record_module_signatures",
]

logger = logging.getLogger("turbine.aot.runtime")

REFLECTION_ATTR = "iree.reflection"
ARGS_SCHEMA = "torch.args_schema"
RETURN_SCHEMA = "torch.return_schema"
SIGNATURE_KEY = "turbine.signature"
#: the version of the ``turbine.signature`` JSON; a newer one is ignored (flat calls)
SIGNATURE_FORMAT = 1
#: the parameters the module reads (JSON list), recorded on its first public function
PARAMETERS_KEY = "turbine.parameters"
#: the compile flags and compiler version (JSON), recorded on the first public function while
#: compiling (the exported IR is left as it was)
COMPILE_KEY = "turbine.compile"
#: function attribute (turbine_fx) holding the constant outputs the function does not return
_CONSTANT_RESULTS_ATTR = "turbine.constant_results"


class CallArgumentTypeError(TurbineRuntimeError, TypeError):
    """A call's arguments do not fit the function: count, an unknown, repeated or missing
    keyword, a structure other than the exported one, a non-tensor where a tensor is expected."""


class CallArgumentValueError(TurbineRuntimeError, ValueError):
    """An argument has the wrong dtype, rank or dimension, a dynamic dimension outside its
    exported range, or a constant specialized at export has another value."""


def type_error(msg: str) -> CallArgumentTypeError:
    return CallArgumentTypeError(msg)


def value_error(msg: str) -> CallArgumentValueError:
    return CallArgumentValueError(msg)


# ----------------------------------------------------------------------------- flat ABI
@dataclass(frozen=True)
class TensorSpec:
    """One argument or result of an exported function, as its ABI declares it.

    Attributes:
        shape: dimensions; ``None`` for a dynamic one.
        dtype: the MLIR element type (``"f32"``, ``"bf16"``, ``"i64"``...), or the whole type
            for a non-tensor value (``"i64"`` scalar, ``"!hal.buffer_view"``).
        is_tensor: False for scalars and opaque values.
        device: the device name from ``iree.abi.affinity`` (``"__device_1"``), if any.
    """

    shape: tuple[int | None, ...]
    dtype: str
    is_tensor: bool = True
    device: str | None = None

    @property
    def torch_dtype(self):
        """The torch dtype, or None when the element type has none."""
        return element_type_name(self.dtype) if self.is_tensor else None

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (used by bundle manifests)."""
        out: dict[str, Any] = {"shape": list(self.shape), "dtype": self.dtype}
        if not self.is_tensor:
            out["is_tensor"] = False
        if self.device is not None:
            out["device"] = self.device
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> TensorSpec:
        return cls(
            shape=tuple(d["shape"]),
            dtype=d["dtype"],
            is_tensor=d.get("is_tensor", True),
            device=d.get("device"),
        )

    def __str__(self) -> str:
        if not self.is_tensor:
            return self.dtype
        dims = "x".join("?" if d is None else str(d) for d in self.shape)
        return f"tensor<{dims + 'x' if dims else ''}{self.dtype}>"


@dataclass(frozen=True)
class FunctionSignature:
    """Arguments and results of one exported function.

    Attributes:
        name: the function name.
        inputs: the compiled function's flat arguments (from its ``iree.abi.declaration``, the
            exported IR, or the recorded call signature).
        outputs: its flat results.
        call: how the eager program was called (argument names and trees, dynamic dimension
            ranges, the result tree), when the module records it (exported by turbine); calls
            then take the eager arguments and return the eager structure. None: flat calls.
    """

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    call: CallSignature | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "inputs": [s.to_json() for s in self.inputs],
            "outputs": [s.to_json() for s in self.outputs],
        }
        if self.call is not None:
            out["call"] = self.call.to_json()
        return out

    @classmethod
    def from_json(cls, name: str, d: Mapping[str, Any]) -> FunctionSignature:
        call = None
        if isinstance(d.get("call"), Mapping):
            call = CallSignature.from_json(d["call"])
        return cls(
            name,
            tuple(TensorSpec.from_json(x) for x in d["inputs"]),
            tuple(TensorSpec.from_json(x) for x in d["outputs"]),
            call,
        )


def _split_top_level(text: str) -> list[str]:
    """Splits on commas not nested in <>, (), {}, []."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "<({[":
            depth += 1
        elif ch in ">)}]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur).strip())
    return parts


_TENSOR_RE = re.compile(r"^tensor<(.*)>$")
_VTENSOR_RE = re.compile(r"^!torch\.vtensor<\[([^\]]*)\],\s*(.+)>$")
# torch-dialect dtype spellings that differ from the builtin ones at the ABI
_TORCH_DTYPE_TO_ABI = {"si8": "i8", "si16": "i16", "si32": "i32", "si64": "i64", "ui8": "ui8"}
_AFFINITY_RE = re.compile(
    r"iree\.abi\.affinity\s*=\s*#hal\.device\.(?:promise|affinity)<@([\w.$-]+)"
)


def _parse_value(decl: str) -> TensorSpec:
    # "%input0: tensor<?x4xf32> {iree.abi.affinity = ...}" or "tensor<4xf32>"
    body = decl.split(":", 1)[-1].strip() if decl.startswith("%") else decl.strip()
    attrs = ""
    if "{" in body:
        # the type itself never contains '{' (tensor encodings are not part of the ABI)
        idx = body.index("{")
        body, attrs = body[:idx].strip(), body[idx:]
    m = _AFFINITY_RE.search(attrs)
    device = m.group(1) if m else None
    vm = _VTENSOR_RE.match(body)
    if vm:
        vdims = [d.strip() for d in vm.group(1).split(",") if d.strip()]
        if all(d in ("?", "-1") or _DIM_RE.fullmatch(d) for d in vdims):
            dims = tuple(None if d in ("?", "-1") else int(d) for d in vdims)
            dtype = vm.group(2).strip()
            return TensorSpec(dims, _TORCH_DTYPE_TO_ABI.get(dtype, dtype), device=device)
    tm = _TENSOR_RE.match(body)
    if tm:
        parts = _split_top_level_x(tm.group(1))
        if all(p == "?" or _DIM_RE.fullmatch(p) for p in parts[:-1]):
            dims = tuple(None if p == "?" else int(p) for p in parts[:-1])
            return TensorSpec(dims, parts[-1], device=device)
    # Another type, or one this parser cannot read (a damaged declaration): kept as its text.
    return TensorSpec((), body, is_tensor=False, device=device)


_DIM_RE = re.compile(r"[0-9]{1,18}")


def _split_top_level_x(text: str) -> list[str]:
    """``4x?xcomplex<f32>`` -> ``['4', '?', 'complex<f32>']``."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        if ch == "x" and depth == 0 and cur and all(c.isdigit() or c == "?" for c in cur):
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def parse_abi_declaration(name: str, declaration: str) -> FunctionSignature:
    """Parses IREE's ``iree.abi.declaration`` reflection string into a signature.

    Args:
        name: the function name.
        declaration: e.g. ``"sync func @main(%input0: tensor<?x4xf32>) -> (%output0: ...)"``.

    Returns:
        The signature; unknown constructs become non-tensor specs holding the type text.
    """
    m = re.search(r"@[\w.$-]+\(", declaration)
    if not m:
        return FunctionSignature(name, (), ())
    start, depth = m.end(), 1
    i = start
    while i < len(declaration) and depth:
        depth += {"(": 1, ")": -1}.get(declaration[i], 0)
        i += 1
    ins = tuple(_parse_value(p) for p in _split_top_level(declaration[start : i - 1]))
    res = declaration[i:].strip().removeprefix("->").strip()
    if res.startswith("(") and res.endswith(")"):
        res = res[1:-1]
    outs = tuple(_parse_value(p) for p in _split_top_level(res)) if res else ()
    return FunctionSignature(name, ins, outs)


def signatures_from_mlir(module_op: Any) -> dict[str, FunctionSignature]:
    """Signatures of the public functions of an MLIR module (an ``Operation`` or an object with
    ``mlir_module``, e.g. ``ExportOutput``), for modules whose ``.vmfb`` carries no ABI
    reflection (torch-dialect input). Argument affinities come from ``iree.abi.affinity``.
    """
    out: dict[str, FunctionSignature] = {}
    for f in public_functions(module_op, kinds=("func.func",)):
        attrs = f.attributes
        name = str(attrs["sym_name"]).strip('"')
        ftype = str(attrs["function_type"])
        arg_attrs = [str(a) for a in attrs["arg_attrs"]] if "arg_attrs" in attrs else []
        m = re.match(r"^\((.*)\)\s*->\s*(.*)$", ftype, re.S)
        if not m:
            continue
        arg_types = _split_top_level(m.group(1))
        decl_args = [
            f"{t} {arg_attrs[i]}" if i < len(arg_attrs) and arg_attrs[i] != "{}" else t
            for i, t in enumerate(arg_types)
        ]
        res = m.group(2).strip()
        if res.startswith("(") and res.endswith(")"):
            res = res[1:-1]
        out[name] = FunctionSignature(
            name,
            tuple(_parse_value(a) for a in decl_args),
            tuple(_parse_value(r) for r in _split_top_level(res)) if res else (),
        )
    return out


def function_signature(
    name: str,
    reflection: Mapping[str, str] | None,
    given: FunctionSignature | None = None,
    *,
    where: str = "the module",
) -> FunctionSignature:
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
        sig = FunctionSignature(name, given.inputs, given.outputs)
    elif call is not None:
        sig = FunctionSignature(
            name,
            tuple(_leaf_spec(x) for x in call.flat_inputs()),
            tuple(_leaf_spec(x) for x in call.flat_results()),
        )
    else:
        sig = FunctionSignature(name, (), ())
    if call is None and given is not None:
        call = given.call
    if call is not None and (
        (sig.inputs and len(call.flat_inputs()) != len(sig.inputs))
        or (sig.outputs and any((r.index or 0) >= len(sig.outputs) for r in call.flat_results()))
    ):
        logger.warning("%s: recorded call signature does not fit its ABI; flat calls", name)
        call = None
    return FunctionSignature(sig.name, sig.inputs, sig.outputs, call)


def damaged_module_error(where: str, what: str, error: BaseException) -> TurbineRuntimeError:
    """The error for a module whose records cannot be read: ``where`` (the file, and the
    function), ``what`` is damaged, and what IREE or the reader said."""
    said = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
    return TurbineRuntimeError(
        f"{where}: {what} is unreadable ({type(error).__name__}: {said}); the module is "
        "damaged: rebuild it (or get an intact copy)"
    )


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


def affinity_device_index(name: str | None, named: dict[str, int]) -> int:
    """The device index of an ``iree.abi.affinity`` name: ``__device_N`` is N; other names
    take indices in the order they first appear (``named`` remembers them)."""
    if name is None:
        return 0
    m = re.fullmatch(r"__device_(\d+)", name)
    return int(m.group(1)) if m else named.setdefault(name, len(named))


def _leaf_spec(leaf: Any) -> TensorSpec:
    if leaf.kind != "tensor":
        return TensorSpec((), leaf.dtype or "?", is_tensor=False, device=leaf.device)
    shape = tuple(d if isinstance(d, int) else None for d in leaf.shape)
    return TensorSpec(shape, leaf.dtype, device=leaf.device)


# ----------------------------------------------------------------------------- records
Dim = int | str | None  # a static size, a symbol / expression, or unknown


@dataclass(frozen=True)
class Leaf:
    """One leaf of an argument or result tree.

    Attributes:
        path: where it is, as Python would write it: ``x``, ``inputs['ids']``, ``[1][0]``.
        kind: ``"tensor"``, ``"scalar"`` (a Python number passed to the function) or
            ``"constant"`` (specialized at export: not an argument/result of the function).
        index: the compiled function's argument (or result) index; None for a constant.
        dtype: the MLIR element type (tensors) or scalar type.
        shape: per dimension an int, a symbol/expression string (dynamic), or None (dynamic,
            unnamed).
        value: a constant's value (JSON).
        device: the ``iree.abi.affinity`` device name of an argument, if any.
    """

    path: str
    kind: str
    index: int | None = None
    dtype: str | None = None
    shape: tuple[Dim, ...] = ()
    value: Any = None
    device: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "kind": self.kind}
        if self.index is not None:
            out["index"] = self.index
        if self.dtype is not None:
            out["dtype"] = self.dtype
        if self.kind == "tensor":
            out["shape"] = list(self.shape)
        if self.kind == "constant":
            out["value"] = self.value
        if self.device is not None:
            out["device"] = self.device
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Leaf:
        return cls(
            path=str(d["path"]),
            kind=str(d["kind"]),
            index=d.get("index"),
            dtype=d.get("dtype"),
            shape=tuple(d.get("shape", ())),
            value=d.get("value"),
            device=d.get("device"),
        )

    def type_text(self, symbols: bool = False) -> str:
        """``tensor<?x4xf32>`` (with ``symbols``, dynamic dims by symbol: ``tensor<s0x4xf32>``)."""
        if self.kind == "constant":
            return f"constant {_py(self.value)}"
        if self.kind != "tensor":
            return str(self.dtype)
        dims = "x".join(
            str(d) if isinstance(d, int) or (symbols and d is not None) else "?" for d in self.shape
        )
        return f"tensor<{dims + 'x' if dims else ''}{self.dtype}>"


@dataclass(frozen=True)
class CallSignature:
    """How a compiled function is called and what it returns, as recorded at export.

    Attributes:
        args_schema: ``treespec_dumps`` of the ``(positional, keyword)`` argument tree.
        return_schema: ``treespec_dumps`` of the result tree (None: results stay flat).
        arg_names: the names of the top-level arguments, positional ones first, in the order
            positional calls fill them.
        args: the argument tree's leaves, in pytree order.
        results: the result tree's leaves, in pytree order (empty with no ``return_schema``).
        dims: dynamic dimension symbol -> (min, max or None for unbounded).
        defaults: parameters the export did not pass, with their (JSON) default: a call may pass
            the same value.
    """

    args_schema: str
    return_schema: str | None
    arg_names: tuple[str, ...]
    args: tuple[Leaf, ...]
    results: tuple[Leaf, ...] = ()
    dims: Mapping[str, tuple[int, int | None]] = field(default_factory=dict)
    defaults: Mapping[str, Any] = field(default_factory=dict)

    # ---- serialization
    def to_json(self) -> dict[str, Any]:
        return {
            "format": SIGNATURE_FORMAT,
            "args_schema": self.args_schema,
            "return_schema": self.return_schema,
            "arg_names": list(self.arg_names),
            "args": [leaf.to_json() for leaf in self.args],
            "results": [leaf.to_json() for leaf in self.results],
            "dims": {k: {"min": lo, "max": hi} for k, (lo, hi) in self.dims.items()},
            "defaults": dict(self.defaults),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CallSignature:
        return cls(
            args_schema=str(d["args_schema"]),
            return_schema=d.get("return_schema"),
            arg_names=tuple(d.get("arg_names", ())),
            args=tuple(Leaf.from_json(x) for x in d.get("args", ())),
            results=tuple(Leaf.from_json(x) for x in d.get("results", ())),
            dims={k: (int(v["min"]), v.get("max")) for k, v in (d.get("dims") or {}).items()},
            defaults=dict(d.get("defaults") or {}),
        )

    def to_reflection(self) -> dict[str, str]:
        """The ``iree.reflection`` entries (strings) recording this signature."""
        body = self.to_json()
        out = {ARGS_SCHEMA: body.pop("args_schema"), SIGNATURE_KEY: json.dumps(body)}
        schema = body.pop("return_schema")
        if schema is not None:
            out[RETURN_SCHEMA] = schema
        return out

    @classmethod
    def from_reflection(
        cls, reflection: Mapping[str, str] | None, *, where: str = "the module"
    ) -> CallSignature | None:
        """The signature a compiled function's reflection records, or None (no records, or
        records of a newer format or pytree protocol than this version reads: the function is
        then called with flat arguments).

        Every field the calls rely on is checked here, when the module is loaded, so that a
        damaged record is an error that names it, not an exception at the first call.

        Raises:
            TurbineRuntimeError: a record is damaged (not JSON, missing or mistyped fields,
                trees that do not match the leaves); ``where`` names the module in the message.
        """
        if not reflection or SIGNATURE_KEY not in reflection:
            return None
        what = f"its call signature record ({SIGNATURE_KEY})"
        try:
            body = json.loads(reflection[SIGNATURE_KEY])
            if not isinstance(body, dict):
                raise TypeError(f"a JSON {type(body).__name__}, not an object")
            fmt = body.get("format", 0)
            if not isinstance(fmt, int):
                raise TypeError(f"format is {type(fmt).__name__}, not an integer")
        except (ValueError, TypeError, RecursionError) as e:
            raise damaged_module_error(where, what, e) from e
        if fmt > SIGNATURE_FORMAT:
            logger.warning(
                "call signature format %s is newer than this turbine-aot reads; calls take "
                "flat arguments",
                fmt,
            )
            return None
        if ARGS_SCHEMA not in reflection:
            e = KeyError(f"{ARGS_SCHEMA} is missing")
            raise damaged_module_error(where, f"its argument tree ({ARGS_SCHEMA})", e) from e
        body["args_schema"] = reflection[ARGS_SCHEMA]
        body["return_schema"] = reflection.get(RETURN_SCHEMA)
        try:
            sig = cls.from_json(body)
            sig._check_leaves()
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
            raise damaged_module_error(where, what, e) from e
        try:
            sig._check_trees(where)
        except TurbineRuntimeError:
            for key in (ARGS_SCHEMA, RETURN_SCHEMA):
                newer = _newer_pytree_protocol(reflection.get(key))
                if newer is not None:  # not damage: a module from a newer torch
                    logger.warning(
                        "%s: the %s record uses pytree protocol %s, newer than this torch "
                        "reads; calls take flat arguments",
                        where,
                        key,
                        newer,
                    )
                    return None
            raise
        return sig

    def _check_leaves(self) -> None:
        """Raises ValueError/TypeError naming the first field of the record that has a wrong
        type or value (what ``from_json`` converts leniently is checked here)."""
        if not isinstance(self.args_schema, str):
            raise TypeError("args_schema is not a string")
        if self.return_schema is not None and not isinstance(self.return_schema, str):
            raise TypeError("return_schema is not a string")
        for i, n in enumerate(self.arg_names):
            if not isinstance(n, str):
                raise TypeError(f"arg_names[{i}] is {type(n).__name__}, not a string")
        for group, leaves in (("args", self.args), ("results", self.results)):
            for i, leaf in enumerate(leaves):
                _check_leaf_record(f"{group}[{i}]", leaf)
            indices = [leaf.index for leaf in leaves if leaf.index is not None]
            if sorted(indices) != list(range(len(indices))):
                raise ValueError(
                    f"{group}: the flat indices {indices} are not 0..{len(indices) - 1}"
                )
        for sym, (lo, hi) in self.dims.items():
            if (
                not isinstance(sym, str)
                or lo < 0
                or not (hi is None or type(hi) is int)
                or (hi is not None and hi < lo)
            ):
                raise ValueError(f"dims[{sym!r}]: the range {lo}..{hi} is not a valid size range")
        if not isinstance(self.defaults, dict) or not all(
            isinstance(k, str) for k in self.defaults
        ):
            raise TypeError("defaults is not an object of names")

    def _check_trees(self, where: str) -> None:
        """The argument tree is a (positional tuple or list, keyword dict) pair with one leaf
        per recorded argument; the result tree has one leaf per recorded result."""
        try:
            spec = _load_spec(self.args_schema, warn=False)
            children = _children(spec)
            if spec.type is not tuple or len(children) != 2:
                raise ValueError("not a (positional, keyword) pair")
            pos, kw = children
            if pos.type not in (tuple, list) or kw.type is not dict:
                raise ValueError("not a (positional tuple or list, keyword dict) pair")
            if not all(isinstance(k, str) for k in (kw.context or [])):
                raise ValueError("keyword names are not strings")
            if spec.num_leaves != len(self.args):
                raise ValueError(
                    f"{spec.num_leaves} leaves for {len(self.args)} recorded arguments"
                )
        except Exception as e:  # torch's reader raises whatever a damaged tree makes it hit
            raise damaged_module_error(where, f"its argument tree ({ARGS_SCHEMA})", e) from e
        if self.return_schema is None:
            return
        try:
            out = _load_spec(self.return_schema, warn=False)
            if out.num_leaves != len(self.results):
                raise ValueError(
                    f"{out.num_leaves} leaves for {len(self.results)} recorded results"
                )
        except Exception as e:
            raise damaged_module_error(where, f"its result tree ({RETURN_SCHEMA})", e) from e

    # ---- flat ABI view
    def flat_inputs(self) -> list[Leaf]:
        """The non-constant argument leaves, by function argument index."""
        return sorted((a for a in self.args if a.index is not None), key=lambda a: a.index or 0)

    def flat_results(self) -> list[Leaf]:
        return sorted((a for a in self.results if a.index is not None), key=lambda a: a.index or 0)

    # ---- calling
    def bind(self, fn_label: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[Any]:
        """Binds and checks a call; returns the compiled function's flat arguments.

        Raises:
            CallArgumentTypeError: wrong count, an unknown, repeated or missing keyword, a
                structure (tuple length, dict keys, None) other than the recorded one, a
                non-tensor where a tensor is expected.
            CallArgumentValueError: dtype, rank, a static dimension, a dynamic dimension out of
                its range or inconsistent with another argument's, a specialized constant with
                another value.
        """
        spec = _load_spec(self.args_schema)
        pos_spec, kw_spec = _children(spec)
        n_pos = pos_spec.num_children
        kw_names = [str(k) for k in (kw_spec.context or [])]
        names = list(self.arg_names)
        if len(names) < n_pos + len(kw_names):
            names = [f"arg{i}" for i in range(n_pos)] + kw_names
        pos_names, all_names = names[:n_pos], names[: n_pos + len(kw_names)]
        # Keywords exported as keywords can also be given positionally, in the names' order.
        positional_ok = all_names
        if len(args) > len(positional_ok):
            raise type_error(
                f"{fn_label}() takes {len(positional_ok)} positional argument(s) "
                f"({', '.join(positional_ok) or 'none'}); got {len(args)}"
            )
        bound: dict[str, Any] = dict(zip(positional_ok, args))
        for k, v in kwargs.items():
            if k in bound:
                raise type_error(f"{fn_label}() got multiple values for argument {k!r}")
            if k not in all_names:
                if k in self.defaults and _same_constant(v, self.defaults[k]):
                    continue  # the default the export used
                if k in self.defaults:
                    raise value_error(
                        f"{fn_label}(): argument {k!r} was not passed at export, so the compiled "
                        f"program uses its default {_py(self.defaults[k])}; got "
                        f"{_describe(v)}. Export again passing {k}=..."
                    )
                raise type_error(
                    f"{fn_label}() got an unexpected keyword argument {k!r}; it takes "
                    f"{', '.join(all_names) or 'no arguments'}"
                )
            bound[k] = v
        missing = [n for n in all_names if n not in bound]
        if missing:
            raise type_error(
                f"{fn_label}() missing {len(missing)} required argument(s): "
                f"{', '.join(repr(n) for n in missing)}"
            )
        leaves: list[Any] = []
        pos_children = pos_spec.children() if hasattr(pos_spec, "children") else []
        for name, child in zip(pos_names, pos_children):
            _flatten_like(fn_label, bound[name], child, name, leaves)
        kw_children = kw_spec.children() if hasattr(kw_spec, "children") else []
        for name, child in zip(kw_names, kw_children):
            _flatten_like(fn_label, bound[name], child, name, leaves)
        if len(leaves) != len(self.args):
            raise type_error(
                f"{fn_label}(): the call has {len(leaves)} leaves but the recorded signature "
                f"{len(self.args)}; the module's records are inconsistent: export it again"
            )
        flat: list[Any] = [None] * len(self.flat_inputs())
        symbols: dict[str, tuple[int, str]] = {}
        for leaf, (_path, value) in zip(self.args, leaves):
            converted = self.check_leaf(fn_label, leaf, value, symbols)
            if leaf.index is not None:
                flat[leaf.index] = converted
        return flat

    def unflatten_inputs(self, flat: Sequence[Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The eager call's ``(args, kwargs)`` from the compiled function's flat arguments
        (constants specialized at export put back)."""
        from torch.utils._pytree import tree_unflatten

        leaves = [flat[a.index] if a.index is not None else a.value for a in self.args]
        pos, kw = tree_unflatten(leaves, _load_spec(self.args_schema))
        return tuple(pos), dict(kw)

    def check_flat(self, fn_label: str, flat: Sequence[Any]) -> None:
        """The same per-argument checks for the compiled function's flat arguments (the CLI's
        ``run``): dtype, rank, static dims, dynamic dims against their ranges."""
        inputs = self.flat_inputs()
        if len(flat) != len(inputs):
            raise type_error(
                f"{fn_label}() takes {len(inputs)} tensor argument(s) "
                f"({', '.join(f'{a.path}: {a.type_text()}' for a in inputs)}); got {len(flat)}"
            )
        symbols: dict[str, tuple[int, str]] = {}
        for leaf, value in zip(inputs, flat):
            self.check_leaf(fn_label, leaf, value, symbols)

    def check_leaf(
        self, fn_label: str, leaf: Leaf, value: Any, symbols: dict[str, tuple[int, str]]
    ) -> Any:
        """Checks one leaf's value; returns it (numpy arrays as tensors)."""
        import torch

        where = f"{fn_label}(): argument {leaf.path}"
        if leaf.kind == "constant":
            if not _same_constant(value, leaf.value):
                raise value_error(
                    f"{where} was specialized to {_py(leaf.value)} at export; got "
                    f"{_describe(value)}. Export again with that value, or make it a tensor to "
                    "vary it"
                )
            return value
        if leaf.kind == "scalar":
            if isinstance(value, torch.Tensor) or not isinstance(value, (bool, int, float)):
                raise type_error(
                    f"{where} expects a Python number ({leaf.dtype}); got {_describe(value)}"
                )
            return value
        if type(value).__module__ == "numpy" and hasattr(value, "dtype"):
            value = torch.from_numpy(value)
        if not isinstance(value, torch.Tensor):
            raise type_error(f"{where} expects a tensor {leaf.type_text()}; got {_describe(value)}")
        check_tensor(where, leaf, value, self.dims, symbols)
        return value


def check_tensor(
    where: str,
    leaf: Leaf,
    value: Any,
    dims: Mapping[str, tuple[int, int | None]],
    symbols: dict[str, tuple[int, str]],
) -> None:
    """dtype, rank, static dims, dynamic dims (range, equal symbols, simple expressions)."""
    want = element_type_name(leaf.dtype) if leaf.dtype else None
    shape = tuple(value.shape)
    given = f"{str(value.dtype).removeprefix('torch.')} tensor of shape {list(shape)}"
    if want is not None and value.dtype != want:
        want_name = str(want).removeprefix("torch.")
        raise value_error(
            f"{where} expects dtype {want_name} ({leaf.type_text()}); got a {given}. "
            f"Convert it with .to(torch.{want_name})"
        )
    if len(shape) != len(leaf.shape):
        raise value_error(
            f"{where} expects rank {len(leaf.shape)} ({leaf.type_text()}); got a {given}"
        )
    for d, (want_d, got) in enumerate(zip(leaf.shape, shape)):
        if want_d is None:
            continue
        if isinstance(want_d, int):
            if got != want_d:
                raise value_error(
                    f"{where} expects dimension {d} to be {want_d} ({leaf.type_text()}); got a "
                    f"{given}. The dimension is static: export it as dynamic (a torch.export.Dim, "
                    "or None in an AbstractTensor) to vary it"
                )
            continue
        sym = str(want_d)
        if sym in dims:
            lo, hi = dims[sym]
            if got < lo or (hi is not None and got > hi):
                rng = f"{lo}..{hi if hi is not None else 'inf'}"
                raise value_error(
                    f"{where} dimension {d} is {got}, outside the range {rng} of that dynamic "
                    f"dimension ({leaf.type_text()}); export with a torch.export.Dim(..., "
                    f"min=..., max=...) covering {got}"
                )
            if sym in symbols and symbols[sym][0] != got:
                first, first_where = symbols[sym]
                raise value_error(
                    f"{where} dimension {d} is {got} but {first_where} is {first}; they are "
                    f"the same dynamic dimension ({sym}) in the exported program and must be "
                    "equal"
                )
            symbols.setdefault(sym, (got, f"{leaf.path} dimension {d}"))
        else:
            expected = _eval_expression(sym, {k: v[0] for k, v in symbols.items()})
            if expected is not None and expected != got:
                raise value_error(
                    f"{where} dimension {d} is {got}; it must be {sym} = {expected} "
                    f"({leaf.type_text()})"
                )


def _eval_expression(expr: str, values: Mapping[str, int]) -> int | None:
    """Evaluates a shape expression such as ``2*s0 + 1`` once its symbols are known (integer
    ``+ - * // %`` only; anything else, or an unknown symbol, gives None: not checked)."""
    import ast
    import operator

    ops = {
        ast.Add: operator.add,
        ast.Sub: operator.sub,
        ast.Mult: operator.mul,
        ast.FloorDiv: operator.floordiv,
        ast.Mod: operator.mod,
    }

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            return values[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            return ops[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise ValueError(expr)

    try:
        return ev(ast.parse(expr, mode="eval").body)
    except (ValueError, KeyError, SyntaxError, ZeroDivisionError):
        return None


def _same_constant(value: Any, recorded: Any) -> bool:
    try:
        return json.loads(json.dumps(value)) == recorded
    except (TypeError, ValueError):
        return False


def _py(value: Any) -> str:
    """A recorded JSON value as Python writes it (``None``, ``True``, ``3``, ``'a'``)."""
    return repr(value)


def _describe(value: Any) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {list(value.shape)}"
    if value is None or isinstance(value, (bool, int, float, str)):
        return f"{type(value).__name__} {value!r}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    if isinstance(value, Mapping):
        return f"a {type(value).__name__} with keys {', '.join(map(repr, value))}"
    return f"a {type(value).__module__}.{type(value).__qualname__}"


_LEAF_KINDS = ("tensor", "scalar", "constant")


def _check_leaf_record(where: str, leaf: Leaf) -> None:
    if leaf.kind not in _LEAF_KINDS:
        raise ValueError(f"{where}.kind is {leaf.kind!r}, not one of {', '.join(_LEAF_KINDS)}")
    if leaf.kind == "constant":
        if leaf.index is not None:
            raise ValueError(f"{where}: a constant has no flat index")
    elif type(leaf.index) is not int or leaf.index < 0:
        raise TypeError(f"{where}.index is {leaf.index!r}, not a flat index")
    for field_name in ("dtype", "device"):
        value = getattr(leaf, field_name)
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{where}.{field_name} is {type(value).__name__}, not a string")
    if leaf.kind == "tensor" and leaf.dtype is None:
        raise ValueError(f"{where}: a tensor without dtype")
    for d, dim in enumerate(leaf.shape):
        if dim is not None and not isinstance(dim, str) and (type(dim) is not int or dim < 0):
            raise TypeError(f"{where}.shape[{d}] is {dim!r}, not a size or a symbol")


def _newer_pytree_protocol(text: Any) -> int | None:
    """The protocol of a serialized treespec when it is one torch does not read (a module
    built with a newer torch); None otherwise (also for damaged text: the reader says so)."""
    import torch.utils._pytree as pytree

    supported = getattr(pytree, "_SUPPORTED_PROTOCOLS", None) or {1: None}
    if not isinstance(text, str):
        return None
    m = re.match(r"\s*\[\s*(\d{1,9})\s*,", text)
    if m is None:
        return None
    protocol = int(m.group(1))
    return protocol if protocol not in supported and protocol > max(supported) else None


# ----------------------------------------------------------------------------- trees
def _load_spec(text: str, *, warn: bool = True) -> Any:
    """``treespec_loads``, with node types unknown here (e.g. a ModelOutput of a library not
    imported) imported when their top-level package is already loaded, else read as dicts."""
    from torch.utils._pytree import treespec_loads

    try:
        return treespec_loads(text)
    except Exception:
        pass
    data = json.loads(text)
    unknown: list[str] = []

    def fix(node: dict[str, Any]) -> None:
        t = node.get("type")
        if t is not None and not _serialized_type_known(t) and not _import_type_module(t):
            unknown.append(t)
            node["type"] = "builtins.dict"
        for child in node.get("children_spec", []):
            fix(child)

    fix(data[1])
    if unknown and warn:
        logger.warning(
            "result types %s are not importable here; returning dicts with the same keys "
            "(import their package before calling to get them)",
            ", ".join(sorted(set(unknown))),
        )
    return treespec_loads(json.dumps(data))


def _serialized_type_known(name: str) -> bool:
    from torch.utils._pytree import SERIALIZED_TYPE_TO_PYTHON_TYPE

    return name in SERIALIZED_TYPE_TO_PYTHON_TYPE


def _import_type_module(name: str) -> bool:
    module = name.rpartition(".")[0]
    if not module or module.split(".")[0] not in sys.modules:
        return False  # never import a package the process has not loaded itself
    try:
        importlib.import_module(module)
    except Exception:
        return False
    return _serialized_type_known(name)


def _children(spec: Any) -> list[Any]:
    return list(spec.children()) if hasattr(spec, "children") else list(spec.children_specs)


def _flatten_like(fn_label: str, value: Any, spec: Any, path: str, out: list[Any]) -> None:
    """Flattens ``value`` along the recorded ``spec``; errors name the path."""
    import torch.utils._pytree as pytree

    if spec.is_leaf():
        out.append((path, value))
        return
    t = spec.type
    children = _children(spec)
    where = f"{fn_label}(): argument {path}"
    if t is type(None):
        if value is not None:
            raise type_error(f"{where} was None at export; got {_describe(value)}")
        return
    if t in (tuple, list):
        if not isinstance(value, (tuple, list)) or len(value) != len(children):
            raise type_error(
                f"{where} expects a {t.__name__} of {len(children)}; got {_describe(value)}"
            )
        for i, (v, c) in enumerate(zip(value, children)):
            _flatten_like(fn_label, v, c, f"{path}[{i}]", out)
        return
    if isinstance(t, type) and issubclass(t, dict):
        keys = list(spec.context)
        if not isinstance(value, Mapping):
            raise type_error(
                f"{where} expects a dict with keys {', '.join(map(repr, keys))}; got "
                f"{_describe(value)}"
            )
        missing = [k for k in keys if k not in value]
        extra = [k for k in value if k not in keys]
        if missing or extra:
            parts = []
            if missing:
                parts.append(f"missing {', '.join(map(repr, missing))}")
            if extra:
                parts.append(f"unexpected {', '.join(map(repr, extra))}")
            raise type_error(
                f"{where} expects a dict with keys {', '.join(map(repr, keys))}; got one "
                f"{' and '.join(parts)}"
            )
        for k, c in zip(keys, children):
            _flatten_like(fn_label, value[k], c, f"{path}[{k!r}]", out)
        return
    # namedtuples and registered types: flatten with pytree, compare the node.
    node = pytree.SUPPORTED_NODES.get(type(value))
    if type(value) is not t or node is None:
        raise type_error(
            f"{where} expects a {getattr(t, '__qualname__', t)}; got {_describe(value)}"
        )
    vals, context = node.flatten_fn(value)
    if context != spec.context or len(vals) != len(children):
        raise type_error(f"{where}: its structure differs from the exported one")
    for i, (v, c) in enumerate(zip(vals, children)):
        _flatten_like(fn_label, v, c, f"{path}[{i}]", out)


def rebuild_results(sig: CallSignature, flat: Sequence[Any]) -> Any:
    """The recorded result structure from the compiled function's flat results (constants put
    back where they were)."""
    from torch.utils._pytree import tree_unflatten

    assert sig.return_schema is not None
    leaves: list[Any] = []
    for leaf in sig.results:
        if leaf.index is None:
            leaves.append(leaf.value)
        elif leaf.index < len(flat):
            leaves.append(flat[leaf.index])
        else:
            raise TurbineRuntimeError(
                f"the function returned {len(flat)} result(s) but its recorded signature has "
                f"result {leaf.path} at index {leaf.index}; the module's records are "
                "inconsistent: export it again"
            )
    return tree_unflatten(leaves, _load_spec(sig.return_schema))


# ----------------------------------------------------------------------------- recording
def _leaf_paths(spec: Any) -> list[tuple[Any, ...]]:
    from torch.utils._pytree import tree_flatten_with_path, tree_unflatten

    dummy = tree_unflatten([0] * spec.num_leaves, spec)
    return [p for p, _ in tree_flatten_with_path(dummy)[0]]


def _key_text(key: Any) -> str:
    from torch.utils._pytree import keystr

    return keystr((key,))


def _arg_label(path: tuple[Any, ...], pos_names: Sequence[str]) -> str:
    """``(SequenceKey(0), SequenceKey(1), MappingKey('a'))`` -> ``y['a']``."""
    first, second, *rest = path
    if getattr(first, "idx", None) == 0:
        i = second.idx
        name = pos_names[i] if i < len(pos_names) else f"arg{i}"
    else:
        name = str(getattr(second, "key", second))
    return name + "".join(_key_text(k) for k in rest)


def _result_label(path: tuple[Any, ...]) -> str:
    return "".join(_key_text(k) for k in path) or "result"


def _dim_text(d: Any) -> Dim:
    if isinstance(d, int):
        return d
    expr = d.node.expr if hasattr(d, "node") else d
    if getattr(expr, "is_number", False):
        return int(expr)  # a SymInt specialized to a constant
    return str(expr)


def _jsonable(value: Any) -> Any:
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return repr(value)


def signature_of_program(
    program: Any,
    flat_inputs: Sequence[Any],
    flat_outputs: Sequence[Any],
    constant_results: Mapping[int, Any],
    defaults: Mapping[str, Any] | None = None,
) -> CallSignature | None:
    """The call signature of an ``ExportedProgram`` imported as a function whose flat
    arguments/results are ``flat_inputs``/``flat_outputs`` (``TensorSpec``s); None when they do
    not line up with the program's user inputs/outputs (nothing is recorded then)."""
    from torch.export.graph_signature import (
        ConstantArgument,
        InputKind,
        OutputKind,
        SymIntArgument,
        TensorArgument,
    )
    from torch.utils._pytree import treespec_dumps

    call_sig = program.module_call_graph[0].signature if program.module_call_graph else None
    in_spec = call_sig.in_spec if call_sig is not None else program.call_spec.in_spec
    out_spec = call_sig.out_spec if call_sig is not None else program.call_spec.out_spec
    if in_spec is None:
        return None
    names = list(getattr(call_sig, "forward_arg_names", None) or [])
    pos_spec = _children(in_spec)[0]
    pos_names = names[: pos_spec.num_children]
    nodes = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    user_inputs = [s for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    paths = _leaf_paths(in_spec)
    if len(paths) != len(user_inputs):
        return None
    args: list[Leaf] = []
    index = 0
    symbols: set[str] = set()
    for path, spec in zip(paths, user_inputs):
        label = _arg_label(path, pos_names)
        arg = spec.arg
        if isinstance(arg, ConstantArgument):
            args.append(Leaf(label, "constant", value=_jsonable(arg.value)))
            continue
        if index >= len(flat_inputs):
            return None
        flat = flat_inputs[index]
        if isinstance(arg, TensorArgument):
            val = nodes[arg.name].meta.get("val") if arg.name in nodes else None
            if val is None or not hasattr(val, "shape"):
                shape: tuple[Dim, ...] = tuple(flat.shape)
            else:
                shape = tuple(_dim_text(d) for d in val.shape)
            if len(shape) != len(flat.shape):
                return None
            for d in shape:
                if isinstance(d, str):
                    symbols.add(d)
            args.append(Leaf(label, "tensor", index, flat.dtype, shape, device=flat.device))
        elif isinstance(arg, SymIntArgument):
            args.append(Leaf(label, "scalar", index, flat.dtype, device=flat.device))
        else:
            return None  # tokens, custom objects: not callable from Python here
        index += 1
    if index != len(flat_inputs):
        return None
    dims: dict[str, tuple[int, int | None]] = {}
    for sym, vr in program.range_constraints.items():
        name = str(sym)
        if name not in symbols:
            continue
        lo = int(vr.lower) if vr.lower.is_finite else 0
        hi = int(vr.upper) if vr.upper.is_finite else None
        dims[name] = (max(lo, 0), hi)

    results: list[Leaf] = []
    return_schema: str | None = None
    if out_spec is not None:
        out_paths = _leaf_paths(out_spec)
        user_outputs = [
            s for s in program.graph_signature.output_specs if s.kind == OutputKind.USER_OUTPUT
        ]
        ok = len(out_paths) == len(user_outputs)
        r_index = 0
        for i, (path, spec) in enumerate(zip(out_paths, user_outputs) if ok else ()):
            label = _result_label(path)
            if i in constant_results or isinstance(spec.arg, ConstantArgument):
                value = constant_results.get(i, getattr(spec.arg, "value", None))
                results.append(Leaf(label, "constant", value=_jsonable(value)))
                continue
            if r_index >= len(flat_outputs):
                ok = False
                break
            flat = flat_outputs[r_index]
            kind = "tensor" if flat.is_tensor else "scalar"
            results.append(Leaf(label, kind, r_index, flat.dtype, tuple(flat.shape)))
            r_index += 1
        if ok and r_index == len(flat_outputs):
            try:
                return_schema = treespec_dumps(out_spec)
            except Exception as e:  # a custom node without a serialized name
                logger.info("result tree of the program is not serializable (%s)", e)
        else:
            results = []
    try:
        args_schema = treespec_dumps(in_spec)
    except Exception as e:
        logger.info("argument tree of the program is not serializable (%s)", e)
        return None
    return CallSignature(
        args_schema=args_schema,
        return_schema=return_schema,
        arg_names=tuple(names),
        args=tuple(args),
        results=tuple(results),
        dims=dims,
        defaults=dict(defaults or {}),
    )


def signature_of_procedure(
    args_schema: str,
    return_schema: str | None,
    flat_inputs: Sequence[Any],
    flat_outputs: Sequence[Any],
    arg_names: Sequence[str] = (),
) -> CallSignature | None:
    """The call signature of a procedural ``CompiledModule`` function from its
    ``torch.args_schema`` / ``torch.return_schema`` attributes (every leaf is one argument)."""
    spec = _load_spec(args_schema)
    paths = _leaf_paths(spec)
    if len(paths) != len(flat_inputs):
        return None
    pos_names = list(arg_names)[: _children(spec)[0].num_children]
    args = []
    for i, (path, flat) in enumerate(zip(paths, flat_inputs)):
        kind = "tensor" if flat.is_tensor else "scalar"
        args.append(
            Leaf(
                _arg_label(path, pos_names),
                kind,
                i,
                flat.dtype,
                tuple(flat.shape),
                device=flat.device,
            )
        )
    results: list[Leaf] = []
    if return_schema is not None:
        out_paths = _leaf_paths(_load_spec(return_schema))
        if len(out_paths) == len(flat_outputs):
            results = [
                Leaf(
                    _result_label(p),
                    "tensor" if f.is_tensor else "scalar",
                    i,
                    f.dtype,
                    tuple(f.shape),
                )
                for i, (p, f) in enumerate(zip(out_paths, flat_outputs))
            ]
        else:
            return_schema = None
    kw_names = [str(k) for k in (_children(spec)[1].context or [])]
    names = list(arg_names)[: len(pos_names)]
    if len(names) < len(pos_names):
        names = [f"arg{i}" for i in range(len(pos_names))]
    return CallSignature(
        args_schema=args_schema,
        return_schema=return_schema,
        arg_names=tuple(names + kw_names),
        args=tuple(args),
        results=tuple(results),
    )


def record_module_signatures(
    module_op: Any,
    programs: Mapping[str, Any] | None = None,
    *,
    arg_names: Mapping[str, Sequence[str]] | None = None,
    defaults: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, CallSignature]:
    """Records the call signatures of a module's public functions in their ``iree.reflection``.

    Args:
        module_op: the MLIR module (``Operation``).
        programs: function name -> the ``ExportedProgram`` it was imported from.
        arg_names: function name -> argument names, for procedural functions.
        defaults: function name -> parameters not passed at export -> their default.

    Returns:
        The recorded signatures by function name (functions without records are left as they
        are: programs whose trees torch cannot serialize, functions without schemas).
    """
    from turbine_ir import ir

    flat = signatures_from_mlir(module_op)
    recorded: dict[str, CallSignature] = {}
    for f in public_functions(module_op, kinds=("func.func",)):
        attrs = f.attributes
        name = str(attrs["sym_name"]).strip('"')
        fsig = flat.get(name)
        if fsig is None:
            continue
        sig: CallSignature | None = None
        program = (programs or {}).get(name)
        if program is not None:
            constants: dict[int, Any] = {}
            if _CONSTANT_RESULTS_ATTR in attrs:
                raw = json.loads(ir.StringAttr(attrs[_CONSTANT_RESULTS_ATTR]).value)
                constants = {int(k): v for k, v in raw.items()}
            sig = signature_of_program(
                program, fsig.inputs, fsig.outputs, constants, (defaults or {}).get(name)
            )
        elif ARGS_SCHEMA in attrs:
            ret = ir.StringAttr(attrs[RETURN_SCHEMA]).value if RETURN_SCHEMA in attrs else None
            sig = signature_of_procedure(
                ir.StringAttr(attrs[ARGS_SCHEMA]).value,
                ret,
                fsig.inputs,
                fsig.outputs,
                (arg_names or {}).get(name, ()),
            )
        if sig is None:
            continue
        _set_reflection(f, sig.to_reflection())
        recorded[name] = sig
    _record_parameters(module_op)
    return recorded


_PARAMETER_RE = re.compile(r'#flow\.parameter\.named<"((?:[^"\\]|\\.)*)"::"((?:[^"\\]|\\.)*)">')
_ELEMENT_BITS = {"i1": 8, "bf16": 16, "complex<f32>": 64, "complex<f64>": 128}


def _element_bits(dtype: str) -> int | None:
    if dtype in _ELEMENT_BITS:
        return _ELEMENT_BITS[dtype]
    m = re.fullmatch(r"(?:[su]?i|f)(\d+)|f(8)E\w+", dtype)
    if not m:
        return None
    return int(m.group(1) or m.group(2))


def module_parameters(module_op: Any) -> list[dict[str, Any]]:
    """The external parameters a module reads (``#flow.parameter.named`` globals): per global
    its scope, key, type and size in bytes (None when the type has no fixed size)."""
    op = getattr(module_op, "mlir_module", module_op)
    op = getattr(op, "operation", op)
    out: list[dict[str, Any]] = []
    for child in op.regions[0].blocks[0].operations:
        child = getattr(child, "operation", child)
        if child.name != "util.global" or "initial_value" not in child.attributes:
            continue
        m = _PARAMETER_RE.search(str(child.attributes["initial_value"]))
        if not m:
            continue
        spec = _parse_value(str(child.attributes["type"]))
        bits = _element_bits(spec.dtype) if spec.is_tensor else None
        size: int | None = None
        if bits is not None and None not in spec.shape:
            n = 1
            for d in spec.shape:
                n *= d or 0
            size = n * bits // 8
        out.append({"scope": m.group(1), "key": m.group(2), "type": str(spec), "bytes": size})
    return out


def _record_parameters(module_op: Any) -> None:
    """Records :func:`module_parameters` on the module's first public function (a ``.vmfb``
    has no module-level reflection), so that ``turbine-aot inspect`` can list them."""

    params = module_parameters(module_op)
    functions = public_functions(module_op, kinds=("func.func",))
    if not params or not functions:
        return
    _set_reflection(functions[0], {PARAMETERS_KEY: json.dumps(params)})


def _set_reflection(func_op: Any, values: Mapping[str, str]) -> None:
    from turbine_ir import ir

    attrs = func_op.attributes
    with func_op.context:
        entries: dict[str, Any] = {}
        if REFLECTION_ATTR in attrs:
            old = ir.DictAttr(attrs[REFLECTION_ATTR])
            entries = {old[i].name: old[i].attr for i in range(len(old))}
        for k, v in values.items():
            entries[k] = ir.StringAttr.get(v)
        attrs[REFLECTION_ATTR] = ir.DictAttr.get(entries)


@contextlib.contextmanager
def compile_record(module_op: Any, flags: Sequence[str]) -> Iterator[None]:
    """While active, the module's first public function records the compile ``flags`` and the
    compiler version in its ``iree.reflection`` (serialize the module for compiling inside);
    afterwards the function's reflection is restored, so the exported IR (and the compile
    cache keys computed from it) stay as they were."""
    from iree.compiler import version as compiler_version

    functions = public_functions(module_op, kinds=("func.func",))
    if not functions:
        yield
        return
    f = functions[0]
    before = f.attributes[REFLECTION_ATTR] if REFLECTION_ATTR in f.attributes else None  # noqa: SIM401
    record = {"flags": list(flags), "compiler": getattr(compiler_version, "VERSION", None)}
    _set_reflection(f, {COMPILE_KEY: json.dumps(record)})
    try:
        yield
    finally:
        with f.context:
            if before is None:
                del f.attributes[REFLECTION_ATTR]
            else:
                f.attributes[REFLECTION_ATTR] = before


def reflection_of(func_op: Any) -> dict[str, str]:
    """A ``func.func``'s ``iree.reflection`` entries as strings (what the ``.vmfb`` will carry)."""
    from turbine_ir import ir

    attrs = func_op.attributes
    if REFLECTION_ATTR not in attrs:
        return {}
    d = ir.DictAttr(attrs[REFLECTION_ATTR])
    out = {}
    for i in range(len(d)):
        a = d[i].attr
        out[d[i].name] = a.value if isinstance(a, ir.StringAttr) else str(a)
    return out


def eager_defaults(module: Any, program: Any) -> dict[str, Any]:
    """``module.forward``'s parameters with JSON-able defaults that the export of ``program``
    did not pass (a call may pass them at that default)."""
    import inspect

    graph = getattr(program, "module_call_graph", None)
    passed = list(getattr(graph[0].signature, "forward_arg_names", None) or []) if graph else []
    try:
        params = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError, AttributeError):
        return {}
    out = {}
    for p in params:
        if p.name in passed or p.default is inspect.Parameter.empty:
            continue
        if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        if p.default is None or isinstance(p.default, (bool, int, float, str)):
            out[p.name] = p.default
    return out
