"""Comparing a compiled function with eager PyTorch on the same inputs."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from turbine_aot._errors import TurbineAotError

__all__ = [
    "NumericsError",
    "NumericsReport",
    "OutputComparison",
    "check_numerics",
    "default_tolerance",
]


class NumericsError(TurbineAotError, AssertionError):
    """A compiled function's results differ from eager beyond tolerance."""


# (atol, rtol) per dtype name. Compiled code reorders reductions and fuses, so these are looser
# than torch.testing's defaults for low precision; integers and bools must match exactly.
_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7),
    "float32": (1e-4, 1e-4),
    "complex64": (1e-4, 1e-4),
    "complex128": (1e-7, 1e-7),
    "float16": (1e-2, 1e-2),
    "bfloat16": (5e-2, 2e-2),
    "float8_e4m3fn": (0.125, 0.125),
    "float8_e4m3fnuz": (0.125, 0.125),
    "float8_e5m2": (0.25, 0.25),
    "float8_e5m2fnuz": (0.25, 0.25),
    "float8_e8m0fnu": (0.0, 1.0),
}


def default_tolerance(dtype: Any) -> tuple[float, float]:
    """(atol, rtol) turbine uses for a torch dtype; (0, 0) for integers and bool."""
    return _TOLERANCES.get(str(dtype).removeprefix("torch."), (0.0, 0.0))


@dataclass(frozen=True)
class OutputComparison:
    """Errors of one output: max abs and max relative error against eager."""

    index: int
    dtype: str
    shape: tuple[int, ...]
    max_abs_error: float
    max_rel_error: float
    atol: float
    rtol: float
    ok: bool
    note: str = ""


@dataclass
class NumericsReport:
    """Per-output errors of a compiled-vs-eager comparison, and both latencies."""

    outputs: list[OutputComparison] = field(default_factory=list)
    compiled_seconds: float = 0.0
    eager_seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)

    def raise_if_failed(self) -> NumericsReport:
        if not self.ok:
            raise NumericsError(f"compiled results differ from eager:\n{self}")
        return self

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "compiled_seconds": self.compiled_seconds,
            "eager_seconds": self.eager_seconds,
            "outputs": [o.__dict__ | {"shape": list(o.shape)} for o in self.outputs],
        }

    def __str__(self) -> str:
        lines = [f"{'out':>3}  {'dtype':<14}{'shape':<18}{'max abs':>11}{'max rel':>11}  result"]
        for o in self.outputs:
            verdict = "ok" if o.ok else f"FAIL (atol {o.atol:g}, rtol {o.rtol:g})"
            lines.append(
                f"{o.index:>3}  {o.dtype:<14}{'x'.join(map(str, o.shape)) or 'scalar':<18}"
                f"{o.max_abs_error:>11.3g}{o.max_rel_error:>11.3g}  {verdict}{o.note}"
            )
        return "\n".join(lines)


def _flatten(value: Any) -> list[Any]:
    from torch.utils._pytree import tree_flatten

    return tree_flatten(value)[0]


def _compare(index: int, got: Any, want: Any, tol: Mapping[Any, tuple[float, float]] | None):
    import torch

    if not isinstance(want, torch.Tensor):
        want = torch.as_tensor(want)
    if not isinstance(got, torch.Tensor):
        got = torch.as_tensor(got)
    atol, rtol = (tol or {}).get(want.dtype, default_tolerance(want.dtype))
    dtype = str(want.dtype).removeprefix("torch.")
    if tuple(got.shape) != tuple(want.shape):
        return OutputComparison(
            index,
            dtype,
            tuple(want.shape),
            float("inf"),
            float("inf"),
            atol,
            rtol,
            False,
            f" shape {list(got.shape)} != eager {list(want.shape)}",
        )
    wide = torch.complex128 if want.is_complex() else torch.float64
    g, w = got.to(wide), want.to(wide)
    if g.numel() == 0:
        return OutputComparison(index, dtype, tuple(want.shape), 0.0, 0.0, atol, rtol, True)
    diff = (g - w).abs()
    finite = torch.isfinite(w) if not w.is_complex() else torch.ones_like(diff, dtype=torch.bool)
    same_nonfinite = bool(((g == w) | (g.isnan() & w.isnan()) | finite).all())
    d = torch.where(finite, diff, torch.zeros_like(diff))
    max_abs = float(d.max())
    rel = d / w.abs().clamp_min(torch.finfo(torch.float64).tiny)
    max_rel = float(torch.where(w.abs() > 0, rel, torch.zeros_like(rel)).max())
    ok = same_nonfinite and bool((d <= atol + rtol * w.abs()).all())
    return OutputComparison(index, dtype, tuple(want.shape), max_abs, max_rel, atol, rtol, ok)


def check_numerics(
    compiled: Callable[..., Any],
    eager: Callable[..., Any],
    *args: Any,
    tolerances: Mapping[Any, tuple[float, float]] | None = None,
    repeat: int = 1,
) -> NumericsReport:
    """Runs ``compiled`` and ``eager`` on the same inputs and reports errors per output.

    Args:
        compiled: the compiled function (e.g. ``loaded_module.main``).
        eager: the reference (an ``nn.Module`` or function).
        *args: inputs, passed to both (eager gets clones, so in-place ops cannot leak).
        tolerances: ``{torch dtype: (atol, rtol)}`` overriding :func:`default_tolerance`.
        repeat: call each this many times; the reported latencies are the medians.

    Returns:
        A :class:`NumericsReport`; ``report.ok`` says whether every output is within tolerance,
        ``report.raise_if_failed()`` raises :class:`NumericsError` with the table otherwise.
    """
    import statistics

    import torch

    def timed(fn: Callable[..., Any], clone: bool) -> tuple[Any, float]:
        times, out = [], None
        for _ in range(max(1, repeat)):
            call_args = [a.clone() if clone and isinstance(a, torch.Tensor) else a for a in args]
            t0 = time.perf_counter()
            out = fn(*call_args)
            times.append(time.perf_counter() - t0)
        return out, statistics.median(times)

    got, t_compiled = timed(compiled, False)
    with torch.no_grad():
        want, t_eager = timed(eager, True)
    got_flat, want_flat = _flatten(got), _flatten(want)
    report = NumericsReport(compiled_seconds=t_compiled, eager_seconds=t_eager)
    if len(got_flat) != len(want_flat):
        report.outputs.append(
            OutputComparison(
                0,
                "-",
                (),
                float("inf"),
                float("inf"),
                0.0,
                0.0,
                False,
                f" compiled returned {len(got_flat)} outputs, eager {len(want_flat)}",
            )
        )
        return report
    for i, (g, w) in enumerate(zip(got_flat, want_flat)):
        report.outputs.append(_compare(i, g, w, tolerances))
    return report
