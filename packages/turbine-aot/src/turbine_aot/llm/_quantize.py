"""``quantize=`` of ``export_causal_lm``: a torchao-quantized copy of a causal LM.

``"int8"`` is torchao's ``Int8WeightOnlyConfig()`` (int8 weights, one fp scale per output
channel); ``"int4"`` is ``IntxWeightOnlyConfig(weight_dtype=torch.int4,
granularity=PerGroup(group_size))`` (int4 weights, a scale and zero point per group of
``group_size`` inputs), the int4 scheme that runs on CPUs (``Int4WeightOnlyConfig``'s packings
need GPU kernel libraries); ``"w8a8"`` is ``Int8DynamicActivationInt8WeightConfig()`` (int8
weights per output channel, and the activations quantized to int8 per row at run time: integer
products, on turbine's AVX-512 VNNI kernel where the CPU has it, docs/quantization.md);
``"w4a8"`` is ``Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4,
weight_granularity=PerGroup(group_size))`` (int4 weights per group as ``"int4"``, the activations
quantized to int8 per row at run time: llama.cpp Q4_0's integer math, on turbine's AVX-512 VNNI
w4a8 kernel where the CPU has it). Every ``nn.Linear`` is quantized (the LM head too),
embeddings and norms are not. ``transformers``' ``Conv1D`` layers (GPT-2's projections: a
linear layer with its weight stored transposed, which torchao's ``quantize_`` does not touch)
become the equivalent ``nn.Linear`` in the copy first, so that they are quantized too. torchao
is an optional dependency (``pip install turbine-aot[quant]``).
"""

from __future__ import annotations

import copy
from typing import Any

from torch import nn

from ._errors import LLMExportError

__all__ = ["QUANTIZATIONS", "quantized_copy"]

#: The ``quantize=`` choices.
QUANTIZATIONS = ("int8", "int4", "w8a8", "w4a8")
#: The schemes with int4 weights in groups (``group_size=``).
GROUPED = ("int4", "w4a8")
#: 128 for both grouped schemes: one meaning of ``group_size``'s default; w4a8 at 128 reads 18%
#: fewer bytes than at 32 (llama.cpp Q4_0's block) and ran 1.2x faster (docs/quantization.md).
DEFAULT_GROUP_SIZE = 128


def _torchao_quantize(model: nn.Module, quantize: str, group_size: int) -> None:
    """torchao's ``quantize_`` of ``model`` in place with the scheme's config."""
    try:
        import torch
        from torchao.quantization import (
            Int8DynamicActivationInt8WeightConfig,
            Int8DynamicActivationIntxWeightConfig,
            Int8WeightOnlyConfig,
            IntxWeightOnlyConfig,
            quantize_,
        )
        from torchao.quantization.granularity import PerGroup
    except ImportError as e:
        raise LLMExportError(
            f"quantize={quantize!r} needs torchao (pip install 'turbine-aot[quant]' or "
            f"pip install torchao): {e}"
        ) from e
    if quantize == "int8":
        config: Any = Int8WeightOnlyConfig()
    elif quantize == "w8a8":
        # set_inductor_config=False: torchao would otherwise change torch._inductor's global
        # settings, which this export never uses
        config = Int8DynamicActivationInt8WeightConfig(set_inductor_config=False)
    elif quantize == "w4a8":
        config = Int8DynamicActivationIntxWeightConfig(
            weight_dtype=torch.int4,  # type: ignore[attr-defined]  # torch's stubs: sub-byte
            weight_granularity=PerGroup(group_size),
        )
    else:
        int4 = torch.int4  # type: ignore[attr-defined]  # torch's stubs lack the sub-byte dtypes
        config = IntxWeightOnlyConfig(weight_dtype=int4, granularity=PerGroup(group_size))
    quantize_(model, config)


def quantized_copy(model: nn.Module, quantize: str, *, group_size: int | None = None) -> Any:
    """A copy of ``model`` with its ``nn.Linear`` weights quantized by torchao (eval mode).

    The copy is what :func:`~turbine_aot.llm.export_causal_lm` exports for ``quantize=``:
    generating with it in eager PyTorch gives the reference tokens.

    Args:
        model: the causal LM (not modified).
        quantize: ``"int8"``, ``"int4"``, ``"w8a8"`` or ``"w4a8"``.
        group_size: inputs per int4 scale (default 128); must divide every linear layer's
            input size. Only for ``"int4"`` and ``"w4a8"``.

    Raises:
        LLMExportError: an unknown scheme, a bad group size, or torchao missing.
    """
    if quantize not in QUANTIZATIONS:
        raise LLMExportError(
            f"quantize must be one of {', '.join(map(repr, QUANTIZATIONS))} or None; got "
            f"{quantize!r}"
        )
    if quantize not in GROUPED and group_size is not None:
        raise LLMExportError(
            "group_size is for quantize='int4' or 'w4a8' (int8 weights have one scale per "
            f"output channel); leave it out for {quantize!r}"
        )
    size = DEFAULT_GROUP_SIZE if group_size is None else group_size
    grouped = quantize in GROUPED
    if grouped and (isinstance(size, bool) or not isinstance(size, int) or size < 2 or size % 2):
        raise LLMExportError(f"group_size must be an even int >= 2; got {group_size!r}")
    quantized = copy.deepcopy(model).eval()
    _conv1d_as_linear(quantized)
    if grouped:
        bad = [
            f"{name} ({m.in_features} inputs)"
            for name, m in quantized.named_modules()
            if isinstance(m, nn.Linear) and m.in_features % size
        ]
        if bad:
            raise LLMExportError(
                f"group_size={size} does not divide the input size of {', '.join(bad[:3])}"
                + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
                + "; choose a group size that divides every linear layer's inputs (32, 64, "
                "128 for most LLMs)"
            )
    _torchao_quantize(quantized, quantize, size)
    return quantized


def _conv1d_as_linear(model: nn.Module) -> int:
    """Replaces each ``transformers`` ``Conv1D`` in ``model`` by the ``nn.Linear`` that computes
    the same (``x @ weight + bias`` with ``weight`` ``[in, out]``: a linear layer of weight
    ``weight.T``); returns how many (0 without ``transformers``)."""
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:
        return 0
    import torch

    n = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, Conv1D):
                continue
            w = child.weight
            linear = nn.Linear(
                w.shape[0], w.shape[1], bias=child.bias is not None, device=w.device, dtype=w.dtype
            )
            with torch.no_grad():
                linear.weight.copy_(w.t())
                if child.bias is not None:
                    linear.bias.copy_(child.bias)
            setattr(parent, name, linear)
            n += 1
    return n
