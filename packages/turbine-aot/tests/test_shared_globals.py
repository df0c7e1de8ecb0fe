"""Mutable globals with the same type and initial value keep their own storage (``_compiler.globals``).

IREE 3.13 gives such globals ONE buffer (``iree-util-combine-initializers`` merges their
initializers, ``cse`` their identical ``stream.tensor.empty`` / ``stream.tensor.splat``, and
``iree-util-fuse-globals`` the globals): the per-layer KV caches of a stateless Llama
(``export_global_tree(..., uninitialized=True, mutable=True)``) all held the last one written.
The compile path rewrites a copy; the exported IR stays the reference's.
"""

# Procedures declare their signatures with abstract-type defaults (the API's design):
# ruff: noqa: B008

from __future__ import annotations

import numpy as np
import pytest
import torch
from ir_check import check_ir

from turbine_aot import CompiledModule, export, export_global_tree
from turbine_aot._compiler.flags import default_compile_flags
from turbine_aot._compiler.globals import separate_shared_globals, shared_mutable_globals
from turbine_aot._compiler.rewrites import module_for_compile, source_for_compile
from turbine_aot.builtins import IREE, AbstractTensor
from turbine_aot.runtime import compile_mlir, device_compile_flags, load_module
from turbine_ir import ir

FAST = ["--iree-opt-data-tiling=false", "--iree-llvmcpu-enable-ukernels=none"]
INITIAL_VALUES = ["#util.uninitialized", "dense<0.000000e+00>"]


def _pair(initial_a: str, initial_b: str | None = None, type_b: str = "tensor<4xf32>") -> str:
    """Two mutable globals, written with different values in place, read back."""
    initial_b = initial_a if initial_b is None else initial_b
    return f"""
module @pair {{
  util.global private mutable @a = {initial_a} : tensor<4xf32>
  util.global private mutable @b = {initial_b} : {type_b}
  func.func @store(%x: tensor<2xf32>, %y: tensor<2xf32>) {{
    %c0 = arith.constant 0 : index
    %a = util.global.load @a : tensor<4xf32>
    %a2 = flow.tensor.update %x, %a[%c0] : tensor<2xf32> -> %a as tensor<4xf32>
    util.global.store %a2, @a : tensor<4xf32>
    %b = util.global.load @b : tensor<4xf32>
    %b2 = flow.tensor.update %y, %b[%c0] : tensor<2xf32> -> %b as tensor<4xf32>
    util.global.store %b2, @b : tensor<4xf32>
    return
  }}
  func.func @read() -> (tensor<4xf32>, tensor<4xf32>) {{
    %a = util.global.load @a : tensor<4xf32>
    %b = util.global.load @b : tensor<4xf32>
    return %a, %b : tensor<4xf32>, tensor<4xf32>
  }}
}}
"""


def _store_and_read(module) -> tuple[np.ndarray, np.ndarray]:
    """Writes [1, 2] into @a and [7, 8] into @b; what they then hold (an ``iree_device``
    module on numpy arrays, or a ``load_module`` one on torch tensors)."""
    x, y = np.array([1.0, 2.0], np.float32), np.array([7.0, 8.0], np.float32)
    if hasattr(module, "signatures") or type(module).__module__.startswith("turbine_aot"):
        module.store(torch.from_numpy(x), torch.from_numpy(y))
        return tuple(np.asarray(t) for t in module.read())  # type: ignore[return-value]
    module.store(x, y)
    a, b = module.read()
    return np.asarray(a.to_host()), np.asarray(b.to_host())


@pytest.mark.parametrize("initial", INITIAL_VALUES)
def test_iree_still_gives_mutable_globals_with_one_initial_value_one_storage(initial, iree_device):
    """Why the compile path rewrites such globals (``_compiler.globals``): compiled as written,
    IREE 3.13 stores one buffer in both globals, so each holds the last value written. When this
    test fails, IREE got fixed: drop ``separate_shared_globals`` from
    ``rewrites.module_for_compile`` (bump ``REVISION``) and this test."""
    a, b = _store_and_read(iree_device.load(iree_device.compile(_pair(initial))))
    assert b[:2].tolist() == [7.0, 8.0]
    assert a[:2].tolist() == [7.0, 8.0]  # wrong: @a was written [1, 2]
    assert np.array_equal(a, b)  # one buffer (beyond [:2]: zeros, or the same uninitialized data)


@pytest.mark.parametrize("initial", INITIAL_VALUES)
def test_the_rewritten_copy_keeps_each_global_apart(initial, iree_device):
    with ir.Context():
        module = ir.Module.parse(_pair(initial))
        assert len(shared_mutable_globals(module.operation)) == 2
        assert separate_shared_globals(module.operation) == 2
        rewritten = str(module)
    # Each global's own initializer, its fill made distinct by a salt no pass can fold away.
    check_ir(
        rewritten,
        r"^  util\.global private mutable @a : tensor<4xf32>$",
        r"^  util\.initializer \{$",
        r"%cst = arith\.constant 0\.000000e\+00 : f32",
        r"%c0 = arith\.constant 0 : index",
        r"%0:2 = util\.optimization_barrier %c0, %cst : index, f32",
        r"%1 = flow\.tensor\.splat %0#1 : tensor<4xf32>",
        r"util\.global\.store %1, @a : tensor<4xf32>",
        r"^  util\.global private mutable @b : tensor<4xf32>$",
        r"%cst = arith\.constant 0\.000000e\+00 : f32",
        r"%c1 = arith\.constant 1 : index",
        r"util\.optimization_barrier %c1, %cst : index, f32",
        r"util\.global\.store %1, @b : tensor<4xf32>",
    )
    a, b = _store_and_read(iree_device.load(iree_device.compile(rewritten)))
    assert np.array_equal(a, [1.0, 2.0, 0.0, 0.0])
    assert np.array_equal(b, [7.0, 8.0, 0.0, 0.0])
    with ir.Context():  # idempotent: the rewritten globals have no initial value left
        assert shared_mutable_globals(ir.Module.parse(rewritten).operation) == []


@pytest.mark.parametrize(
    ("initial_b", "type_b", "shared"),
    [
        ("#util.uninitialized", "tensor<4xf32>", True),
        ("dense<1.500000e+00>", "tensor<4xf32>", True),  # the same splat, not zero
        ("dense<[1.0, 2.0, 3.0, 4.0]>", "tensor<4xf32>", True),  # the same constant
        ("dense<0.000000e+00>", "tensor<4xf32>", False),  # zeros vs uninitialized
        ("#util.uninitialized", "tensor<2x2xf32>", False),  # same bytes, another type
        ("#util.uninitialized", "tensor<4xi32>", False),
    ],
)
def test_which_globals_share_storage(initial_b, type_b, shared):
    """Measured on IREE 3.13 (llvm-cpu): only the same type AND the same initial value merge."""
    initial_a = initial_b if shared else "#util.uninitialized"
    text = _pair(initial_a, initial_b, type_b)
    if type_b != "tensor<4xf32>":  # @b keeps its own type: only the declarations matter here
        text = text.split("  func.func @store")[0] + "}\n"
    with ir.Context():
        module = ir.Module.parse(text)
        assert len(shared_mutable_globals(module.operation)) == (2 if shared else 0)


def test_globals_iree_keeps_apart_are_not_rewritten():
    text = """
module @m {
  util.global private mutable @resource_a = dense_resource<blob_a> : tensor<4xf32>
  util.global private mutable @resource_b = dense_resource<blob_b> : tensor<4xf32>
  util.global private mutable @mutable = dense<0.000000e+00> : tensor<4xf32>
  util.global private @immutable = dense<0.000000e+00> : tensor<4xf32>
  util.global private mutable @step_a = 0 : index
  util.global private mutable @step_b = 0 : index
  util.global private mutable @stored_first_a : tensor<4xf32>
  util.global private mutable @stored_first_b : tensor<4xf32>
  util.global private mutable @dynamic_a = #util.uninitialized : tensor<?xf32>
  util.global private mutable @dynamic_b = #util.uninitialized : tensor<?xf32>
  util.global private mutable @param_a = #flow.parameter.named<"model"::"w"> : tensor<4xf32>
  util.global private mutable @param_b = #flow.parameter.named<"model"::"w"> : tensor<4xf32>
}
{-#
  dialect_resources: {
    builtin: {
      blob_a: "0x040000000000000000000000000000000000000000000000",
      blob_b: "0x040000000000000000000000000000000000000000000000"
    }
  }
#-}
"""
    # distinct blobs of equal bytes, a mutable and an immutable one of one value, scalars, globals
    # without an initial value (no storage until stored whole), dynamic shapes and parameters:
    # none merges (blobs and mutable/immutable measured with test_iree_... 's program)
    with ir.Context():
        assert shared_mutable_globals(ir.Module.parse(text).operation) == []


def test_a_shared_constant_is_written_into_a_salted_fill(iree_device):
    with ir.Context():
        module = ir.Module.parse(_pair("dense<[1.0, 2.0, 3.0, 4.0]>"))
        separate_shared_globals(module.operation)
        rewritten = str(module)
    check_ir(
        rewritten,
        r"%1 = flow\.tensor\.splat %0#1 : tensor<4xf32>",
        r"%cst_1 = arith\.constant dense<\[1\.000000e\+00, 2\.000000e\+00, 3\.000000e\+00, "
        r"4\.000000e\+00\]> : tensor<4xf32>",
        r"%2 = flow\.tensor\.update %cst_1, %1\[%c0_0\] : tensor<4xf32> -> %1 as tensor<4xf32>",
        r"util\.global\.store %2, @a",
    )
    a, b = _store_and_read(iree_device.load(iree_device.compile(rewritten)))
    assert np.array_equal(a, [1.0, 2.0, 3.0, 4.0]) and np.array_equal(b, [7.0, 8.0, 3.0, 4.0])


# ----------------------------------------------------------------------------- turbine's paths
class Caches(CompiledModule):
    """Per-layer caches as a stateless-Llama export declares them: one type, uninitialized."""

    caches = export_global_tree(
        {"layer": [AbstractTensor(4, 2) for _ in range(3)]}, uninitialized=True, mutable=True
    )
    zeros = export_global_tree([AbstractTensor(4, 2), AbstractTensor(4, 2)], mutable=True)

    def write(self, row=AbstractTensor(1, 2)):
        for i in range(3):  # the same position of each cache, a different value
            value = IREE.tensor_splat(1, 2, value=float(i + 1), dtype=torch.float32)
            self.caches["layer"][i] = IREE.tensor_update(self.caches["layer"][i], value, 0, 0)
        self.zeros[0] = IREE.tensor_update(self.zeros[0], row, 0, 0)
        self.zeros[1] = IREE.tensor_update(self.zeros[1], row, 3, 0)

    def read(self):
        return (*[self.caches["layer"][i] for i in range(3)], self.zeros[0], self.zeros[1])


def test_compiled_module_caches_keep_their_own_values():
    out = export(Caches)
    exported = str(out.mlir_module)
    assert exported.count("= #util.uninitialized : tensor<4x2xf32>") == 3  # the reference's IR
    assert exported.count("= dense<0.000000e+00> : tensor<4x2xf32>") == 2
    m = load_module(out.compile(None, extra_args=FAST))
    row = torch.tensor([[5.0, 6.0]])
    m.write(row)
    *caches, z0, z1 = m.read()
    # IREE alone: every cache holds the last value written (3.0), and z0 gets z1's row too
    assert [cache[0].tolist() for cache in caches] == [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]
    torch.testing.assert_close(z0, torch.zeros(4, 2).index_copy_(0, torch.tensor([0]), row))
    torch.testing.assert_close(z1, torch.zeros(4, 2).index_copy_(0, torch.tensor([3]), row))
    assert str(out.mlir_module) == exported  # the exported module is untouched


class _MetaCaches(torch.nn.Module):
    """Two KV-cache buffers of a model built on the meta device: both start as dense<0.0>."""

    def __init__(self):
        super().__init__()
        self.register_buffer("k", torch.zeros(8, 4, device="meta"))
        self.register_buffer("v", torch.zeros(8, 4, device="meta"))

    def forward(self, k, v, pos):
        self.k.index_copy_(0, pos, k[None])
        self.v.index_copy_(0, pos, v[None])
        return self.k.sum(), self.v.sum()


def test_exported_program_buffers_keep_their_own_values():
    meta = torch.device("meta")
    out = export(
        _MetaCaches(),
        args=(
            torch.ones(4, device=meta),
            torch.ones(4, device=meta),
            torch.tensor([0], device=meta),
        ),
        strict_export=False,
    )
    assert str(out.mlir_module).count("mutable @__auto.") == 2
    m = load_module(out.compile(None, extra_args=FAST))
    k_sum, v_sum = m.main(torch.ones(4), torch.full((4,), 2.0), torch.tensor([1]))
    assert (float(k_sum), float(v_sum)) == (4.0, 8.0)  # IREE alone: (8.0, 8.0)


def test_compile_mlir_and_the_cli_paths_hand_iree_the_rewritten_copy(tmp_path):
    text = _pair("#util.uninitialized")
    flags = [*device_compile_flags(["local-task"]), *FAST]
    for vmfb in (compile_mlir(text, flags, cache=tmp_path), compile_mlir(text, flags, cache=False)):
        a, b = _store_and_read(load_module(vmfb))
        assert a.tolist() == [1.0, 2.0, 0.0, 0.0] and b.tolist() == [7.0, 8.0, 0.0, 0.0]
    a, b = _store_and_read(load_module(compile_mlir(text, flags, cache=False, rewrite=False)))
    assert a[:2].tolist() == [7.0, 8.0] and np.array_equal(a, b)  # as given: IREE's merge
    # what turbine-aot compile/bundle and compile_mlir hand IREE: the same rewrite
    source = source_for_compile(text.encode(), default_compile_flags("llvm-cpu", use_env=False))
    with ir.Context():
        assert "util.initializer" in str(ir.Module.parse(source))
    with ir.Context():
        module = ir.Module.parse(text)
        copy, owned = module_for_compile(module.operation, ["--iree-hal-target-device=cuda"])
        assert owned and "util.optimization_barrier" in str(copy)  # every target
        assert "util.initializer" not in str(module)
        copy.operation.erase()


def test_llm_bf16_cache_globals_generate_what_argument_caches_generate():
    """turbine_aot.llm in bf16 was affected: its per-layer caches are bf16 globals whose inline
    zeros are written as one dense<"0x0000..."> attribute each (IREE 3.13 miscompiles small bf16
    dense_resource data), so all four shared one buffer and greedy decoding left the argument-
    cache module's tokens at the third token. The same weights with the cache as an argument
    (no globals) are the reference here: both run IREE's bf16 arithmetic."""
    transformers = pytest.importorskip("transformers", reason="transformers is a test dependency")
    from turbine_aot import llm

    cfg = transformers.LlamaConfig(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    globals_eo = llm.export_causal_lm(model, max_seq_len=48, dtype=torch.bfloat16)
    assert len(shared_mutable_globals(globals_eo.mlir_module)) == 4  # k0, v0, k1, v1
    prompt = torch.randint(0, 320, (9,), generator=torch.Generator().manual_seed(13))
    got = llm.load(globals_eo).generate(prompt, 16)[0, 9:]
    argument_eo = llm.export_causal_lm(
        model, max_seq_len=48, dtype=torch.bfloat16, kv_cache="argument"
    )
    want = llm.load(argument_eo).generate(prompt, 16)[0, 9:]
    assert got.tolist() == want.tolist()


def test_a_half_precision_fill_goes_through_the_barrier_as_bits(iree_device):
    # The VM has no f16/bf16 scalars: a barrier of one fails to legalize ("failed to legalize
    # operation 'util.initializer'"); its bit pattern goes through instead.
    text = _pair("dense<0.000000e+00>").replace("f32", "f16")
    with ir.Context():
        module = ir.Module.parse(text)
        assert separate_shared_globals(module.operation) == 2
        rewritten = str(module)
    check_ir(
        rewritten,
        r"%cst = arith\.constant 0\.000000e\+00 : f16",
        r"%0 = arith\.bitcast %cst : f16 to i16",
        r"%1:2 = util\.optimization_barrier %c0, %0 : index, i16",
        r"%2 = arith\.bitcast %1#1 : i16 to f16",
        r"%3 = flow\.tensor\.splat %2 : tensor<4xf16>",
    )
    m = iree_device.load(iree_device.compile(rewritten))
    m.store(np.array([1.0, 2.0], np.float16), np.array([7.0, 8.0], np.float16))
    a, b = (np.asarray(t.to_host()) for t in m.read())
    assert a.tolist() == [1.0, 2.0, 0.0, 0.0] and b.tolist() == [7.0, 8.0, 0.0, 0.0]
