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
  and multiplied by ``16^-t`` (``t`` 1..6: exact, a power of two): ``xp[64 b + 8 t + i] =
  x[64 b + 8 i + t] * 16^-t``. So the FMA of nibble ``t`` with ``xp``'s ``t``-th vector adds
  ``x * (q + 8)``, the same product rounded the same way.
- Per group, ``sum x (q - z) = sum x (q + 8) - (z + 8) sum x``: the row's per-lane sums of
  ``x`` over each group (``xg``) are computed with the reordering, and the group's partial is
  corrected by one FMA with ``-(z + 8)`` (the block's zero points converted once, into a stack
  buffer) and scaled into the total by another. Groups of 32 share a load: lanes 0-3 are the
  first group, 4-7 the second, and the scale and zero-point vectors are per lane.

The partial sums run in ``chains`` accumulators per channel (nibbles ``t`` modulo ``chains``):
Zen 3's FMA latency is 4 cycles, and a single chain would wait on it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from .avx512_quant import Avx512QuantGemm

__all__ = ["MAX_K", "emit_masks_body", "masks_support"]

#: The largest ``K`` the form takes: the row's reordered activations and group sums live in a
#: stack buffer (``4.5 K`` bytes), within IREE's CPU stack allocation limit.
MAX_K = 4096
_XOR = -2004318072  # 0x88888888 as i32: q -> q + 8 in every nibble


def masks_support(k: int, bits: int, group: int | None, mr: int = 1) -> bool:
    """Whether ``nibble_masks`` applies: int4 in groups of 32 or of a multiple of 64, one row,
    ``K`` a multiple of 64 and at most :data:`MAX_K`."""
    return (
        bits == 4
        and group is not None
        and (group == 32 or (group > 0 and group % 64 == 0))
        and k % 64 == 0
        and k % group == 0
        and k <= MAX_K
        and mr == 1
    )


def _chunk(group: int) -> int:
    """The ``k`` per step of the group loop: a group, or two groups of 32 (one load)."""
    return max(group, 64)


def _tree_sum(e: Callable[[str], object], p: str, values: list[str], name: str, vt: str) -> str:
    """Emits the pairwise sum of ``values`` (names ``name_<i>``) and returns its name."""
    level = 0
    while len(values) > 1:
        nxt = []
        for i in range(0, len(values) - 1, 2):
            out = f"{name}_{level}_{i // 2}"
            e(f"{p}{out} = arith.addf {values[i]}, {values[i + 1]} : {vt}")
            nxt.append(out)
        if len(values) % 2:
            nxt.append(values[-1])
        values, level = nxt, level + 1
    return values[0]


def emit_masks_body(g: Avx512QuantGemm, e: Callable[[str], object], types: tuple[str, ...]) -> None:
    """The function body after the workgroup's ``%nbase`` / ``%m0`` / ``%mend`` (the frame of
    :mod:`.kernel_text`): per row of ``M`` the activations reordered once, then the
    workgroup's channels ``nr`` at a time."""
    a_t, q_t, s_t, _, c_t = types
    k, nr, nb, group, chains = g.k, g.nr, g.cols_per_workgroup, g.group, g.chains
    assert group is not None
    chunk = _chunk(group)
    chunks, blocks, groups = k // chunk, chunk // 64, g.groups
    zw = next(w for w in (16, 8, 4, 2, 1) if groups % w == 0)
    vt, it = "vector<8xf32>", "vector<8xi32>"
    xp_t, xg_t = f"memref<{k}xf32>", f"memref<{chunks * 8}xf32>"
    zbuf_t = f"memref<{nr}x{groups}xf32>"
    p = "      "
    e(f"{p}%xp = memref.alloca() : {xp_t}")
    e(f"{p}%xg = memref.alloca() : {xg_t}")
    if g.zero_point:
        e(f"{p}%nzb = memref.alloca() : {zbuf_t}")
    e(f"{p}%zero8 = arith.constant dense<0.0> : {vt}")
    e(f"{p}%m8v = arith.constant dense<-8.0> : {vt}")
    e(f"{p}%xor = arith.constant dense<{_XOR}> : {it}")
    e(f"{p}%c28v = arith.constant dense<28> : {it}")
    for t in range(7):
        e(f"{p}%mask{t} = arith.constant dense<{15 << (4 * t)}> : {it}")
    for t in range(1, 7):  # 16^-t, exact
        e(f"{p}%unit{t} = arith.constant dense<{2.0 ** (-4 * t)!r}> : {vt}")
    for c in sorted({0, 1, chunks, nr, nb, groups, zw} | set(range(nr))):
        e(f"{p}%i{c} = arith.constant {c} : index")

    # The row's activations in nibble order, scaled by 16^-t, and its per-lane group sums.
    e(f"{p}scf.for %mi = %m0 to %mend step %i1 {{")
    q = p + "  "
    e(f"{q}scf.for %rc = %i0 to %i{chunks} step %i1 {{")
    r = q + "  "
    e(f"{r}%rk = affine.apply affine_map<()[s0] -> (s0 * {chunk})>()[%rc]")
    sums = []
    for blk in range(blocks):
        e(f"{r}%rk{blk} = affine.apply affine_map<()[s0] -> (s0 + {64 * blk})>()[%rk]")
        e(f"{r}%xv{blk} = vector.load %ma[%mi, %rk{blk}] : {a_t}, vector<64xf32>")
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
            e(f"{r}vector.store {x}, %xp[%xo{blk}_{t}] : {xp_t}, {vt}")
        sums.append(_tree_sum(e, r, lanes, f"%ls{blk}", vt))
    total = _tree_sum(e, r, sums, "%lg", vt)
    e(f"{r}%go = affine.apply affine_map<()[s0] -> (s0 * 8)>()[%rc]")
    e(f"{r}vector.store {total}, %xg[%go] : {xg_t}, {vt}")
    e(f"{q}}}")

    e(f"{q}scf.for %nq = %i0 to %i{nb} step %i{nr} {{")
    r = q + "  "
    e(f"{r}%ncol = arith.addi %nbase, %nq : index")
    for j in range(nr):
        e(f"{r}%n{j} = arith.addi %ncol, %i{j} : index")
        if g.prefetch:  # the next block's row, clamped to N
            e(f"{r}%pn{j} = affine.min affine_map<()[s0] -> (s0 + {nr}, {g.n - 1})>()[%n{j}]")
    if g.zero_point:  # the block's -(z + 8) as f32, zw groups at a time
        zv, zf = f"vector<{zw}xi8>", f"vector<{zw}xf32>"
        e(f"{r}%m8z = arith.constant dense<-8.0> : {zf}")
        e(f"{r}scf.for %gz = %i0 to %i{groups} step %i{zw} {{")
        for j in range(nr):
            e(f"{r}  %zl{j} = vector.load %mz[%n{j}, %gz] : {types[3]}, {zv}")
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
    e(f"{s}%bc = affine.apply affine_map<()[s0] -> (s0 * {chunk // 2})>()[%gc]")
    part: dict[tuple[int, int], str | None] = {
        (j, h): None for j in range(nr) for h in range(chains)
    }
    for blk in range(blocks):
        e(f"{s}%b{blk} = affine.apply affine_map<()[s0] -> (s0 + {32 * blk})>()[%bc]")
        if g.prefetch:
            for j in range(nr):
                e(f"{s}memref.prefetch %mq[%pn{j}, %b{blk}], read, locality<3>, data : {q_t}")
        for t in range(8):
            e(
                f"{s}%xo{blk}_{t} = affine.apply affine_map<()[s0] -> (s0 + {64 * blk + 8 * t})>()[%kc]"
            )
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
    e(f"{s}%xgv = vector.load %xg[%go] : {xg_t}, {vt}")
    if group == 32:  # lanes 0-3: group 2c, lanes 4-7: group 2c + 1
        e(f"{s}%g2 = affine.apply affine_map<()[s0] -> (s0 * 2)>()[%gc]")
    spread = "[0, 0, 0, 0, 1, 1, 1, 1]"
    outs = []
    for j in range(nr):
        acc = _tree_sum(e, s, [str(part[j, h]) for h in range(chains)], f"%pc{j}", vt)
        if group == 32:
            e(f"{s}%s2_{j} = vector.load %ms[%n{j}, %g2] : {s_t}, vector<2xf32>")
            e(
                f"{s}%sv{j} = vector.shuffle %s2_{j}, %s2_{j} {spread} : vector<2xf32>, vector<2xf32>"
            )
            if g.zero_point:
                e(f"{s}%z2_{j} = vector.load %nzb[%i{j}, %g2] : {zbuf_t}, vector<2xf32>")
                e(
                    f"{s}%zv{j} = vector.shuffle %z2_{j}, %z2_{j} {spread} : vector<2xf32>, vector<2xf32>"
                )
        else:
            e(f"{s}%s1_{j} = memref.load %ms[%n{j}, %gc] : {s_t}")
            e(f"{s}%sv{j} = vector.broadcast %s1_{j} : f32 to {vt}")
            if g.zero_point:
                e(f"{s}%z1_{j} = memref.load %nzb[%i{j}, %gc] : {zbuf_t}")
                e(f"{s}%zv{j} = vector.broadcast %z1_{j} : f32 to {vt}")
        zv = f"%zv{j}" if g.zero_point else "%m8v"
        e(f"{s}%cr{j} = vector.fma {zv}, %xgv, {acc} : {vt}")  # sum x (q + 8) - (z + 8) sum x
        e(f"{s}%nt{j} = vector.fma %sv{j}, %cr{j}, %tot{j} : {vt}")
        outs.append(f"%nt{j}")
    e(f"{s}scf.yield " + ", ".join(outs) + f" : {tys}")
    e(f"{r}}}")
    for j in range(nr):
        e(f"{r}%sum{j} = vector.reduction <add>, %res#{j} fastmath<reassoc> : {vt} into f32")
        e(f"{r}memref.store %sum{j}, %mc[%mi, %n{j}] : {c_t}")
    e(f"{q}}}")
    e(f"{p}}}")
