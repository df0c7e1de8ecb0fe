"""The one-row int4 weight-only product on AVX2 CPUs, ``nibble_masks``: the body of
:class:`.avx512_quant.Avx512QuantGemm` where it is blocked for AVX2 and ``M`` is one row (a
decode step's products). docs/quantization.md, "Weight-only int4 on AVX2: nibble masks".

AVX2 has no 16-entry table lookup (the AVX-512 form's ``vpermps`` over a zmm register), so a
nibble must become an f32 by integer operations and a conversion. The general AVX2 form
sign-extends each nibble (a shift left, an arithmetic shift right), converts it and subtracts
the zero point: per 32 weights two widenings, eight shifts, four conversions, four subtractions
and four FMAs, plus the activations' even / odd split. This form needs one ``and`` and one
conversion per eight weights:

- 32 weight bytes (64 weights ``k0 .. k0 + 63``) are read as 8 dwords; dword ``i`` holds the
  nibbles of ``k0 + 8 i + t`` at bits ``4 t`` (``t`` 0..7). They are xor-ed with ``0x88888888``
  once, which turns each signed nibble ``q`` (-8..7, IREE's ``i4``) into ``q + 8`` (0..15).
- Nibble ``t`` is taken out in place: ``dword & (0xF << 4 t)`` (``t`` 7: ``dword >> 28``), an
  integer ``(q + 8) * 16^t`` that converts to f32 exactly (4 significant bits). The factor
  ``16^t`` is undone on the activations, which are put in this order once per row and workgroup
  and multiplied by ``16^-t`` (``t`` 1..6; a power of two, exact unless ``|x| < 2^-102``, where
  the scaled value would be subnormal): ``xp[64 b + 8 t + i] = x[64 b + 8 i + t] * 16^-t``. So
  the FMA of nibble ``t`` with ``xp``'s ``t``-th vector adds ``(x 16^-t) ((q + 8) 16^t)``, which
  is ``x (q + 8)`` bit for bit.
- Per group, ``sum x (q - z) = sum x (q + 8) - (z + 8) sum x``: the row's per-lane sums of
  ``x`` over each group (``xg``) are computed with the reordering, and the group's partial is
  corrected by one FMA with ``-(z + 8)`` (the block's zero points converted once, into a stack
  buffer) and scaled into the total by another. Groups of 32 share a load: lanes 0-3 are the
  first group, 4-7 the second, and the scale and zero-point vectors are per lane.

The partial sums run in ``chains`` accumulators per channel (nibbles ``t`` modulo ``chains``;
two measured faster than four or eight on Zen 3).

The reordered row and its group sums are computed once per call by a dispatch of their own
(:func:`row_executable`, before the kernel: ``prepared_row``), and every workgroup reads them
from ``A``; at ``K`` = 768 each workgroup's own reordering had cost about a tenth of the
kernel's time (docs/quantization.md). Without it (the ``rows-per-workgroup`` A/B variant)
each workgroup reorders the row into stack buffers, ``K`` in slices of up to :data:`SLICE_K`
values (IREE's stack limit); with more than one, each slice adds its sums into ``C``, zeroed
first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from .kernel_text import close_executable, open_executable, tree_sum

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "SLICE_K",
    "MasksKernel",
    "emit_masks_body",
    "masks_support",
    "row_executable",
    "row_name",
    "row_width",
]

#: The most values of ``K`` reordered at a time: the row's reordered activations and group sums
#: live in a stack buffer (``4.5`` bytes a value: 18 KiB), within IREE's CPU stack allocation
#: limit (32 KiB); a longer ``K`` runs in slices, each adding its sums into ``C``.
SLICE_K = 4096
_XOR = -2004318072  # 0x88888888 as i32: q -> q + 8 in every nibble


class MasksKernel(Protocol):
    """What the body reads of its kernel (:class:`.avx512_quant.Avx512QuantGemm`), and the
    kernel's software prefetch of the next block's weight rows, which it emits as the other forms
    do."""

    @property
    def k(self) -> int: ...

    @property
    def n(self) -> int: ...

    @property
    def group(self) -> int | None: ...

    @property
    def zero_point(self) -> bool: ...

    @property
    def nr(self) -> int: ...

    @property
    def cols_per_workgroup(self) -> int: ...

    @property
    def prefetch(self) -> bool: ...

    @property
    def chains(self) -> int: ...

    @property
    def prepared_row(self) -> bool: ...

    def emit_prefetch_rows(self, e: Callable[[str], object], p: str) -> None: ...

    def emit_prefetch(self, e: Callable[[str], object], q_t: str, byte: str, p: str) -> None: ...


def masks_support(k: int, bits: int, group: int | None, mr: int = 1) -> bool:
    """Whether ``nibble_masks`` applies: int4 in groups of 32 or of a multiple of 64, one row,
    ``K`` a multiple of 64."""
    return (
        bits == 4
        and group is not None
        and (group == 32 or (group > 0 and group % 64 == 0))
        and k % 64 == 0
        and k % group == 0
        and mr == 1
    )


def _chunk(group: int) -> int:
    """The ``k`` per step of the group loop: a group, or two groups of 32 (one load)."""
    return max(group, 64)


def _slices(k: int, chunk: int) -> list[tuple[int, int, int]]:
    """``(first k, end k, slice size)`` of the loops over ``K``: slices of the most chunks that
    fit :data:`SLICE_K`, then one slice of the chunks left (if any)."""
    size = min(k, SLICE_K // chunk * chunk)
    full = k // size * size
    return [(0, full, size)] + ([(full, k, k - full)] if full < k else [])


def row_width(k: int, group: int) -> int:
    """The values of one prepared row (:func:`row_executable`): ``K`` reordered activations,
    then 8 per-lane group sums per step of the kernel's group loop."""
    return k + k // _chunk(group) * 8


def row_name(k: int, group: int) -> str:
    """The name of :func:`row_executable`'s executable for ``k`` and ``group``."""
    return f"__turbine_avx2_i4_row_{k}_c{_chunk(group)}"


def row_executable(k: int, group: int) -> str:
    """The ``stream.executable`` (MLIR text) preparing rows for the ``prepared_row`` kernels of
    ``k`` and ``group``: ``[M, K]`` f32 in, ``[M, row_width]`` out, each row its ``K``
    activations in nibble order scaled by ``16^-t`` followed by their per-lane group sums (what
    each workgroup of the kernel otherwise computes into its stack buffers). One workgroup a
    row. Its dispatch: ``flow.dispatch @name::@name[%m](%x, %m) : (tensor<?xKxf32>{%m}, index)
    -> tensor<?xWxf32>{%m}``."""
    chunk, width, name = _chunk(group), row_width(k, group), row_name(k, group)
    x_t, o_t = f"memref<?x{k}xf32>", f"memref<?x{width}xf32>"
    out: list[str] = []
    e = out.append
    open_executable(
        e, name, column_blocks=1, rows_per_workgroup=1, bindings=["%x", "%o"], constants={0, 1}
    )
    p = "      "
    e(f"{p}%ma = stream.binding.subspan %x[%c0] : !stream.binding -> {x_t}{{%m}}")
    e(f"{p}%mo = stream.binding.subspan %o[%c0] : !stream.binding -> {o_t}{{%m}}")
    e(f"{p}%mi = stream.dispatch.workgroup.id[1] : index")
    e(f"{p}%ks = arith.constant 0 : index")
    e(f"{p}%chunks = arith.constant {k // chunk} : index")
    _emit_units(e, p)
    e(f"{p}scf.for %rc = %c0 to %chunks step %c1 {{")
    _emit_reorder(
        e,
        p + "  ",
        chunk,
        source="%ma[%mi, %ak{blk}]",
        source_t=x_t,
        xp="%mo[%mi, %xo{blk}_{t}]",
        xp_t=o_t,
        xg="%mo[%mi, %goa]",
        xg_t=o_t,
        xg_base=k,
    )
    e(f"{p}}}")
    close_executable(e)
    return "\n".join(out)


def _emit_units(e: Callable[[str], object], p: str) -> None:
    """``%unit<t>``: the vectors of ``16^-t`` (exact), ``t`` 1..6."""
    for t in range(1, 7):
        e(f"{p}%unit{t} = arith.constant dense<{2.0 ** (-4 * t)!r}> : vector<8xf32>")


def _emit_reorder(
    e: Callable[[str], object],
    r: str,
    chunk: int,
    *,
    source: str,
    source_t: str,
    xp: str,
    xp_t: str,
    xg: str,
    xg_t: str,
    xg_base: int = 0,
) -> None:
    """The body of the loop over a row's chunks (``%rc``, from ``%ks``; row ``%mi``): the
    chunk's activations loaded from ``source`` (a template over ``{blk}``), put in nibble order
    and scaled by ``16^-t``, stored at ``xp`` (over ``{blk}``, ``{t}``), and their per-lane sums
    at ``xg`` (its index ``%go``, plus ``xg_base`` as ``%goa``)."""
    vt = "vector<8xf32>"
    e(f"{r}%rk = affine.apply affine_map<()[s0] -> (s0 * {chunk})>()[%rc]")
    e(f"{r}%ak = arith.addi %ks, %rk : index")
    sums = []
    for blk in range(chunk // 64):
        e(f"{r}%rk{blk} = affine.apply affine_map<()[s0] -> (s0 + {64 * blk})>()[%rk]")
        e(f"{r}%ak{blk} = affine.apply affine_map<()[s0] -> (s0 + {64 * blk})>()[%ak]")
        e(f"{r}%xv{blk} = vector.load {source.format(blk=blk)} : {source_t}, vector<64xf32>")
        e(f"{r}%x2{blk} = vector.shape_cast %xv{blk} : vector<64xf32> to vector<8x8xf32>")
        e(f"{r}%xT{blk} = vector.transpose %x2{blk}, [1, 0] : vector<8x8xf32> to vector<8x8xf32>")
        lanes = []
        for t in range(8):
            x = f"%xt{blk}_{t}"
            e(f"{r}{x} = vector.extract %xT{blk}[{t}] : vector<8xf32> from vector<8x8xf32>")
            lanes.append(x)
            if 1 <= t <= 6:
                e(f"{r}%xs{blk}_{t} = arith.mulf {x}, %unit{t} : {vt}")
                x = f"%xs{blk}_{t}"
            e(f"{r}%xo{blk}_{t} = affine.apply affine_map<()[s0] -> (s0 + {8 * t})>()[%rk{blk}]")
            e(f"{r}vector.store {x}, {xp.format(blk=blk, t=t)} : {xp_t}, {vt}")
        sums.append(tree_sum(e, r, lanes, f"%ls{blk}", vt))
    total = tree_sum(e, r, sums, "%lg", vt)
    e(f"{r}%go = affine.apply affine_map<()[s0] -> (s0 * 8)>()[%rc]")
    if xg_base:
        e(f"{r}%goa = affine.apply affine_map<()[s0] -> (s0 + {xg_base})>()[%go]")
    e(f"{r}vector.store {total}, {xg} : {xg_t}, {vt}")


def emit_masks_body(g: MasksKernel, e: Callable[[str], object], types: tuple[str, ...]) -> None:
    """The function body after the workgroup's ``%nbase`` / ``%m0`` / ``%mend`` (the frame of
    :mod:`.kernel_text`): per row of ``M`` and slice of ``K`` the activations reordered once,
    then the workgroup's channels ``nr`` at a time; a ``K`` of more than one slice adds each
    slice's sums into ``C`` (zeroed first)."""
    k, nr, nb, group = g.k, g.nr, g.cols_per_workgroup, g.group
    assert group is not None
    chunk = _chunk(group)
    # a prepared row (row_executable's, in A) has no stack buffers to bound: one slice
    slices = [(0, k, k)] if g.prepared_row else _slices(k, chunk)
    size = slices[0][2]  # the largest slice: the buffers' size
    vt, it = "vector<8xf32>", "vector<8xi32>"
    bufs = {
        "xp": f"memref<{size}xf32>",
        "xg": f"memref<{size // chunk * 8}xf32>",
        "nzb": f"memref<{nr}x{size // group}xf32>",
    }
    p = "      "
    for name, buf_t in bufs.items():
        if (name != "nzb" or g.zero_point) and (name == "nzb" or not g.prepared_row):
            e(f"{p}%{name} = memref.alloca() : {buf_t}")
    e(f"{p}%zero8 = arith.constant dense<0.0> : {vt}")
    e(f"{p}%m8v = arith.constant dense<-8.0> : {vt}")
    e(f"{p}%xor = arith.constant dense<{_XOR}> : {it}")
    e(f"{p}%c28v = arith.constant dense<28> : {it}")
    for t in range(7):
        e(f"{p}%mask{t} = arith.constant dense<{15 << (4 * t)}> : {it}")
    _emit_units(e, p)
    consts = {0, 1, nr, nb, k} | set(range(nr))
    for lo, hi, n in slices:
        consts |= {lo, hi, n, n // chunk, n // group, _zero_width(n // group)}
    for c in sorted(consts):
        e(f"{p}%i{c} = arith.constant {c} : index")
    e(f"{p}scf.for %mi = %m0 to %mend step %i1 {{")
    q = p + "  "
    if len(slices) > 1 or slices[0][2] < k:
        e(f"{q}%zc = arith.constant dense<0.0> : vector<{nb}xf32>")
        e(f"{q}vector.store %zc, %mc[%mi, %nbase] : {types[4]}, vector<{nb}xf32>")
    for lo, hi, n in slices:
        e(f"{q}scf.for %ks = %i{lo} to %i{hi} step %i{n} {{")
        _slice(g, e, types, bufs, n, accumulate=len(slices) > 1 or n < k, p=q + "  ")
        e(f"{q}}}")
    e(f"{p}}}")


def _zero_width(groups: int) -> int:
    """Zero points converted per instruction: the widest of 16..1 dividing ``groups``."""
    return next(w for w in (16, 8, 4, 2, 1) if groups % w == 0)


def _slice(
    g: MasksKernel,
    e: Callable[[str], object],
    types: tuple[str, ...],
    bufs: dict[str, str],
    size: int,
    accumulate: bool,
    p: str,
) -> None:
    """One slice of ``size`` values of ``K`` from ``%ks`` (row ``%mi``): the activations
    reordered into ``%xp`` with their group sums in ``%xg``, then every channel of the
    workgroup (stored, or added into ``C`` where ``accumulate``)."""
    a_t, q_t, s_t, z_t, c_t = types
    xp_t, xg_t, zbuf_t = bufs["xp"], bufs["xg"], bufs["nzb"]
    nr, nb, group, chains = g.nr, g.cols_per_workgroup, g.group, g.chains
    assert group is not None
    chunk = _chunk(group)
    chunks, blocks, groups = size // chunk, chunk // 64, size // group
    zw = _zero_width(groups)
    vt, it = "vector<8xf32>", "vector<8xi32>"

    if g.prepared_row:  # in A: [x reordered (K) | group sums (K / chunk * 8)]
        e(
            f"{p}%xgbase = affine.apply affine_map<()[s0] -> ({g.k} + s0 floordiv {chunk} * 8)>()[%ks]"
        )
    else:  # the slice's activations reordered here, into the stack buffers
        e(f"{p}scf.for %rc = %i0 to %i{chunks} step %i1 {{")
        _emit_reorder(
            e,
            p + "  ",
            chunk,
            source="%ma[%mi, %ak{blk}]",
            source_t=a_t,
            xp="%xp[%xo{blk}_{t}]",
            xp_t=xp_t,
            xg="%xg[%go]",
            xg_t=xg_t,
        )
        e(f"{p}}}")

    e(f"{p}%g0 = affine.apply affine_map<()[s0] -> (s0 floordiv {group})>()[%ks]")
    e(f"{p}%kb = affine.apply affine_map<()[s0] -> (s0 floordiv 2)>()[%ks]")
    e(f"{p}scf.for %nq = %i0 to %i{nb} step %i{nr} {{")
    r = p + "  "
    e(f"{r}%ncol = arith.addi %nbase, %nq : index")
    for j in range(nr):
        e(f"{r}%n{j} = arith.addi %ncol, %i{j} : index")
    if g.prefetch:
        g.emit_prefetch_rows(e, r)
    if g.zero_point:  # the block's -(z + 8) as f32, zw groups at a time
        zv, zf = f"vector<{zw}xi8>", f"vector<{zw}xf32>"
        e(f"{r}%m8z = arith.constant dense<-8.0> : {zf}")
        e(f"{r}scf.for %gz = %i0 to %i{groups} step %i{zw} {{")
        e(f"{r}  %gza = arith.addi %g0, %gz : index")
        for j in range(nr):
            e(f"{r}  %zl{j} = vector.load %mz[%n{j}, %gza] : {z_t}, {zv}")
            e(f"{r}  %zc{j} = arith.sitofp %zl{j} : {zv} to {zf}")
            e(f"{r}  %zn{j} = arith.subf %m8z, %zc{j} : {zf}")
            e(f"{r}  vector.store %zn{j}, %nzb[%i{j}, %gz] : {zbuf_t}, {zf}")
        e(f"{r}}}")
    tots = [f"%tot{j}" for j in range(nr)]
    tys = ", ".join([vt] * nr)
    iters = ", ".join(f"{t} = %zero8" for t in tots)
    e(f"{r}%res:{nr} = scf.for %gc = %i0 to %i{chunks} step %i1 iter_args({iters}) -> ({tys}) {{")
    s = r + "  "
    e(f"{s}%kc = affine.apply affine_map<()[s0] -> (s0 * {chunk})>()[%gc]")
    e(f"{s}%bc = affine.apply affine_map<()[s0, s1] -> (s0 + s1 * {chunk // 2})>()[%kb, %gc]")
    part: dict[tuple[int, int], str | None] = {
        (j, h): None for j in range(nr) for h in range(chains)
    }
    for blk in range(blocks):
        e(f"{s}%b{blk} = affine.apply affine_map<()[s0] -> (s0 + {32 * blk})>()[%bc]")
        if g.prefetch:
            g.emit_prefetch(e, q_t, f"%b{blk}", s)
        for t in range(8):
            e(
                f"{s}%xo{blk}_{t} = affine.apply affine_map<()[s0] -> (s0 + {64 * blk + 8 * t})>()[%kc]"
            )
            if g.prepared_row:
                e(f"{s}%xa{blk}_{t} = arith.addi %ks, %xo{blk}_{t} : index")
                e(f"{s}%x{blk}_{t} = vector.load %ma[%mi, %xa{blk}_{t}] : {a_t}, {vt}")
            else:
                e(f"{s}%x{blk}_{t} = vector.load %xp[%xo{blk}_{t}] : {xp_t}, {vt}")
        for j in range(nr):
            e(f"{s}%qb{blk}_{j} = vector.load %mq[%n{j}, %b{blk}] : {q_t}, vector<32xi8>")
            e(f"{s}%qd{blk}_{j} = vector.bitcast %qb{blk}_{j} : vector<32xi8> to {it}")
            e(f"{s}%qx{blk}_{j} = arith.xori %qd{blk}_{j}, %xor : {it}")
            for t in range(8):
                m = f"%qm{blk}_{j}_{t}"
                if t == 7:
                    e(f"{s}{m} = arith.shrui %qx{blk}_{j}, %c28v : {it}")
                else:
                    e(f"{s}{m} = arith.andi %qx{blk}_{j}, %mask{t} : {it}")
                w = f"%w{blk}_{j}_{t}"
                e(f"{s}{w} = arith.sitofp {m} : {it} to {vt}")
                h = t % chains
                out, prev = f"%f{blk}_{j}_{t}", part[j, h]
                if prev is None:
                    e(f"{s}{out} = arith.mulf %x{blk}_{t}, {w} : {vt}")
                else:
                    e(f"{s}{out} = vector.fma %x{blk}_{t}, {w}, {prev} : {vt}")
                part[j, h] = out
    e(f"{s}%go = affine.apply affine_map<()[s0] -> (s0 * 8)>()[%gc]")
    if g.prepared_row:
        e(f"{s}%goa = arith.addi %xgbase, %go : index")
        e(f"{s}%xgv = vector.load %ma[%mi, %goa] : {a_t}, {vt}")
    else:
        e(f"{s}%xgv = vector.load %xg[%go] : {xg_t}, {vt}")
    # the chunk's groups: its own (groups of 64s), or two of 32 (lanes 0-3 and 4-7)
    per = 2 if group == 32 else 1
    e(f"{s}%gl = affine.apply affine_map<()[s0] -> (s0 * {per})>()[%gc]")
    e(f"{s}%ga = arith.addi %g0, %gl : index")
    spread = "[0, 0, 0, 0, 1, 1, 1, 1]"
    outs = []
    for j in range(nr):
        acc = tree_sum(e, s, [str(part[j, h]) for h in range(chains)], f"%pc{j}", vt)
        if group == 32:
            e(f"{s}%s2_{j} = vector.load %ms[%n{j}, %ga] : {s_t}, vector<2xf32>")
            e(
                f"{s}%sv{j} = vector.shuffle %s2_{j}, %s2_{j} {spread} : vector<2xf32>, vector<2xf32>"
            )
            if g.zero_point:
                e(f"{s}%z2_{j} = vector.load %nzb[%i{j}, %gl] : {zbuf_t}, vector<2xf32>")
                e(
                    f"{s}%zv{j} = vector.shuffle %z2_{j}, %z2_{j} {spread} : vector<2xf32>, vector<2xf32>"
                )
        else:
            e(f"{s}%s1_{j} = memref.load %ms[%n{j}, %ga] : {s_t}")
            e(f"{s}%sv{j} = vector.broadcast %s1_{j} : f32 to {vt}")
            if g.zero_point:
                e(f"{s}%z1_{j} = memref.load %nzb[%i{j}, %gl] : {zbuf_t}")
                e(f"{s}%zv{j} = vector.broadcast %z1_{j} : f32 to {vt}")
        zv = f"%zv{j}" if g.zero_point else "%m8v"
        e(f"{s}%cr{j} = vector.fma {zv}, %xgv, {acc} : {vt}")  # sum x (q + 8) - (z + 8) sum x
        e(f"{s}%nt{j} = vector.fma %sv{j}, %cr{j}, %tot{j} : {vt}")
        outs.append(f"%nt{j}")
    e(f"{s}scf.yield " + ", ".join(outs) + f" : {tys}")
    e(f"{r}}}")
    for j in range(nr):
        e(f"{r}%sum{j} = vector.reduction <add>, %res#{j} fastmath<reassoc> : {vt} into f32")
        out = f"%sum{j}"
        if accumulate:
            e(f"{r}%old{j} = memref.load %mc[%mi, %n{j}] : {c_t}")
            e(f"{r}%acc{j} = arith.addf %old{j}, %sum{j} : f32")
            out = f"%acc{j}"
        e(f"{r}memref.store {out}, %mc[%mi, %n{j}] : {c_t}")
    e(f"{p}}}")
