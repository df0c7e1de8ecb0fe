"""Device affinity attributes: ``#hal.device.promise<@__device_N>`` on arguments and globals."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from iree.compiler import ir

__all__ = [
    "AFFINITY_ARG_ATTR",
    "GLOBAL_AFFINITY_ATTR",
    "attributes_from_argument_device_affinities",
    "device_promise_asm",
    "device_promise_attr",
]

#: Function argument attribute naming the device an argument lives on.
AFFINITY_ARG_ATTR = "iree.abi.affinity"
#: Global op attribute naming the device a global lives on.
GLOBAL_AFFINITY_ATTR = "stream.affinity"


def device_promise_asm(ordinal: int, queues: Any = None) -> str:
    """``#hal.device.promise<@__device_{ordinal}>``, with ``, [q, ...]`` when queues are given.

    Queues are queue ordinals (ints, or strings of digits as ``DeviceAffinity`` stores them).

    Raises:
        ValueError: A negative ordinal or a queue that is not an integer.
    """
    if isinstance(ordinal, bool) or not isinstance(ordinal, int) or ordinal < 0:
        raise ValueError(f"device ordinal must be an int >= 0, got {ordinal!r}")
    if not queues:
        return f"#hal.device.promise<@__device_{ordinal}>"
    qs = []
    for q in queues:
        try:
            qs.append(int(q))
        except (TypeError, ValueError):
            raise ValueError(
                f"device {ordinal}: queue {q!r} is not a queue ordinal; IREE addresses queues "
                "by integer (e.g. DeviceAffinity(0, queues=['0', '1']))"
            ) from None
    return f"#hal.device.promise<@__device_{ordinal}, [{', '.join(map(str, qs))}]>"


def device_promise_attr(affinity: Any, context: ir.Context | None = None) -> ir.Attribute:
    """The promise attribute for a ``DeviceAffinity``/``DeviceTensorTrait`` (``ordinal``, ``queues``)."""
    from iree.compiler import ir

    return ir.Attribute.parse(
        device_promise_asm(affinity.ordinal, getattr(affinity, "queues", None)), context
    )


def attributes_from_argument_device_affinities(
    affinities: Mapping[int, Any] | None, arguments_count: int, context: ir.Context
) -> list[dict[str, ir.Attribute]]:
    """Get as attributes for function op arguments.

    Args:
        affinities: Argument index → ``DeviceAffinity`` (or ``None`` for no affinities).
        arguments_count: Number of function arguments.
        context: MLIR context.

    Returns:
        One dict per argument: ``{"iree.abi.affinity": #hal.device.promise<@__device_N>}`` or
        ``{}``.

    Raises:
        ValueError: An index outside ``[0, arguments_count)``.
    """
    result: list[dict[str, ir.Attribute]] = [{} for _ in range(arguments_count)]
    for index, affinity in (affinities or {}).items():
        if not isinstance(index, int) or not 0 <= index < arguments_count:
            raise ValueError(
                f"argument device affinity given for argument {index!r}, but the function has "
                f"{arguments_count} argument(s) (valid indices: 0..{arguments_count - 1})"
            )
        if affinity is None:
            continue
        result[index][AFFINITY_ARG_ATTR] = device_promise_attr(affinity, context)
    return result
