"""VtensorType: the one parser of ``!torch.vtensor<[...],dtype>`` strings (properties and cases)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turbine_ir import ModuleBuilder, VtensorType, ir

ELEMENTS = ["f32", "f16", "bf16", "f64", "si8", "si16", "si32", "si64", "ui8", "i1"]
ELEMENTS += ["complex<f32>", "complex<f64>", "f8E4M3FN"]

sizes_st = st.lists(st.one_of(st.none(), st.integers(0, 10**12)), max_size=6).map(tuple)
types_st = st.builds(VtensorType, sizes_st, st.sampled_from(ELEMENTS))


@given(types_st)
def test_print_then_parse_is_identity(t):
    assert VtensorType.parse(t.asm()) == t
    assert VtensorType.parse(str(t)) == t
    assert VtensorType.of(t.asm()) == t


@given(types_st)
@settings(max_examples=50, deadline=None)
def test_asm_is_what_mlir_prints(t):
    """The canonical spelling is MLIR's own: parsing it with the bindings prints it back."""
    with ir.Context() as ctx, ir.Location.unknown():
        ModuleBuilder(ir.Module.create().operation)  # loads the torch dialect
        typ = ir.Type.parse(t.asm(), ctx)
        assert str(typ) == t.asm()
        assert VtensorType.of(typ) == t


@given(st.text(max_size=60))
def test_any_text_parses_to_none_or_a_type_that_round_trips(text):
    t = VtensorType.parse(text)
    assert t is None or VtensorType.parse(t.asm()) == t


@given(types_st, st.data())
def test_damaged_strings_never_raise(t, data):
    """Deleting or inserting a character gives ``None`` or a valid type, never an exception."""
    s = t.asm()
    i = data.draw(st.integers(0, len(s)))
    cut = s[:i] + s[i + 1 :]
    ins = s[:i] + data.draw(st.sampled_from(list("[]<>,?-x 9!"))) + s[i:]
    for damaged in (cut, ins):
        parsed = VtensorType.parse(damaged)
        assert parsed is None or VtensorType.parse(parsed.asm()) == parsed


@pytest.mark.parametrize(
    ("text", "sizes", "dtype"),
    [
        ("!torch.vtensor<[2,?],si64>", (2, None), "si64"),
        ("!torch.vtensor<[],f32>", (), "f32"),
        ("!torch.vtensor<[0],i1>", (0,), "i1"),
        ("!torch.vtensor<[3],complex<f64>>", (3,), "complex<f64>"),
        # lenient: spaces, and -1 for a dynamic size (older printers)
        ("  !torch.vtensor<[ 2 , ? ], f32>  ", (2, None), "f32"),
        ("!torch.vtensor<[-1,4],bf16>", (None, 4), "bf16"),
    ],
)
def test_parse_cases(text, sizes, dtype):
    t = VtensorType.parse(text)
    assert t is not None and (t.sizes, t.dtype) == (sizes, dtype)
    assert t.rank == len(sizes)
    assert t.has_static_shape == (None not in sizes)


@pytest.mark.parametrize(
    "text",
    [
        "tensor<2xf32>",
        "!torch.int",
        "!torch.vtensor",
        "!torch.vtensor<*,f32>",
        "!torch.tensor<[2],f32>",  # not value semantics
        "!torch.vtensor<[2],>",
        "!torch.vtensor<[2]f32>",
        "!torch.vtensor<[2,f32>",
        "!torch.vtensor<[2,,3],f32>",
        "!torch.vtensor<[2x3],f32>",
        "!torch.vtensor<[-2],f32>",
        "!torch.vtensor<[1e3],f32>",
        "!torch.vtensor<[2],f32",
        "!torch.vtensor<[2],complex<f32>",
        "!torch.vtensor<[2],f32>>",
        "!torch.vtensor<[" + "9" * 19 + "],f32>",
        "",
    ],
)
def test_malformed_or_other_types_are_none(text):
    assert VtensorType.parse(text) is None


def test_of_reads_a_value_type_and_with_sizes(mb):
    with mb.context:
        typ = ir.Type.parse("!torch.vtensor<[4,?],ui8>")
    t = VtensorType.of(typ)
    assert t == VtensorType((4, None), "ui8")

    class _Value:  # an ir.Value's shape: the type is its `.type`
        type = typ

    assert VtensorType.of(_Value()) == t
    assert VtensorType.of(object()) is None
    assert str(t.with_sizes([1, 2])) == "!torch.vtensor<[1,2],ui8>"
    assert str(t.with_sizes([None], "f32")) == "!torch.vtensor<[?],f32>"


@pytest.mark.parametrize("sizes", [(-1,), (1.5,), (True,), ("3",)])
def test_constructor_rejects_bad_sizes(sizes):
    with pytest.raises(ValueError, match="non-negative ints or None"):
        VtensorType(sizes, "f32")


def test_native_type_converter_reads_non_value_tensors(mb):
    """``!torch.tensor`` converts like ``!torch.vtensor`` (as before the shared parser)."""
    conv = mb.native_type_converter
    with mb.context:
        typ = ir.Type.parse("!torch.tensor<[2,?],f32>")
        assert str(conv.torch_type_to_native(typ)) == "tensor<2x?xf32>"
        other = ir.Type.parse("!torch.vtensor<*,f32>")
        assert conv.torch_type_to_native(other) == other
