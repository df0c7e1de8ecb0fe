"""Test helpers shared by the tests of turbine's own CPU kernels (the AVX-512 matmul, quantized,
convolution and pooling rewrites): the skip mark for CPUs without AVX-512 and the text of the
module the compile path hands IREE."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from turbine_aot._compiler.avx512 import host_avx512_missing
from turbine_aot._compiler.rewrites import module_for_compile

#: The AVX-512 features this CPU lacks (empty on an AVX-512 CPU).
AVX512_MISSING = host_avx512_missing()
needs_avx512 = pytest.mark.skipif(
    bool(AVX512_MISSING), reason=f"this CPU has no AVX-512 (lacks {', '.join(AVX512_MISSING)})"
)


def compile_copy_asm(eo, flags: Sequence[str]) -> str:
    """The text of the copy of ``eo``'s module that the compile path hands IREE for ``flags``."""
    copy, owned = module_for_compile(eo.mlir_module, list(flags))
    try:
        return str(copy)
    finally:
        if owned:
            copy.operation.erase()
