"""The AMX weight-only quantized kernel for one row (a decode step's products): torchao's int8
(per channel) and int4 (per group) weights against f32 activations, with the integer products
on AMX-INT8 (docs/quantization.md, "Weight-only products on AMX").

``C[0, n] (f32) = sum_k A[0, k] * W[n, k]``, ``W`` as in :mod:`.avx512_quant` (int8: ``Q``, the
per-channel scale applied after the call by the program; int4: ``(Q - Z) * S`` per group).

The activations are f32, the weights integers: the row is written, exactly enough, as **three
int8 pieces under one scale**, ``x = sigma (P0 + P1 / 254 + P2 / 254^2)`` with ``sigma = max|x| /
127`` and each ``Pj = round(...)`` of the previous residual times 254 (22 bits of the row's
range: an error per element of about ``max|x| 2^-24``, f32's own rounding of the row's
largest element). The three pieces are three columns of AMX's ``B`` tile, so one
``tdpbssd`` / ``tdpbusd`` per 64 bytes of 16 channels' weights computes all three integer dot
products at once, exactly (int32), and they are combined in f32 at the end (int8) or per group
(int4): ``((D0 254 + D1) 254 + D2) sigma / 254^2``. A row with a NaN or an infinity gives NaN.

- **int8** (``Int8WeightOnlyConfig``): ``A`` is the weight itself, 16 channels x 64 bytes per
  ``tileloadd`` straight from the global (row stride ``K``): no instruction touches a weight
  byte besides that load.
- **int4** (``IntxWeightOnlyConfig``, groups of a multiple of 128): per 64 weight bytes (128
  ``k``) and 16 channels the bytes are xor'ed with ``0x88`` (``U = Q + 8``, 0..15)
  and split into the low nibbles (even ``k``) and the high ones (odd ``k``), two 16 x 64-byte
  tiles on the stack, multiplied (``tdpbusd``: unsigned x signed) with the pieces of the even
  and the odd activations. Per group the three sums ``D`` get ``8 * sum P`` subtracted
  (integers, exact: ``sum U P - 8 sum P = sum Q P``), are combined, and multiplied by the
  group's 16 scales (a gather) into an f32 accumulator. Zero points: ``sum_g S Z (sum_k x)``
  per channel, from its contiguous scale and zero-point rows, subtracted at the end.

Per workgroup (``cols_per_workgroup`` channels) the row's pieces are prepared once on the stack
(``3 K`` bytes in ``B``'s layout, the per-group sums); then 32 channels at a time (two ``C``
tiles) the reduction runs in steps of 64 (int8) or 128 (int4) ``k``, the weight lines a few
steps ahead software-prefetched; int4 is software-pipelined over its groups (the next step's A
tiles built while this step's products run, a group's sums combined while the next group's
run). ``K`` is limited by IREE's 32 KiB of stack: 8192 (int8), 4096 (int4: also its A tiles'
double buffer). Groups below 128, ``K`` beyond those and more than one row stay on the AVX-512
kernel (:mod:`.avx512_quant`), and so does int4 where the module's int4 weights do not fit in
half the host's L3 (:func:`int4_fits_cache`: streamed from memory, reading 64 bytes from each of
32 rows a step, this kernel ran 0.79x the AVX-512 one, which reads two rows at a time).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .amx import emit_permission_request, emit_tile_config, tile_asm
from .host import cpu_flags, host_l3_bytes
from .kernel_text import close_executable, open_executable, workgroup_block

__all__ = [
    "AMX_INT8_FEATURES",
    "QUANT_AMX_ENV",
    "AmxQuantGemm",
    "host_amx_int8_missing",
    "host_l3_bytes",
    "int4_fits_cache",
    "quant_amx_choice",
    "quant_amx_enabled",
]

#: The ``/proc/cpuinfo`` flags the kernel needs: the tile registers and the int8 tile products
#: (and AVX-512 for the preparation and the epilogue).
AMX_INT8_FEATURES = ("avx512f", "amx_tile", "amx_int8")

#: ``TURBINE_CPU_QUANT_AMX=off`` keeps one-row weight-only products on the AVX-512 kernel
#: (:mod:`.avx512_quant`) where AMX-INT8 would take them (for A/B measurements).
QUANT_AMX_ENV = "TURBINE_CPU_QUANT_AMX"

_MAX_K = {8: 8192, 4: 4096}
#: Steps of software prefetch ahead (docs/quantization.md: 1.05-1.10x on a 110M Llama's decode)
_PREFETCH = 4
_PIECE = 254  # the pieces' radix (|P| <= 127: the residual of a rounding times 254)
_SIGMA = 127 * _PIECE * _PIECE  # max|x| / this = sigma / 254^2


def host_amx_int8_missing() -> list[str]:
    """The features of :data:`AMX_INT8_FEATURES` this machine's CPU lacks (empty: none)."""
    flags = cpu_flags()
    return [f for f in AMX_INT8_FEATURES if f not in flags]


def quant_amx_choice() -> str:
    """``TURBINE_CPU_QUANT_AMX``: ``"off"`` (the AVX-512 kernel for everything), ``"on"``
    (int4 on AMX whatever its size, for A/B measurements) or ``"auto"`` (unset: int8 on AMX,
    int4 where the module's int4 weights fit the cache, :func:`int4_fits_cache`)."""
    value = os.environ.get(QUANT_AMX_ENV, "").strip().lower()
    if value in ("off", "0", "no", "avx512"):
        return "off"
    return "on" if value in ("on", "1", "yes", "all") else "auto"


def quant_amx_enabled() -> bool:
    """Whether one-row weight-only products may go to this kernel: the host has AMX-INT8 and
    ``TURBINE_CPU_QUANT_AMX`` is not ``off``."""
    return quant_amx_choice() != "off" and not host_amx_int8_missing()


def int4_fits_cache(weight_bytes: int) -> bool:
    """Whether a module's ``weight_bytes`` of int4 weights go to the AMX kernel by default: when
    they fit in half the host's L3 (read from sysfs; unknown: no). Streamed from memory the
    AMX int4 kernel's reads (64 bytes from each of 32 rows a step) ran 0.79x the AVX-512
    kernel's (two rows at a time, sequential); from the cache 1.07-1.25x (docs/quantization.md).
    int8 has no such split: its tiles load the weight rows directly, 1.41-1.47x either way."""
    l3 = host_l3_bytes()
    return l3 > 0 and weight_bytes <= l3 // 2


@dataclass(frozen=True)
class AmxQuantGemm:
    """One weight-only quantized matmul executable for static ``k`` and ``n`` and one row.

    Attributes:
        k, n: the reduction and the output channels.
        bits: 8 (per channel, no scales in the kernel) or 4 (grouped).
        group: the int4 group size (``None`` for int8).
        zero_point: the int4 weight has zero points.
        cols_per_workgroup: channels per workgroup (a multiple of 32 dividing ``n``).
        request_permission: each workgroup asks Linux for the tile state (as
            :class:`.amx.AmxGemm`'s), so the module runs under IREE's own tools too.
        prefetch: software-prefetch the weight rows' lines this many steps ahead (0: none).
    """

    k: int
    n: int
    bits: int = 8
    group: int | None = None
    zero_point: bool = False
    cols_per_workgroup: int = 128
    request_permission: bool = True
    prefetch: int = _PREFETCH

    @staticmethod
    def supports(k: int, n: int, bits: int, group: int | None) -> bool:
        """Whether the kernel handles the shape: ``N`` a multiple of 32, ``K`` of 64 (int8, up
        to 8192) or 128 (int4, up to 4096); int8 per channel, int4 in groups of 128s."""
        if n <= 0 or n % 32 or k <= 0 or k > _MAX_K.get(bits, 0):
            return False
        if bits == 8:
            return group is None and k % 64 == 0
        if bits != 4 or group is None or k % 128 or k % group:
            return False
        return group % 128 == 0

    @staticmethod
    def for_shape(k: int, n: int, bits: int, group: int | None, zero_point: bool) -> AmxQuantGemm:
        """The kernel turbine uses for the shape: two workgroups (the widest multiple of 32
        channels dividing ``N`` into at least two), one per worker of a two-core machine.
        Each workgroup prepares the row's pieces and pays the tile products' start-up: on a
        110M Llama's decode two workgroups a product ran 1.08-1.13x four, and the LM head in
        two 1.04x in 40 (docs/quantization.md)."""
        cols = max(c for c in range(32, max(32, n // 2) + 1, 32) if n % c == 0)
        return AmxQuantGemm(k, n, bits, group, zero_point, cols_per_workgroup=cols)

    def __post_init__(self) -> None:
        if not self.supports(self.k, self.n, self.bits, self.group):
            raise ValueError(f"AMX quantized kernel: unsupported shape {self}")
        nb = self.cols_per_workgroup
        if nb % 32 or self.n % nb:
            raise ValueError(f"AMX quantized kernel: bad workgroup columns: {self}")
        if self.zero_point and self.bits != 4:
            raise ValueError(f"AMX quantized kernel: zero points are int4's: {self}")

    @property
    def k_bytes(self) -> int:
        """The bytes of one output channel's weights."""
        return self.k if self.bits == 8 else self.k // 2

    @property
    def groups(self) -> int:
        return self.k // self.group if self.group else 0

    @property
    def name(self) -> str:
        g = f"_g{self.group}{'z' if self.zero_point else ''}" if self.group else ""
        perm = "" if self.request_permission else "_noperm"
        pf = "" if self.prefetch == _PREFETCH else f"_pf{self.prefetch}"
        return f"__turbine_amx_i{self.bits}_gemv_{self.k}x{self.n}{g}_{self.cols_per_workgroup}{perm}{pf}"

    def operand_types(self) -> list[str]:
        """The builtin tensor types of the weight operands (after ``A``), as
        :class:`.avx512_quant.Avx512QuantGemm`'s."""
        types = [f"tensor<{self.n}x{self.k_bytes}xi8>"]
        if self.group:
            types.append(f"tensor<{self.n}x{self.groups}xf32>")
            if self.zero_point:
                types.append(f"tensor<{self.n}x{self.groups}xi8>")
        return types

    def dispatch(self, a: str, weights: list[str], m: str) -> str:
        """The ``flow.dispatch`` of this kernel (result ``tensor<?xNxf32>``; one workgroup row
        per row of ``M``, each row computed on its own)."""
        a_t = f"tensor<?x{self.k}xf32>{{{m}}}"
        operands = ", ".join([a, *weights, m])
        types = ", ".join([a_t, *self.operand_types(), "index"])
        return (
            f"flow.dispatch @{self.name}::@{self.name}[{m}]({operands}) : ({types}) -> "
            f"tensor<?x{self.n}xf32>{{{m}}}"
        )

    # -- the executable ---------------------------------------------------------------------

    def _tile_words(self) -> list[int | None]:
        """The tile configuration. int8: tiles 0-1 ``C`` (16 x 12 bytes), 2 ``B`` (16 x 12),
        3-4 ``A`` (16 x 64). int4: 0-1 ``C``, 2-3 ``B`` (even / odd ``k``: 16 x 12), 4-7 ``A``
        (channels 0-15 even / odd, 16-31 even / odd: 16 x 64)."""

        def colsb(*c: int) -> int:
            return sum(v << (16 * i) for i, v in enumerate(c))

        def rows(*r: int) -> int:
            return sum(v << (8 * i) for i, v in enumerate(r))

        if self.bits == 8:
            return [1, 0, colsb(12, 12, 12, 64), colsb(64), 0, 0, rows(16, 16, 16, 16, 16), 0]
        return [1, 0, colsb(12, 12, 12, 12), colsb(64, 64, 64, 64), 0, 0, rows(*[16] * 8), 0]

    def executable(self) -> str:
        """The ``stream.executable`` (MLIR text) for a module's top level."""
        k, n, nb = self.k, self.n, self.cols_per_workgroup
        a_t, c_t = f"memref<?x{k}xf32>", f"memref<?x{n}xf32>"
        q_t = f"memref<{n}x{self.k_bytes}xi8>"
        s_t, z_t = f"memref<{n}x{self.groups}xf32>", f"memref<{n}x{self.groups}xi8>"
        out: list[str] = []
        e = out.append
        name = self.name
        bindings = ["%a", "%q"]
        if self.group:
            bindings.append("%s")
            if self.zero_point:
                bindings.append("%z")
        bindings.append("%c")
        open_executable(
            e,
            name,
            column_blocks=n // nb,
            rows_per_workgroup=1,
            bindings=bindings,
            constants={0, 1, 16, 32, 48, 64, 128, nb, k, k // 64, self.groups or 1},
        )
        if self.prefetch:
            e(f"      %c{self.prefetch}pf = arith.constant {self.prefetch} : index")
            e(f"      %c{self.k_bytes // 64}st = arith.constant {self.k_bytes // 64} : index")
        e(f"      %ma = stream.binding.subspan %a[%c0] : !stream.binding -> {a_t}{{%m}}")
        e(f"      %mq = stream.binding.subspan %q[%c0] : !stream.binding -> {q_t}")
        if self.group:
            e(f"      %ms = stream.binding.subspan %s[%c0] : !stream.binding -> {s_t}")
            if self.zero_point:
                e(f"      %mz = stream.binding.subspan %z[%c0] : !stream.binding -> {z_t}")
        e(f"      %mc = stream.binding.subspan %c[%c0] : !stream.binding -> {c_t}{{%m}}")
        _address(e, "q", "%mq", q_t, "i8", 1, 2)
        emit_tile_config(e, self._tile_words())
        if self.request_permission:
            emit_permission_request(e)
        workgroup_block(e, cols_per_workgroup=nb, rows_per_workgroup=1, column_base="%nbase")
        e("      " + tile_asm("ldtilecfg ($0)", "r,~{memory}", ["%cfgp64"]))
        self._prefetch_head(e, "      ")
        self._prepare(e, a_t)
        if self.bits == 8:
            self._int8_blocks(e, c_t)
        else:
            self._int4_blocks(e, c_t, s_t, z_t)
        e("      " + tile_asm("tilerelease", "", []))
        close_executable(e)
        return "\n".join(out)

    def _prefetch(self, e, p: str, step: str, tag: str) -> None:
        """Software prefetch of the 32 weight rows' line ``prefetch`` steps after ``step``
        (index) of the block at ``%n0`` (past the rows' end: the next block's first lines).
        A block's tile loads are 16 lines from 16 rows each: without it the products wait on
        each load's latency (measured: most of a one-block workgroup's time)."""
        rb, steps = self.k_bytes, self.k_bytes // 64
        d = self.prefetch
        e(f"{p}%pu{tag} = arith.addi {step}, %c{d}pf : index")
        e(f"{p}%plt{tag} = arith.cmpi ult, %pu{tag}, %c{steps}st : index")
        e(
            f"{p}%poi{tag} = affine.apply affine_map<()[s0, s1] -> (s0 * {rb} + s1 * 64)>()"
            f"[%n0, %pu{tag}]"
        )
        e(
            f"{p}%pon{tag} = affine.apply affine_map<()[s0, s1] -> "
            f"((s0 + 32) * {rb} + s1 * 64 - {64 * steps})>()[%n0, %pu{tag}]"
        )
        e(f"{p}%po{tag} = arith.select %plt{tag}, %poi{tag}, %pon{tag} : index")
        e(f"{p}%po64{tag} = arith.index_cast %po{tag} : index to i64")
        e(f"{p}%pbase{tag} = arith.addi %qaddr, %po64{tag} : i64")
        for j in range(32):
            e(f"{p}%pr{tag}_{j} = arith.constant {j * rb} : i64")
            e(f"{p}%pa{tag}_{j} = arith.addi %pbase{tag}, %pr{tag}_{j} : i64")
            e(f"{p}" + tile_asm("prefetcht0 ($0)", "r,~{memory}", [f"%pa{tag}_{j}"]))

    def _prefetch_head(self, e, p: str) -> None:
        """At the workgroup's start: the first ``prefetch`` steps of its first block."""
        if not self.prefetch:
            return
        rb = self.k_bytes
        e(f"{p}%phb = arith.index_cast %nbase : index to i64")
        e(f"{p}%phr = arith.constant {rb} : i64")
        e(f"{p}%pho = arith.muli %phb, %phr : i64")
        e(f"{p}%phbase = arith.addi %qaddr, %pho : i64")
        for u in range(min(self.prefetch, rb // 64)):
            for j in range(32):
                e(f"{p}%ph_{u}_{j} = arith.constant {j * rb + 64 * u} : i64")
                e(f"{p}%pha_{u}_{j} = arith.addi %phbase, %ph_{u}_{j} : i64")
                e(f"{p}" + tile_asm("prefetcht0 ($0)", "r,~{memory}", [f"%pha_{u}_{j}"]))

    def _prepare(self, e, a_t: str) -> None:
        """The row's pieces in ``B``'s layout on the stack (``%xb``, address ``%xbaddr``), the
        factor ``%fac`` (``sigma / 254^2``), ``%nanfix`` (0, or NaN for a row with a NaN or an
        infinity) and, int4, the sums of the pieces per step (``%spk``) and per group (``%spg``,
        ``[groups, 3]``) and their combination (``%spc``, ``[groups]``), all f32.

        A row whose largest magnitude is below 3.7e-37 (where ``127 / max|x|`` overflows)
        gives zeros: an absolute error below 1e-33 per output."""
        k, p = self.k, "      "
        v64 = "vector<64xf32>"
        xb_n = k // 64 * 48  # 48 dwords (16 rows x 3 pieces) per 64 k
        e(f"{p}%xb = " + _aligned_alloca(f"memref<{xb_n}xi32>"))
        _address(e, "xb", "%xb", f"memref<{xb_n}xi32>", "i32", 4, 1)
        cb_t = f"memref<{96 if self.bits == 8 else 192}xi32>"
        e(f"{p}%cb = " + _aligned_alloca(cb_t))
        _address(e, "cb", "%cb", cb_t, "i32", 4, 1)
        e(f"{p}%z64 = arith.constant dense<0.0> : {v64}")
        e(f"{p}%r254 = arith.constant dense<{float(_PIECE)}> : {v64}")
        e(f"{p}%mi = arith.addi %m0, %c0 : index")
        # max |x| (NaN if there is one)
        e(f"{p}%amv = scf.for %k = %c0 to %c{k} step %c64 iter_args(%acc = %z64) -> ({v64}) {{")
        e(f"{p}  %v = vector.load %ma[%mi, %k] : {a_t}, {v64}")
        e(f"{p}  %av = math.absf %v : {v64}")
        e(f"{p}  %mx = arith.maximumf %acc, %av : {v64}")
        e(f"{p}  scf.yield %mx : {v64}")
        e(f"{p}}}")
        e(f"{p}%amax = vector.reduction <maximumf>, %amv : {v64} into f32")
        e(f"{p}%f0 = arith.constant 0.0 : f32")
        e(f"{p}%finf = arith.constant 0x7F800000 : f32")
        e(f"{p}%f127 = arith.constant 127.0 : f32")
        e(f"{p}%fsig = arith.constant {float(_SIGMA)} : f32")
        e(f"{p}%pos = arith.cmpf ogt, %amax, %f0 : f32")
        e(f"{p}%fin = arith.cmpf olt, %amax, %finf : f32")
        e(f"{p}%ok = arith.andi %pos, %fin : i1")
        e(f"{p}%inv0 = arith.divf %f127, %amax : f32")
        # max|x| below 127 / FLT_MAX (3.7e-37): 127 / max|x| overflows; such a row gives zeros
        e(f"{p}%invfin = arith.cmpf olt, %inv0, %finf : f32")
        e(f"{p}%ok2 = arith.andi %ok, %invfin : i1")
        e(f"{p}%inv = arith.select %ok2, %inv0, %f0 : f32")
        e(f"{p}%invb = vector.broadcast %inv : f32 to {v64}")
        e(f"{p}%nanfix = arith.subf %amax, %amax : f32")
        e(f"{p}%fac = arith.divf %amax, %fsig : f32")
        if self.bits == 4:
            groups, steps = self.groups, self.k // 128
            e(f"{p}%spk = memref.alloca() : memref<{steps}x3xf32>")
            e(f"{p}%spg = memref.alloca() : memref<{groups}x3xf32>")
            e(f"{p}%spc = memref.alloca() : memref<{groups}xf32>")
        # the pieces, 64 k at a time; int4: the step's 128 k de-interleaved (even, then odd)
        if self.bits == 8:
            e(f"{p}scf.for %k = %c0 to %c{k} step %c64 {{")
            e(f"{p}  %v = vector.load %ma[%mi, %k] : {a_t}, {v64}")
            self._pieces(e, "%v", p + "  ", "%k", 0)
            e(f"{p}}}")
            return
        e(f"{p}scf.for %k = %c0 to %c{k} step %c128 {{")
        e(f"{p}  %v = vector.load %ma[%mi, %k] : {a_t}, vector<128xf32>")
        for h, name in ((0, "%ve"), (1, "%vo")):
            mask = ", ".join(str(2 * i + h) for i in range(64))
            e(f"{p}  {name} = vector.shuffle %v, %v [{mask}] : vector<128xf32>, vector<128xf32>")
            self._pieces(e, name, p + "  ", "%k", h)
        self._chunk_sums(e, p + "  ")
        e(f"{p}}}")
        self._group_sums(e, p)

    def _pieces(self, e, v: str, p: str, k: str, half: int) -> None:
        """The three pieces of the 64 values ``v`` stored as 16 ``B`` rows of 3 dwords
        (``xb[48 j + 3 r + c]`` = the 4 bytes of piece ``c`` for ``k`` 4r..4r+3 of block
        ``j``; int4: block ``2 * (k / 128) + half``)."""
        v64, i64v = "vector<64xf32>", "vector<64xi32>"
        t = f"{half}"
        e(f"{p}%vs{t} = arith.mulf {v}, %invb : {v64}")
        e(f"{p}%p0_{t} = math.roundeven %vs{t} : {v64}")
        e(f"{p}%d1_{t} = arith.subf %vs{t}, %p0_{t} : {v64}")
        e(f"{p}%r1_{t} = arith.mulf %d1_{t}, %r254 : {v64}")
        e(f"{p}%p1_{t} = math.roundeven %r1_{t} : {v64}")
        e(f"{p}%d2_{t} = arith.subf %r1_{t}, %p1_{t} : {v64}")
        e(f"{p}%r2_{t} = arith.mulf %d2_{t}, %r254 : {v64}")
        e(f"{p}%p2_{t} = math.roundeven %r2_{t} : {v64}")
        for j in range(3):
            e(f"{p}%i{j}_{t} = arith.fptosi %p{j}_{t} : {v64} to {i64v}")
            e(f"{p}%b{j}_{t} = arith.trunci %i{j}_{t} : {i64v} to vector<64xi8>")
            e(f"{p}%w{j}_{t} = vector.bitcast %b{j}_{t} : vector<64xi8> to vector<16xi32>")
        ident = ", ".join(str(i) for i in range(32))
        e(
            f"{p}%w01_{t} = vector.shuffle %w0_{t}, %w1_{t} [{ident}] : "
            "vector<16xi32>, vector<16xi32>"
        )
        e(
            f"{p}%w22_{t} = vector.shuffle %w2_{t}, %w2_{t} [{ident}] : "
            "vector<16xi32>, vector<16xi32>"
        )
        mask = ", ".join(str(16 * c + r) for r in range(16) for c in range(3))
        e(
            f"{p}%bt{t} = vector.shuffle %w01_{t}, %w22_{t} [{mask}] : "
            "vector<32xi32>, vector<32xi32>"
        )
        if self.bits == 8:
            e(f"{p}%xo{t} = affine.apply affine_map<()[s0] -> (s0 * 48 floordiv 64)>()[{k}]")
        else:
            e(
                f"{p}%xo{t} = affine.apply affine_map<()[s0] -> (s0 * 96 floordiv 128 + {48 * half})>()"
                f"[{k}]"
            )
        xb_n = self.k // 64 * 48
        e(f"{p}vector.store %bt{t}, %xb[%xo{t}] : memref<{xb_n}xi32>, vector<48xi32>")

    def _chunk_sums(self, e, p: str) -> None:
        """int4, inside the step loop after both halves' pieces: the sums of each piece over
        the step's 128 ``k`` (even and odd values together), in ``%spk[step, c]`` (f32:
        integers below 2^24, exact)."""
        steps = self.k // 128
        e(f"{p}%pck = affine.apply affine_map<()[s0] -> (s0 floordiv 128)>()[%k]")
        for c in range(3):
            e(f"{p}%ps{c} = arith.addf %p{c}_0, %p{c}_1 : vector<64xf32>")
            e(f"{p}%psr{c} = vector.reduction <add>, %ps{c} : vector<64xf32> into f32")
            e(f"{p}%pci{c} = arith.constant {c} : index")
            e(f"{p}memref.store %psr{c}, %spk[%pck, %pci{c}] : memref<{steps}x3xf32>")

    def _group_sums(self, e, p: str) -> None:
        """int4: ``%spg[g, c]`` = the sum of piece ``c`` over group ``g`` (its steps'), and
        ``%spc[g]`` = ``(spg0 254 + spg1) 254 + spg2``."""
        group, groups = self.group, self.groups
        assert group is not None
        steps, parts = self.k // 128, group // 128
        e(f"{p}%f254 = arith.constant {float(_PIECE)} : f32")
        e(f"{p}scf.for %g = %c0 to %c{groups} step %c1 {{")
        q = p + "  "
        tot = []
        for c in range(3):
            e(f"{q}%gi{c} = arith.constant {c} : index")
            cur = None
            for part in range(parts):
                t = f"{c}_{part}"
                e(f"{q}%gk{t} = affine.apply affine_map<()[s0] -> (s0 * {parts} + {part})>()[%g]")
                e(f"{q}%gv{t} = memref.load %spk[%gk{t}, %gi{c}] : memref<{steps}x3xf32>")
                if cur is None:
                    cur = f"%gv{t}"
                else:
                    e(f"{q}%gt{t} = arith.addf {cur}, %gv{t} : f32")
                    cur = f"%gt{t}"
            assert cur is not None
            e(f"{q}memref.store {cur}, %spg[%g, %gi{c}] : memref<{groups}x3xf32>")
            tot.append(cur)
        e(f"{q}%gcomb0 = math.fma {tot[0]}, %f254, {tot[1]} : f32")
        e(f"{q}%gcomb = math.fma %gcomb0, %f254, {tot[2]} : f32")
        e(f"{q}memref.store %gcomb, %spc[%g] : memref<{groups}xf32>")
        e(f"{p}}}")

    def _combine(self, e, p: str, t: int, tag: str) -> list[str]:
        """Loads ``C`` tile ``t`` (stored at ``%cb[48 t]``) and returns the three pieces' sums
        as ``vector<16xi32>`` values (de-interleaved: lane ``i`` is channel ``i``)."""
        e(f"{p}%cbo{tag} = arith.constant {48 * t} : index")
        e(f"{p}%cv{tag} = vector.load %cb[%cbo{tag}] : memref<96xi32>, vector<48xi32>")
        names = []
        for c in range(3):
            mask = ", ".join(str(3 * i + c) for i in range(16))
            e(
                f"{p}%cd{tag}_{c} = vector.shuffle %cv{tag}, %cv{tag} [{mask}] : "
                "vector<48xi32>, vector<48xi32>"
            )
            names.append(f"%cd{tag}_{c}")
        return names

    def _int8_blocks(self, e, c_t: str) -> None:
        k, nb, p = self.k, self.cols_per_workgroup, "      "
        vt = "vector<16xf32>"
        consts = {"sk": k, "s12": 12, "k16": 16 * k, "b192": 192, "b64i": 64}
        for name, value in consts.items():
            e(f"{p}%{name} = arith.constant {value} : i64")
        e(f"{p}%f254v = arith.constant dense<{float(_PIECE)}> : {vt}")
        e(f"{p}%facb = vector.broadcast %fac : f32 to {vt}")
        e(f"{p}%nanb = vector.broadcast %nanfix : f32 to {vt}")
        e(f"{p}scf.for %nq = %c0 to %c{nb} step %c32 {{")
        q = p + "  "
        e(f"{q}%n0 = arith.addi %nbase, %nq : index")
        e(f"{q}%n064 = arith.index_cast %n0 : index to i64")
        e(f"{q}%qo = arith.muli %n064, %sk : i64")
        e(f"{q}%qr0 = arith.addi %qaddr, %qo : i64")
        e(f"{q}%qr1 = arith.addi %qr0, %k16 : i64")
        e(f"{q}" + tile_asm("tilezero %tmm0", "", []))
        e(f"{q}" + tile_asm("tilezero %tmm1", "", []))
        e(f"{q}scf.for %s = %c0 to %c{k // 64} step %c1 {{")
        r = q + "  "
        e(f"{r}%s64 = arith.index_cast %s : index to i64")
        e(f"{r}%ko = arith.muli %s64, %b64i : i64")
        e(f"{r}%bo = arith.muli %s64, %b192 : i64")
        if self.prefetch:
            self._prefetch(e, r, "%s", "8")
        e(f"{r}%pb = arith.addi %xbaddr, %bo : i64")
        e(f"{r}%pa0 = arith.addi %qr0, %ko : i64")
        e(f"{r}%pa1 = arith.addi %qr1, %ko : i64")
        ld = "tileloadd ($0,$1,1), %tmm{}"
        e(f"{r}" + tile_asm(ld.format(2), "r,r,~{memory}", ["%pb", "%s12"]))
        e(f"{r}" + tile_asm(ld.format(3), "r,r,~{memory}", ["%pa0", "%sk"]))
        e(f"{r}" + tile_asm("tdpbssd %tmm2, %tmm3, %tmm0", "", []))
        e(f"{r}" + tile_asm(ld.format(4), "r,r,~{memory}", ["%pa1", "%sk"]))
        e(f"{r}" + tile_asm("tdpbssd %tmm2, %tmm4, %tmm1", "", []))
        e(f"{q}}}")
        e(f"{q}%cb1 = arith.addi %cbaddr, %b192 : i64")
        e(f"{q}" + tile_asm("tilestored %tmm0, ($0,$1,1)", "r,r,~{memory}", ["%cbaddr", "%s12"]))
        e(f"{q}" + tile_asm("tilestored %tmm1, ($0,$1,1)", "r,r,~{memory}", ["%cb1", "%s12"]))
        for t in range(2):
            d = self._combine(e, q, t, f"{t}")
            f = []
            for c in range(3):
                e(f"{q}%cf{t}_{c} = arith.sitofp {d[c]} : vector<16xi32> to {vt}")
                f.append(f"%cf{t}_{c}")
            e(f"{q}%e{t}a = math.fma {f[0]}, %f254v, {f[1]} : {vt}")
            e(f"{q}%e{t}b = math.fma %e{t}a, %f254v, {f[2]} : {vt}")
            e(f"{q}%o{t} = math.fma %e{t}b, %facb, %nanb : {vt}")
            e(f"{q}%nc{t} = arith.addi %n0, %c{16 * t} : index")
            e(f"{q}vector.store %o{t}, %mc[%mi, %nc{t}] : {c_t}, {vt}")
        e(f"{p}}}")

    def _int4_blocks(self, e, c_t: str, s_t: str, z_t: str) -> None:
        """int4, 32 channels at a time, software-pipelined over the groups: iteration ``g``
        issues group ``g``'s tile products (the A tiles of each step built, on the other half
        of a double buffer, while the previous step's products run), then combines group
        ``g - 1``'s sums (stored from the C tiles at the end of the previous iteration), then
        stores group ``g``'s: the AVX-512 work of one group overlaps the tile work of the
        next instead of waiting for it."""
        nb, p = self.cols_per_workgroup, "      "
        groups = self.groups
        vt = "vector<16xf32>"
        # the A tiles' stack buffers: [buffer 0/1][channel block 0/1][even/odd][16 rows][64 B]
        e(f"{p}%ab = " + _aligned_alloca("memref<8192xi8>"))
        _address(e, "ab", "%ab", "memref<8192xi8>", "i8", 1, 1)
        consts = {"s12": 12, "s64": 64, "b192": 192, "b384": 384, "c1k": 1024, "c2k": 2048}
        for name, value in consts.items():
            e(f"{p}%{name} = arith.constant {value} : i64")
        e(f"{p}%f254v = arith.constant dense<{float(_PIECE)}> : {vt}")
        e(f"{p}%facb = vector.broadcast %fac : f32 to {vt}")
        e(f"{p}%nanb = vector.broadcast %nanfix : f32 to {vt}")
        e(f"{p}%x88 = arith.constant dense<-120> : vector<64xi8>")  # 0x88
        e(f"{p}%m0f = arith.constant dense<15> : vector<64xi8>")
        e(f"{p}%sh4 = arith.constant dense<4> : vector<64xi8>")
        e(f"{p}%zv16 = arith.constant dense<0.0> : {vt}")
        e(f"{p}%c8f = arith.constant 8.0 : f32")
        e(f"{p}%gmask = arith.constant dense<true> : vector<16xi1>")
        lanes = ", ".join(str(groups * i) for i in range(16))
        e(f"{p}%gidx = arith.constant dense<[{lanes}]> : vector<16xi32>")
        e(
            f"{p}%ms1 = memref.collapse_shape %ms [[0, 1]] : {s_t} into "
            f"memref<{self.n * groups}xf32>"
        )
        e(f"{p}%cgroups = arith.constant {groups} : index")
        e(f"{p}%csteps = arith.constant {self.k // 128} : index")
        e(f"{p}scf.for %nq = %c0 to %c{nb} step %c32 {{")
        q = p + "  "
        e(f"{q}%n0 = arith.addi %nbase, %nq : index")
        self._abuild(e, q, "%c0", "p")  # step 0's A tiles, buffer 0
        self._group_tiles(e, q, "%c0", "p")
        self._store_sums(e, q, "%c0", "p")
        e(
            f"{q}%res:2 = scf.for %g = %c1 to %cgroups step %c1 "
            f"iter_args(%acc0 = %zv16, %acc1 = %zv16) -> ({vt}, {vt}) {{"
        )
        r = q + "  "
        e(f"{r}%gp = arith.subi %g, %c1 : index")
        self._group_tiles(e, r, "%g", "l")
        outs = self._extract(e, r, "%gp", ["%acc0", "%acc1"], "l")
        self._store_sums(e, r, "%g", "l")
        e(f"{r}scf.yield {', '.join(outs)} : {vt}, {vt}")
        e(f"{q}}}")
        e(f"{q}%glast = arith.subi %cgroups, %c1 : index")
        final = self._extract(e, q, "%glast", ["%res#0", "%res#1"], "e")
        for t in range(2):
            res = final[t]
            if self.zero_point:
                res = self._zero_point_term(e, q, t, res, s_t, z_t)
            e(f"{q}%o{t} = math.fma {res}, %facb, %nanb : {vt}")
            e(f"{q}%nc{t} = arith.addi %n0, %c{16 * t} : index")
            e(f"{q}vector.store %o{t}, %mc[%mi, %nc{t}] : {c_t}, {vt}")
        e(f"{p}}}")

    def _abuild(self, e, p: str, step: str, tag: str) -> None:
        """The A tiles of 128-``k`` step ``step`` (index) for the block's 32 channels, into
        buffer ``step mod 2``: the weight bytes xor 0x88 (``U = Q + 8``), low nibbles (even
        ``k``) and high ones (odd ``k``), a 64-byte tile row per channel."""
        kb = self.k // 2
        e(f"{p}%abb{tag} = affine.apply affine_map<()[s0] -> (s0 * 64)>()[{step}]")
        e(f"{p}%abo{tag} = affine.apply affine_map<()[s0] -> ((s0 mod 2) * 4096)>()[{step}]")
        for j in range(32):
            e(f"{p}%nj{tag}_{j} = affine.apply affine_map<()[s0] -> (s0 + {j})>()[%n0]")
            e(
                f"{p}%wb{tag}_{j} = vector.load %mq[%nj{tag}_{j}, %abb{tag}] : "
                f"memref<{self.n}x{kb}xi8>, vector<64xi8>"
            )
            e(f"{p}%wu{tag}_{j} = arith.xori %wb{tag}_{j}, %x88 : vector<64xi8>")
            e(f"{p}%wl{tag}_{j} = arith.andi %wu{tag}_{j}, %m0f : vector<64xi8>")
            e(f"{p}%wh{tag}_{j} = arith.shrui %wu{tag}_{j}, %sh4 : vector<64xi8>")
            blk, row = divmod(j, 16)
            for h, val in ((0, "wl"), (1, "wh")):
                off = (blk * 2 + h) * 1024 + row * 64
                e(
                    f"{p}%ao{tag}_{j}_{h} = affine.apply affine_map<()[s0] -> (s0 + {off})>()"
                    f"[%abo{tag}]"
                )
                e(
                    f"{p}vector.store %{val}{tag}_{j}, %ab[%ao{tag}_{j}_{h}] : "
                    "memref<8192xi8>, vector<64xi8>"
                )

    def _group_tiles(self, e, p: str, g: str, tag: str) -> None:
        """Group ``g``'s tile products into C tiles 0 and 1 (zeroed first); each step's
        products read its A tiles (buffer ``step mod 2``) while the next step's are built."""
        group = self.group
        assert group is not None
        parts = group // 128
        e(f"{p}" + tile_asm("tilezero %tmm0", "", []))
        e(f"{p}" + tile_asm("tilezero %tmm1", "", []))
        for part in range(parts):
            t = f"{tag}{part}"
            e(f"{p}%st{t} = affine.apply affine_map<()[s0] -> (s0 * {parts} + {part})>()[{g}]")
            e(f"{p}%st64{t} = arith.index_cast %st{t} : index to i64")
            e(f"{p}%bo{t} = arith.muli %st64{t}, %b384 : i64")
            e(f"{p}%pbe{t} = arith.addi %xbaddr, %bo{t} : i64")
            e(f"{p}%pbo{t} = arith.addi %pbe{t}, %b192 : i64")
            e(f"{p}%abs{t} = affine.apply affine_map<()[s0] -> ((s0 mod 2) * 4096)>()[%st{t}]")
            e(f"{p}%abs64{t} = arith.index_cast %abs{t} : index to i64")
            e(f"{p}%pa{t} = arith.addi %abaddr, %abs64{t} : i64")
            e(f"{p}%pa{t}_1 = arith.addi %pa{t}, %c1k : i64")
            e(f"{p}%pa{t}_2 = arith.addi %pa{t}, %c2k : i64")
            e(f"{p}%pa{t}_3 = arith.addi %pa{t}_2, %c1k : i64")
            ld = "tileloadd ($0,$1,1), %tmm{}"
            e(f"{p}" + tile_asm(ld.format(2), "r,r,~{memory}", [f"%pbe{t}", "%s12"]))
            e(f"{p}" + tile_asm(ld.format(3), "r,r,~{memory}", [f"%pbo{t}", "%s12"]))
            e(f"{p}" + tile_asm(ld.format(4), "r,r,~{memory}", [f"%pa{t}", "%s64"]))
            e(f"{p}" + tile_asm(ld.format(5), "r,r,~{memory}", [f"%pa{t}_1", "%s64"]))
            e(f"{p}" + tile_asm(ld.format(6), "r,r,~{memory}", [f"%pa{t}_2", "%s64"]))
            e(f"{p}" + tile_asm(ld.format(7), "r,r,~{memory}", [f"%pa{t}_3", "%s64"]))
            e(f"{p}" + tile_asm("tdpbusd %tmm2, %tmm4, %tmm0", "", []))
            e(f"{p}" + tile_asm("tdpbusd %tmm3, %tmm5, %tmm0", "", []))
            e(f"{p}" + tile_asm("tdpbusd %tmm2, %tmm6, %tmm1", "", []))
            e(f"{p}" + tile_asm("tdpbusd %tmm3, %tmm7, %tmm1", "", []))
            if self.prefetch:
                self._prefetch(e, p, f"%st{t}", f"4{t}")
            # the next step's A tiles, on the other buffer, while these products run
            e(f"{p}%nx{t} = arith.addi %st{t}, %c1 : index")
            e(f"{p}%more{t} = arith.cmpi ult, %nx{t}, %csteps : index")
            e(f"{p}scf.if %more{t} {{")
            self._abuild(e, p + "  ", f"%nx{t}", f"b{t}")
            e(f"{p}}}")

    def _store_sums(self, e, p: str, g: str, tag: str) -> None:
        """Stores C tiles 0 and 1 (group ``g``'s sums) into ``%cb``'s half ``g mod 2``."""
        e(f"{p}%cbs{tag} = affine.apply affine_map<()[s0] -> ((s0 mod 2) * 384)>()[{g}]")
        e(f"{p}%cbs64{tag} = arith.index_cast %cbs{tag} : index to i64")
        e(f"{p}%cba{tag} = arith.addi %cbaddr, %cbs64{tag} : i64")
        e(f"{p}%cbb{tag} = arith.addi %cba{tag}, %b192 : i64")
        st = "tilestored %tmm{}, ($0,$1,1)"
        e(f"{p}" + tile_asm(st.format(0), "r,r,~{memory}", [f"%cba{tag}", "%s12"]))
        e(f"{p}" + tile_asm(st.format(1), "r,r,~{memory}", [f"%cbb{tag}", "%s12"]))

    def _extract(self, e, p: str, g: str, accs: list[str], tag: str) -> list[str]:
        """Adds group ``g``'s sums (in ``%cb``'s half ``g mod 2``) to ``accs``: ``sum U P -
        8 sum P = sum Q P`` (exact in f32: below 2^24), the pieces combined, times the 16
        channels' scales of the group (a gather)."""
        groups, vt = self.groups, "vector<16xf32>"
        for c in range(3):
            e(f"{p}%spi{tag}{c} = arith.constant {c} : index")
            e(f"{p}%spv{tag}{c} = memref.load %spg[{g}, %spi{tag}{c}] : memref<{groups}x3xf32>")
            e(f"{p}%sp8{tag}{c} = arith.mulf %spv{tag}{c}, %c8f : f32")
            e(f"{p}%sp8b{tag}{c} = vector.broadcast %sp8{tag}{c} : f32 to {vt}")
        e(f"{p}%cbh{tag} = affine.apply affine_map<()[s0] -> ((s0 mod 2) * 96)>()[{g}]")
        outs = []
        for t in range(2):
            tt = f"{tag}{t}"
            e(f"{p}%cbo{tt} = affine.apply affine_map<()[s0] -> (s0 + {48 * t})>()[%cbh{tag}]")
            e(f"{p}%cv{tt} = vector.load %cb[%cbo{tt}] : memref<192xi32>, vector<48xi32>")
            f = []
            for c in range(3):
                mask = ", ".join(str(3 * i + c) for i in range(16))
                e(
                    f"{p}%cd{tt}_{c} = vector.shuffle %cv{tt}, %cv{tt} [{mask}] : "
                    "vector<48xi32>, vector<48xi32>"
                )
                e(f"{p}%cu{tt}_{c} = arith.sitofp %cd{tt}_{c} : vector<16xi32> to {vt}")
                e(f"{p}%cf{tt}_{c} = arith.subf %cu{tt}_{c}, %sp8b{tag}{c} : {vt}")
                f.append(f"%cf{tt}_{c}")
            e(f"{p}%e{tt}a = math.fma {f[0]}, %f254v, {f[1]} : {vt}")
            e(f"{p}%e{tt}b = math.fma %e{tt}a, %f254v, {f[2]} : {vt}")
            e(
                f"{p}%so{tt} = affine.apply affine_map<()[s0, s1] -> "
                f"((s0 + {16 * t}) * {groups} + s1)>()[%n0, {g}]"
            )
            e(
                f"{p}%sg{tt} = vector.gather %ms1[%so{tt}] [%gidx], %gmask, %zv16 : "
                f"memref<{self.n * groups}xf32>, vector<16xi32>, vector<16xi1>, {vt} into {vt}"
            )
            e(f"{p}%na{tt} = math.fma %e{tt}b, %sg{tt}, {accs[t]} : {vt}")
            outs.append(f"%na{tt}")
        return outs

    def _zero_point_term(self, e, p: str, t: int, acc: str, s_t: str, z_t: str) -> str:
        """``acc - sum_g S Z spc`` for the 16 channels of tile ``t`` (each channel's scale and
        zero-point rows are contiguous: a dot product with ``%spc`` per channel)."""
        groups = self.groups
        vt = "vector<16xf32>"
        e(f"{p}%zt{t} = memref.alloca() : memref<16xf32>")
        e(f"{p}scf.for %ch = %c0 to %c16 step %c1 {{")
        q = p + "  "
        e(f"{q}%zn = affine.apply affine_map<()[s0, s1] -> (s0 + s1 + {16 * t})>()[%n0, %ch]")
        e(f"{q}%zsum = scf.for %g = %c0 to %c{groups} step %c1 iter_args(%za = %f0) -> (f32) {{")
        e(f"{q}  %zs = memref.load %ms[%zn, %g] : {s_t}")
        e(f"{q}  %zz = memref.load %mz[%zn, %g] : {z_t}")
        e(f"{q}  %zf = arith.sitofp %zz : i8 to f32")
        e(f"{q}  %zc = memref.load %spc[%g] : memref<{groups}xf32>")
        e(f"{q}  %zsz = arith.mulf %zs, %zf : f32")
        e(f"{q}  %zn2 = math.fma %zsz, %zc, %za : f32")
        e(f"{q}  scf.yield %zn2 : f32")
        e(f"{q}}}")
        e(f"{q}memref.store %zsum, %zt{t}[%ch] : memref<16xf32>")
        e(f"{p}}}")
        e(f"{p}%ztv{t} = vector.load %zt{t}[%c0] : memref<16xf32>, {vt}")
        e(f"{p}%zacc{t} = arith.subf {acc}, %ztv{t} : {vt}")
        return f"%zacc{t}"


def _aligned_alloca(t: str) -> str:
    """A 64-byte aligned ``memref.alloca`` of type ``t`` (generic form: the custom one does not
    take the alignment in IREE 3.13's parser)."""
    return (
        '"memref.alloca"() <{alignment = 64 : i64, operandSegmentSizes = array<i32: 0, 0>}> : '
        f"() -> {t}"
    )


def _address(e, v: str, mem: str, t: str, elem: str, size: int, rank: int) -> None:
    """Emits ``%{v}addr`` (i64): the address of memref ``mem``'s first element."""
    idx = ", ".join(["index"] * rank)
    sizes = ", ".join(f"%{v}size{i}" for i in range(rank))
    strides = ", ".join(f"%{v}stride{i}" for i in range(rank))
    e(
        f"      %{v}base, %{v}offset, {sizes}, {strides} = memref.extract_strided_metadata "
        f"{mem} : {t} -> memref<{elem}>, index, {idx}, {idx}"
    )
    e(f"      %{v}ptr = memref.extract_aligned_pointer_as_index {mem} : {t} -> index")
    e(
        f"      %{v}addri = affine.apply affine_map<()[s0, s1] -> (s0 + s1 * {size})>()"
        f"[%{v}ptr, %{v}offset]"
    )
    e(f"      %{v}addr = arith.index_cast %{v}addri : index to i64")
