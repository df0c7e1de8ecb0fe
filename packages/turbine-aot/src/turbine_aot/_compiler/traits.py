"""Program traits read from the IR: what turbine's default flags (and its refusals) depend on
in a program — dynamic dimensions, floating-point and narrow integer element types, narrow
matmuls.

Only the public function signatures, the top-level globals' types and (for
:func:`narrow_matmuls`) the operand types of matmul-like ops are read: the weights in the body
are never printed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .torch_ir import public_functions, top_level_ops, walk

__all__ = [
    "NARROW_MATMUL_ROWS",
    "NO_TRAITS",
    "ProgramTraits",
    "float_types",
    "has_dynamic_shapes",
    "narrow_int_types",
    "narrow_matmuls",
    "program_traits",
    "uses_float16",
    "uses_float64",
]

#: A matmul with at most this many rows is narrow: data tiling is slower there than IREE's plain
#: matmul code generation (the measurement is in :mod:`.flags`).
NARROW_MATMUL_ROWS = 16


@dataclass(frozen=True)
class ProgramTraits:
    """What turbine's default flags depend on in a program (:func:`program_traits`).

    Attributes:
        dynamic_shapes: a public function takes or returns a tensor with a dynamic dimension
            (:func:`has_dynamic_shapes`).
        fp32_only: every floating-point type of the signatures and globals is ``f32``, and
            there is one (:func:`float_types`).
        narrow_matmuls: every matmul has at most :data:`NARROW_MATMUL_ROWS` static rows, there
            is one, and no convolution (:func:`narrow_matmuls`).
        float64: the program has float64 tensors: inputs, outputs, weights or values it
            computes (:func:`uses_float64`).
    """

    dynamic_shapes: bool = False
    fp32_only: bool = False
    narrow_matmuls: bool = False
    float64: bool = False


#: The traits of a program that has none of them (static shapes, not only fp32, wide matmuls).
NO_TRAITS = ProgramTraits()


def has_dynamic_shapes(module: object) -> bool:
    """Whether a module's public functions take or return tensors with dynamic dimensions.

    Args:
        module: an MLIR module (``ExportOutput``, its ``mlir_module``, an ``ir.Module`` or its
            operation). Only the function signatures are read: the weights in the body are
            never printed.

    Returns:
        ``True`` when a public ``func.func`` / ``util.func`` has a ``?`` dimension in an argument
        or result type (``!torch.vtensor<[1,?],si64>``, ``tensor<?x512xf32>``).
    """
    return any(
        "function_type" in f.attributes and "?" in str(f.attributes["function_type"])
        for f in public_functions(module)
    )


def _signature_and_global_types(module: object) -> list[str]:
    """The type strings of the public function signatures and top-level globals."""
    types = [str(f.attributes["function_type"]) for f in public_functions(module)]
    types += [
        str(g.attributes["type"])
        for g in top_level_ops(module)
        if g.name in ("util.global", "ml_program.global") and "type" in g.attributes
    ]
    return types


# An element type on its own (`,f32>`, `(f32)`) or after a shape (`4x64xf16`).
_FLOAT_TYPE = re.compile(r"(?:(?<=x)|(?<![A-Za-z0-9_]))(bf16|f16|f32|f64|f8E\w+)(?![A-Za-z0-9_])")


def float_types(module: object) -> set[str]:
    """The floating-point element types (``"f32"``, ``"f16"``, ``"bf16"``, ...) of a module's
    public function signatures and top-level globals (its inputs, outputs and weights)."""
    found: set[str] = set()
    for t in _signature_and_global_types(module):
        found.update(m.group(1) for m in _FLOAT_TYPE.finditer(t))
    return found


def uses_float64(module: object) -> bool:
    """Whether a module has float64 tensors anywhere: in its signatures or globals, or as the
    result of an operation in a body (``x.double()`` inside a float32 program). Operation
    results are read by type only; constants are never printed."""
    return "f64" in float_types(module) or _read_body(module).float64_results


def _is_f64(type_text: str) -> bool:
    return "f64" in type_text and any(m.group(1) == "f64" for m in _FLOAT_TYPE.finditer(type_text))


_CONV_OPS = frozenset({"torch.aten.convolution", "torch.aten.conv2d"})


# Matmul-like torch ops and the operand whose rows are the matmul's M (addmm/baddbmm: the
# second; scaled_dot_product_attention: the query, whose rows are its sequence length).
_MATMUL_LHS = {
    "torch.aten.mm": 0,
    "torch.aten.bmm": 0,
    "torch.aten.matmul": 0,
    "torch.aten.linear": 0,
    "torch.aten.addmm": 1,
    "torch.aten.baddbmm": 1,
    "torch.aten.scaled_dot_product_attention": 0,
}


def _matmul_rows(op: object) -> int | None:
    """The number of rows (M) of a matmul-like op's product; ``None`` when dynamic or unknown.
    For ``linear`` every leading dimension counts (it is flattened to a 2-D matmul)."""
    index = _MATMUL_LHS[op.name]  # type: ignore[attr-defined]
    operands = op.operands  # type: ignore[attr-defined]
    if len(operands) <= index:
        return None
    from turbine_ir import VtensorType

    t = VtensorType.parse(str(operands[index].type))
    if t is None or not t.sizes or not t.has_static_shape:
        return None
    sizes = [int(d) for d in t.sizes if d is not None]
    if len(sizes) == 1:
        return 1  # a vector times a matrix
    if op.name == "torch.aten.linear":  # type: ignore[attr-defined]
        rows = 1
        for d in sizes[:-1]:
            rows *= d
        return rows
    return sizes[-2]


@dataclass(frozen=True)
class _BodyFacts:
    """What one walk over a module's operations finds (:func:`_read_body`)."""

    narrow_matmuls: bool = False
    float64_results: bool = False


def _read_body(module: object) -> _BodyFacts:
    """One walk over every operation of a module: whether its matmuls are narrow (see
    :func:`narrow_matmuls`) and whether an operation yields a float64 value. Read by type only:
    constants are never printed. Not a module: no facts."""
    op = getattr(module, "mlir_module", module)
    op = getattr(op, "operation", op)
    narrow: bool | None = None  # None: no matmul seen yet; False: a wide one or a convolution
    float64 = False
    try:
        for o in walk(op):
            if narrow is not False:
                if o.name in _CONV_OPS:
                    narrow = False
                elif o.name in _MATMUL_LHS:
                    rows = _matmul_rows(o)
                    narrow = rows is not None and rows <= NARROW_MATMUL_ROWS
            if not float64:
                float64 = any(_is_f64(str(r.type)) for r in o.results)
    except Exception:  # not a module
        return _BodyFacts()
    return _BodyFacts(narrow_matmuls=bool(narrow), float64_results=float64)


def narrow_matmuls(module: object) -> bool:
    """Whether every matmul of a module has at most :data:`NARROW_MATMUL_ROWS` static rows, there
    is at least one, and there is no convolution (torch dialect; read from operand types)."""
    return _read_body(module).narrow_matmuls


def program_traits(module: object) -> ProgramTraits:
    """What turbine's defaults depend on in a program (an ``ExportOutput``, an ``ir.Module`` or
    its operation): its :class:`ProgramTraits`. The module's operations are walked once."""
    floats = float_types(module)
    body = _read_body(module)
    return ProgramTraits(
        dynamic_shapes=has_dynamic_shapes(module),
        fp32_only=floats == {"f32"},
        narrow_matmuls=body.narrow_matmuls,
        float64="f64" in floats or body.float64_results,
    )


# An 8- or 4-bit integer element type, signless (globals: `xi8>`) or signed (`,si8>`, `ui8`).
_NARROW_INT_TYPE = re.compile(r"(?:(?<=x)|(?<![A-Za-z0-9_]))([su]?i(?:8|4))(?![A-Za-z0-9_])")


def narrow_int_types(module: object) -> set[str]:
    """The 8- and 4-bit integer element types (``"i8"``, ``"si8"``, ``"i4"``, ...) a module
    reads: of its public functions' arguments and its top-level globals (quantized weights are
    ``i8`` / ``i4`` globals). Results do not count."""
    types = []
    for f in public_functions(module):
        ftype = f.attributes["function_type"]
        inputs = getattr(getattr(ftype, "value", ftype), "inputs", None)
        if inputs is None:  # not a FunctionType attribute: the whole signature
            types.append(str(ftype))
        else:
            types += [str(t) for t in inputs]
    types += [
        str(g.attributes["type"])
        for g in top_level_ops(module)
        if g.name in ("util.global", "ml_program.global") and "type" in g.attributes
    ]
    found: set[str] = set()
    for t in types:
        found.update(m.group(1) for m in _NARROW_INT_TYPE.finditer(t))
    return found


def uses_float16(module: object) -> bool:
    """Whether a module holds fp16 tensors (``f16``; ``bf16`` does not count): in its public
    function signatures or top-level globals, or as a value inside a function (``x.half()``
    of an fp32 input: a program that computes in fp16 between fp32 boundaries)."""
    if "f16" in float_types(module):
        return True
    op = getattr(module, "mlir_module", module)
    for inner in walk(getattr(op, "operation", op)):
        for r in inner.results:
            if "f16" in (m.group(1) for m in _FLOAT_TYPE.finditer(str(r.type))):
                return True
    return False
