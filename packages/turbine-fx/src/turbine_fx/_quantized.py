"""Quantized weights (torchao tensor subclasses) imported as globals of their inner tensors.

``torchao.quantization.quantize_`` swaps a weight for a tensor subclass (``Int8Tensor``,
``IntxUnpackedToInt8Tensor``, ...) wrapping plain tensors: integer data, scales, zero points.
``torch.export`` keeps such a parameter as one placeholder whose inner tensors the graph reads
with ``export.access_subclass_inner_tensor``, and torchao's quantization ops
(``torchao.dequantize_affine``, ``quantize_affine``, ``choose_qparams_affine``) as custom ops.
Before import (``_program_prep``):

* :func:`flatten_subclass_state` replaces each such placeholder by one placeholder per inner
  tensor it reads, a parameter (buffer, constant) named ``<name>.<attribute>``
  (``layers.0.mlp.weight.qdata``) as ``turbine_params`` names archive entries, externalized
  (``ExternalTensorTrait`` ``<external name>.<attribute>``) and placed (``DeviceTensorTrait``)
  as the subclass tensor was;
* :func:`quantized_op_decompositions` decomposes torchao's ops into ATen (torchao's own Python
  implementations);
* :func:`check_quantized_tensor` refuses the torchao layouts only a kernel library runs
  (``Int4WeightOnlyConfig``'s GPU packings, ...), naming the config that works instead.

torchao's int4 data (int8 values in [-8, 7]) becomes an external global of IREE's ``i4`` type
(:func:`storage_dtype`, the archive holds it packed) loaded and sign-extended to the int8 the
graph reads (:func:`widen_loaded`); inline int4 weights stay int8 (IREE 3.13 cannot embed i4
constants: "unhandled integer element bit width 4").

torchao is never imported here: subclasses are recognised by torch's protocol
(``__tensor_flatten__``), torchao's ops by their namespace.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.fx as fx
from torch.export import ExportedProgram
from torch.export.graph_signature import (
    ExportGraphSignature,
    InputKind,
    InputSpec,
    TensorArgument,
)

from turbine_ir.ir import IntegerType, Operation, RankedTensorType, Value
from turbine_params import (
    DeviceTensorTrait,
    ExternalTensorTrait,
    int4_values,
    is_wrapper_subclass,
    mark_int4,
    subclass_inner_tensors,
)

from ._errors import FxImportError, UnsupportedQuantizationError

__all__ = [
    "UNSUPPORTED_TORCHAO_TENSORS",
    "check_quantized_module",
    "check_quantized_tensor",
    "flatten_subclass_state",
    "has_subclass_state",
    "quantized_op_decompositions",
    "storage_dtype",
    "widen_loaded",
]

#: Namespaces of quantization ops decomposed into ATen before import.
QUANTIZATION_OP_NAMESPACES = ("torchao",)

_STATE_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)
# Per inner tensor, the nn.Parameter wrapping it (an ExportedProgram's parameters must be
# Parameters): one object per tensor, so every program importing it shares one global.
_PARAMETER_ATTR = "_turbine_inner_parameter"


def _access_op() -> Any:
    export_ops = getattr(torch.ops, "export", None)
    return getattr(getattr(export_ops, "access_subclass_inner_tensor", None), "default", None)


_INT4_INSTEAD = "IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32))"
#: torchao tensor classes whose layouts only a kernel library runs (GPU int4 packings,
#: torchao's own CPU kernels, 2:4 sparse cutlass): the config that makes them, what works.
UNSUPPORTED_TORCHAO_TENSORS: dict[str, tuple[str, str]] = {
    "Int4Tensor": ("Int4WeightOnlyConfig (fbgemm/mslk int4 kernels)", _INT4_INSTEAD),
    "Int4PreshuffledTensor": (
        "Int4WeightOnlyConfig(int4_packing_format='preshuffled') or "
        "Float8DynamicActivationInt4WeightConfig (fbgemm kernels)",
        _INT4_INSTEAD,
    ),
    "Int4TilePackedTo4dTensor": (
        "Int4WeightOnlyConfig(int4_packing_format='tile_packed_to_4d') (tinygemm, CUDA)",
        _INT4_INSTEAD,
    ),
    "Int4PlainInt32Tensor": (
        "Int4WeightOnlyConfig(int4_packing_format='plain_int32') (XPU/NPU kernels)",
        _INT4_INSTEAD,
    ),
    "IntxOpaqueTensor": (
        "IntxWeightOnlyConfig / Int8DynamicActivationIntxWeightConfig with "
        "intx_packing_format='opaque_*' (torchao's and KleidiAI's CPU kernels)",
        "the same config with the default intx_packing_format='unpacked_to_int8'",
    ),
    "Float8Sparse2x4_1DData1DMetadataTensor": (
        "Float8DynamicActivationFloat8SemiSparseWeightConfig (2:4 sparse, cutlass)",
        "Float8WeightOnlyConfig()",
    ),
    "Float8Sparse2x4_2DData2DMetadataTensor": (
        "Float8DynamicActivationFloat8SemiSparseWeightConfig (2:4 sparse, cutlass)",
        "Float8WeightOnlyConfig()",
    ),
}


def check_quantized_tensor(name: str, value: Any) -> None:
    """Refuses a torchao tensor IREE 3.13 cannot run, naming its config and what works.

    Raises:
        UnsupportedQuantizationError: ``value`` is one of :data:`UNSUPPORTED_TORCHAO_TENSORS`,
            or a ``Float8Tensor`` with dynamic float8 activations (``torch._scaled_mm``).
    """
    cls = type(value)
    if not cls.__module__.startswith("torchao"):
        return
    known = UNSUPPORTED_TORCHAO_TENSORS.get(cls.__name__)
    dynamic_float8 = getattr(value, "act_quant_kwargs", None) is not None
    if known is None and cls.__name__ == "Float8Tensor" and dynamic_float8:
        known = (
            "Float8DynamicActivationFloat8WeightConfig (torch._scaled_mm, CUDA)",
            "Float8WeightOnlyConfig() or Int8DynamicActivationInt8WeightConfig()",
        )
    if known is None:
        return
    config, instead = known
    raise UnsupportedQuantizationError(
        f"'{name}' is a torchao {cls.__name__}, made by {config}: its layout is for that "
        f"kernel library, which IREE 3.13 has no equivalent of. Quantize with {instead} "
        "instead (docs/quantization.md lists what runs).",
        name=name,
        tensor_class=cls.__name__,
    )


def check_quantized_module(module: torch.nn.Module) -> None:
    """:func:`check_quantized_tensor` for every parameter and buffer of ``module``.

    Run before ``torch.export``, which can fail on such tensors first with a kernel error.
    """
    for name, value in module.state_dict(keep_vars=True).items():
        if is_wrapper_subclass(value):
            check_quantized_tensor(name, value)


def _state_value(program: ExportedProgram, spec: InputSpec) -> Any:
    if spec.kind == InputKind.PARAMETER:
        return program.state_dict.get(spec.target)
    if spec.kind == InputKind.BUFFER and spec.persistent:
        return program.state_dict.get(spec.target)
    return program.constants.get(spec.target)


def _subclass_specs(program: ExportedProgram) -> list[InputSpec]:
    return [
        s
        for s in program.graph_signature.input_specs
        if s.kind in _STATE_KINDS
        and isinstance(s.arg, TensorArgument)
        and s.target is not None
        and is_wrapper_subclass(_state_value(program, s))
    ]


def has_subclass_state(program: ExportedProgram) -> bool:
    """Whether a parameter, buffer or constant of ``program`` is a tensor subclass."""
    return bool(_subclass_specs(program))


def _describe(value: Any) -> str:
    cls = type(value)
    return f"{cls.__module__.split('.')[0]} {cls.__name__}"


def flatten_subclass_state(program: ExportedProgram, graph_module: fx.GraphModule) -> Any:
    """``program`` with each tensor-subclass state tensor replaced by its inner tensors.

    Args:
        program: the exported program (not modified).
        graph_module: a private copy of ``program.graph_module`` to rewrite.

    Returns:
        A new ``ExportedProgram`` over ``graph_module``.

    Raises:
        FxImportError: a subclass tensor is used other than through its inner tensors (an op
            computing on the subclass itself), or written by the program.
    """
    access = _access_op()
    sig = program.graph_signature
    graph = graph_module.graph
    placeholders = {n.name: n for n in graph.nodes if n.op == "placeholder"}
    mutated = set(sig.buffers_to_mutate.values())
    state = dict(program.state_dict)
    constants = dict(program.constants)
    subclass = {id(s) for s in _subclass_specs(program)}
    specs: list[InputSpec] = []
    for spec in sig.input_specs:
        if id(spec) not in subclass:
            specs.append(spec)
            continue
        assert isinstance(spec.arg, TensorArgument) and spec.target is not None
        value = _state_value(program, spec)
        if spec.target in mutated:
            raise FxImportError(
                f"the program writes '{spec.target}', a {_describe(value)}: a quantized "
                "tensor can only be read (quantize weights, not state the model updates)"
            )
        check_quantized_tensor(spec.target, value)
        node = placeholders[spec.arg.name]
        leaves = dict(subclass_inner_tensors(spec.target, value))
        new_nodes: list[tuple[fx.Node, str]] = []
        _replace_accesses(node, node, spec.target, value, access, leaves, new_nodes)
        graph.erase_node(node)
        in_state = spec.kind == InputKind.PARAMETER or (
            spec.kind == InputKind.BUFFER and bool(spec.persistent)
        )
        for new_node, name in new_nodes:
            inner = _inner_state(spec, value, name, leaves[name])
            (state if in_state else constants)[name] = inner
            specs.append(
                InputSpec(
                    kind=spec.kind,
                    arg=TensorArgument(name=new_node.name),
                    target=name,
                    persistent=spec.persistent,
                )
            )
        state.pop(spec.target, None)
        constants.pop(spec.target, None)
    graph.lint()
    graph_module.recompile()
    return ExportedProgram(
        root=graph_module,
        graph=graph,
        graph_signature=ExportGraphSignature(input_specs=specs, output_specs=sig.output_specs),
        state_dict=state,
        range_constraints=program.range_constraints,
        module_call_graph=program.module_call_graph,
        example_inputs=program.example_inputs,
        constants=constants,
        verifiers=program.verifiers,
    )


def _replace_accesses(
    anchor: fx.Node,
    node: fx.Node,
    name: str,
    value: Any,
    access: Any,
    leaves: dict[str, Any],
    new_nodes: list[tuple[fx.Node, str]],
) -> None:
    """Replaces ``access_subclass_inner_tensor(node, attr)`` users by new placeholders.

    They go where the subclass's placeholder (``anchor``) is: an ExportedProgram's signature
    lists its inputs in placeholder order.
    """
    for user in list(node.users):
        if access is None or user.target is not access:
            where = user.meta.get("stack_trace", "").strip().splitlines()
            raise FxImportError(
                f"'{name}' is a {_describe(value)} and the program calls {user.target} on it "
                "directly (FX node "
                f"'{user.name}'{': ' + where[-1].strip() if where else ''}); turbine imports a "
                "tensor subclass only through its inner tensors (integer data, scales), which "
                "torch.export reads with export.access_subclass_inner_tensor. Replace the "
                "tensor by a plain one (torchao: tensor.dequantize()) or leave this module "
                "unquantized (quantize_(..., filter_fn=...))."
            )
        attr = user.args[1]
        inner_name = f"{name}.{attr}"
        inner = getattr(value, str(attr))
        if is_wrapper_subclass(inner):
            _replace_accesses(anchor, user, inner_name, inner, access, leaves, new_nodes)
            node.graph.erase_node(user)
            continue
        if inner_name not in leaves:
            raise FxImportError(
                f"'{name}' ({_describe(value)}) reads inner tensor '{attr}', which its "
                "__tensor_flatten__ does not list"
            )
        placeholder = next((n for n, known in new_nodes if known == inner_name), None)
        if placeholder is None:  # one placeholder per inner tensor, however often it is read
            with node.graph.inserting_before(anchor):
                placeholder = node.graph.placeholder(_node_name(inner_name))
            placeholder.meta = dict(user.meta)
            new_nodes.append((placeholder, inner_name))
        user.replace_all_uses_with(placeholder)
        node.graph.erase_node(user)


def _node_name(name: str) -> str:
    return "p_" + "".join(c if c.isalnum() else "_" for c in name)


def _inner_state(spec: InputSpec, outer: Any, name: str, inner: Any) -> Any:
    """The inner tensor as state: a Parameter for parameters, with the outer tensor's traits."""
    external = ExternalTensorTrait.get(outer)
    device = DeviceTensorTrait.get(outer)
    if spec.kind == InputKind.PARAMETER and not isinstance(inner, torch.nn.Parameter):
        wrapped = getattr(inner, _PARAMETER_ATTR, None)
        stale = wrapped is not None and (
            (external is None and ExternalTensorTrait.get(wrapped) is not None)
            or (device is None and DeviceTensorTrait.get(wrapped) is not None)
        )
        if wrapped is None or stale:  # (a trait the subclass tensor no longer has: a new one)
            wrapped = torch.nn.Parameter(inner, requires_grad=False)
            if int4_values(inner):
                mark_int4(wrapped)
            setattr(inner, _PARAMETER_ATTR, wrapped)
        inner = wrapped
    if external is not None:
        suffix = name[len(str(spec.target)) :]
        ExternalTensorTrait(external.external_scope, external.external_name + suffix).set(inner)
    if device is not None:
        DeviceTensorTrait(device.ordinal, device.queues).set(inner)
    return inner


def quantized_op_decompositions(program: ExportedProgram) -> dict[Any, Any]:
    """Decompositions of the torchao ops in ``program``, into ATen.

    torchao registers each op's Python implementation as its decomposition (in inductor's
    table, which torchao imports); that function is used. (``OpOverload.decompose`` would
    re-enter the op when a program is functionalized: infinite recursion.)
    """
    inductor = sys.modules.get("torch._inductor.decomposition")
    registered = getattr(inductor, "decompositions", {}) if inductor is not None else {}
    table: dict[Any, Any] = {}
    for node in program.graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            continue
        if target.namespace not in QUANTIZATION_OP_NAMESPACES or target in table:
            continue
        if target in registered:
            table[target] = registered[target]
    return table


def storage_dtype(tensor: Any) -> torch.dtype | None:
    """``torch.int4`` for external torchao int4 data (an ``i4`` global), else ``None``."""
    if int4_values(tensor) and ExternalTensorTrait.get(tensor) is not None:
        return getattr(torch, "int4")  # noqa: B009  (a shell dtype torch's stubs omit)
    return None


def widen_loaded(loaded: Value, global_type: Any) -> Value:
    """``arith.extsi`` of a loaded ``i4`` global to the int8 tensor the graph reads."""
    try:
        rtt = RankedTensorType(global_type)
    except ValueError:  # not a ranked tensor: nothing to widen
        return loaded
    if str(rtt.element_type) != "i4":
        return loaded
    wide = RankedTensorType.get(rtt.shape, IntegerType.get_signless(8, rtt.context))
    return Operation.create("arith.extsi", results=[wide], operands=[loaded]).result
