r"""The flat IREE ABI of a compiled function: its arguments and results as :class:`TensorSpec`\ s
(:class:`FlatSignature`), read from IREE's ``iree.abi.declaration`` text or from the
function types of an MLIR module, and the device index of an argument's affinity."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from turbine_aot._compiler.text import split_top_level_commas
from turbine_aot._compiler.torch_ir import public_functions

from .call import CallSignature
from .element_types import TORCH_DTYPE_TO_ABI, element_type_name

__all__ = [
    "FlatSignature",
    "FunctionSignature",
    "TensorSpec",
    "affinity_device_index",
    "parse_abi_declaration",
    "parse_value",
    "signatures_from_mlir",
]


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
class FlatSignature:
    """One compiled function's flat IREE ABI: its arguments and results as tensor specs, in the
    order IREE passes them (the eager call's tree, where recorded, is :attr:`call`: a
    :class:`CallSignature`).

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
    def from_json(cls, name: str, d: Mapping[str, Any]) -> FlatSignature:
        call = None
        if isinstance(d.get("call"), Mapping):
            call = CallSignature.from_json(d["call"])
        return cls(
            name,
            tuple(TensorSpec.from_json(x) for x in d["inputs"]),
            tuple(TensorSpec.from_json(x) for x in d["outputs"]),
            call,
        )


_TENSOR_RE = re.compile(r"^tensor<(.*)>$")

# The ABI reader runs where the compiler side must not load (the runtime, the checking child of
# _runtime.module_check, which imports only iree.runtime): turbine_ir.VtensorType, the parser the
# compiler side uses, imports MLIR and torch with its package, so this one pattern reads the same
# spelling here (`?` or `-1` dynamic, bounded static sizes: _DIM_RE).
_VTENSOR_RE = re.compile(r"^!torch\.vtensor<\[([^\]]*)\],\s*(.+)>$")

_AFFINITY_RE = re.compile(
    r"iree\.abi\.affinity\s*=\s*#hal\.device\.(?:promise|affinity)<@([\w.$-]+)"
)


def parse_value(decl: str) -> TensorSpec:
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
            return TensorSpec(dims, TORCH_DTYPE_TO_ABI.get(dtype, dtype), device=device)
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
    parts: list[str] = []
    depth = 0
    cur: list[str] = []
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


#: The name this class had before it was named for what it holds (the flat ABI, beside
#: :class:`CallSignature`, the eager call); kept so that code using it keeps working.
FunctionSignature = FlatSignature


def parse_abi_declaration(name: str, declaration: str) -> FlatSignature:
    """Parses IREE's ``iree.abi.declaration`` reflection string into a signature.

    Args:
        name: the function name.
        declaration: e.g. ``"sync func @main(%input0: tensor<?x4xf32>) -> (%output0: ...)"``.

    Returns:
        The signature; unknown constructs become non-tensor specs holding the type text.
    """
    m = re.search(r"@[\w.$-]+\(", declaration)
    if not m:
        return FlatSignature(name, (), ())
    start, depth = m.end(), 1
    i = start
    while i < len(declaration) and depth:
        depth += {"(": 1, ")": -1}.get(declaration[i], 0)
        i += 1
    ins = tuple(
        parse_value(p) for p in split_top_level_commas(declaration[start : i - 1], strip=True)
    )
    res = declaration[i:].strip().removeprefix("->").strip()
    if res.startswith("(") and res.endswith(")"):
        res = res[1:-1]
    outs = tuple(parse_value(p) for p in split_top_level_commas(res, strip=True)) if res else ()
    return FlatSignature(name, ins, outs)


def signatures_from_mlir(module_op: Any) -> dict[str, FlatSignature]:
    """Signatures of the public functions of an MLIR module (an ``Operation`` or an object with
    ``mlir_module``, e.g. ``ExportOutput``), for modules whose ``.vmfb`` carries no ABI
    reflection (torch-dialect input). Argument affinities come from ``iree.abi.affinity``.
    """
    out: dict[str, FlatSignature] = {}
    for f in public_functions(module_op, kinds=("func.func",)):
        attrs = f.attributes
        name = str(attrs["sym_name"]).strip('"')
        ftype = str(attrs["function_type"])
        arg_attrs = [str(a) for a in attrs["arg_attrs"]] if "arg_attrs" in attrs else []
        m = re.match(r"^\((.*)\)\s*->\s*(.*)$", ftype, re.S)
        if not m:
            continue
        arg_types = split_top_level_commas(m.group(1), strip=True)
        decl_args = [
            f"{t} {arg_attrs[i]}" if i < len(arg_attrs) and arg_attrs[i] != "{}" else t
            for i, t in enumerate(arg_types)
        ]
        res = m.group(2).strip()
        if res.startswith("(") and res.endswith(")"):
            res = res[1:-1]
        out[name] = FlatSignature(
            name,
            tuple(parse_value(a) for a in decl_args),
            tuple(parse_value(r) for r in split_top_level_commas(res, strip=True)) if res else (),
        )
    return out


def affinity_device_index(name: str | None, named: dict[str, int]) -> int:
    """The device index of an ``iree.abi.affinity`` name: ``__device_N`` is N; other names
    take indices in the order they first appear (``named`` remembers them)."""
    if name is None:
        return 0
    m = re.fullmatch(r"__device_(\d+)", name)
    return int(m.group(1)) if m else named.setdefault(name, len(named))
