"""Tensor traits: annotations attached to torch tensors that steer how they are exported.

A trait is stored as a private attribute on the tensor object itself (``torch.Tensor`` and
``torch.nn.Parameter`` instances accept arbitrary attributes), so it follows the tensor through
``state_dict()`` / ``named_parameters()`` without a side table that could go stale.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DeviceAffinity",
    "DeviceTensorTrait",
    "ExternalTensorTrait",
]

_EXTERNAL_ATTR = "_turbine_external_tensor_trait"
_DEVICE_ATTR = "_turbine_device_tensor_trait"


def _attach(tensor: Any, attr: str, trait: object, what: str) -> None:
    try:
        setattr(tensor, attr, trait)
    except (AttributeError, TypeError) as e:
        raise TypeError(
            f"cannot attach {what} to an object of type {type(tensor).__name__}: traits attach "
            f"to torch.Tensor instances (which accept attributes); pass a torch tensor"
        ) from e


def _check_ordinal(ordinal: Any, owner: str) -> int:
    """``ordinal`` as an int; raises unless it is a non-negative integer (not a bool)."""
    if not isinstance(ordinal, bool):
        try:
            value = operator.index(ordinal)  # int, numpy integers
        except TypeError:
            pass
        else:
            if value < 0:
                raise ValueError(
                    f"{owner} ordinal must be an int >= 0 (device N is @__device_N), got {value}"
                )
            return value
    raise TypeError(
        f"{owner} ordinal must be an int >= 0 (device N is @__device_N), got {ordinal!r} "
        f"({type(ordinal).__name__})"
    )


def _normalize_queues(queues: Any, owner: str) -> list[str] | None:
    """Queue ordinals as decimal strings (how they are stored and printed), or ``None``.

    IREE addresses the queues of a device by number (``#hal.device.promise<@__device_0, [0,
    1]>``): each queue is a non-negative int or a string of decimal digits. A single queue may
    be given bare. Anything else is refused here, not when the module is exported.
    """
    if queues is None:
        return None
    if isinstance(queues, (str, int)) and not isinstance(queues, bool):
        queues = [queues]  # a single queue given bare
    elif isinstance(queues, (bytes, bytearray, dict, set, frozenset)) or not isinstance(
        queues, Iterable
    ):
        raise TypeError(
            f"{owner} queues must be a list of queue ordinals (ints >= 0 or digit strings such "
            f"as ['0', '1']) or None, got {queues!r} ({type(queues).__name__})"
        )
    out = []
    for q in queues:
        if isinstance(q, str):
            if not (q.isascii() and q.isdigit()):
                raise ValueError(
                    f"{owner} queue {q!r} is not a queue ordinal: IREE addresses a device's "
                    f"queues by number; give ints >= 0 or digit strings such as ['0', '1']"
                )
            out.append(str(int(q)))
            continue
        if not isinstance(q, bool):
            try:
                value = operator.index(q)
            except TypeError:
                pass
            else:
                if value < 0:
                    raise ValueError(
                        f"{owner} queue {value} is negative; queue ordinals are ints >= 0"
                    )
                out.append(str(value))
                continue
        raise TypeError(
            f"{owner} queue {q!r} ({type(q).__name__}) is not a queue ordinal; give ints >= 0 "
            f"or digit strings such as ['0', '1']"
        )
    return out


class DeviceAffinity:
    """A device ordinal plus optional queue names, used to place arguments and globals.

    Two affinities are equal when ordinal and queues are equal; they hash accordingly, so they
    can key dictionaries (e.g. the set of devices a module uses).

    Args:
        ordinal: Device number (``__device_{ordinal}`` in the IR), an int >= 0.
        queues: Optional queue ordinals on that device (ints >= 0 or digit strings; stored as
            decimal strings), or a single one given bare.

    Raises:
        TypeError: ``ordinal`` is not an integer, or a queue is neither an int nor a string.
        ValueError: ``ordinal`` or a queue is negative, or a queue string is not a number.

    Example:
        >>> DeviceAffinity(1) == DeviceAffinity(1, None)
        True
    """

    __slots__ = ("_ordinal", "_queues")

    def __init__(self, ordinal: int, queues: list | None = None):
        self._ordinal = _check_ordinal(ordinal, "DeviceAffinity")
        self._queues = _normalize_queues(queues, "DeviceAffinity")

    @property
    def ordinal(self) -> int:
        """The device ordinal."""
        return self._ordinal

    @property
    def queues(self) -> list[str] | None:
        """Queue names on the device, or ``None`` for any queue (a copy: affinities are values)."""
        return None if self._queues is None else list(self._queues)

    def _key(self) -> tuple[int, tuple[str, ...] | None]:
        return (self._ordinal, None if self._queues is None else tuple(self._queues))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DeviceAffinity):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(("DeviceAffinity", *self._key()))

    def __setattr__(self, name: str, value: Any) -> None:
        if name in DeviceAffinity.__slots__ and not hasattr(self, name):
            object.__setattr__(self, name, value)
            return
        raise AttributeError("DeviceAffinity is immutable; create a new one")

    def __repr__(self) -> str:
        if self._queues is None:
            return f"DeviceAffinity({self._ordinal})"
        return f"DeviceAffinity({self._ordinal}, queues={self._queues!r})"

    def __reduce__(self):
        return (DeviceAffinity, (self._ordinal, self.queues))


@dataclass
class DeviceTensorTrait:
    """Marks a tensor to be loaded onto a specific device at execution time.

    Args:
        ordinal: Device ordinal the tensor belongs to, an int >= 0.
        queues: Optional queue ordinals on that device (ints >= 0 or digit strings), checked
            as :class:`DeviceAffinity` checks them.

    Raises:
        TypeError, ValueError: as :class:`DeviceAffinity`, when the trait is created.

    Example:
        >>> import torch
        >>> t = torch.zeros(2)
        >>> DeviceTensorTrait(1).set(t)
        >>> DeviceTensorTrait.get(t).ordinal
        1
    """

    ordinal: int
    queues: list | None = None

    def __post_init__(self) -> None:
        # Checked now, not when a module using the tensor is exported; the values are kept as
        # given (``affinity`` normalizes them).
        _check_ordinal(self.ordinal, "DeviceTensorTrait")
        _normalize_queues(self.queues, "DeviceTensorTrait")

    @property
    def affinity(self) -> DeviceAffinity:
        """The same placement as a :class:`DeviceAffinity` value."""
        return DeviceAffinity(self.ordinal, self.queues)

    @staticmethod
    def get(from_tensor: Any) -> DeviceTensorTrait | None:
        """Returns the trait attached to ``from_tensor``, or ``None``."""
        trait = getattr(from_tensor, _DEVICE_ATTR, None)
        return trait if isinstance(trait, DeviceTensorTrait) else None

    def set(self, to_tensor: Any) -> None:
        """Attaches this trait to ``to_tensor`` (replacing any previous device trait).

        Raises:
            TypeError: ``to_tensor`` does not accept attributes (not a torch tensor).
        """
        _attach(to_tensor, _DEVICE_ATTR, self, "a DeviceTensorTrait")


@dataclass
class ExternalTensorTrait:
    """Marks a tensor to be loaded by name from a parameter archive at execution time.

    Exporters turn such a tensor into a global initialized from
    ``#flow.parameter.named<"scope"::"name">`` instead of embedding its data.

    Args:
        external_scope: Parameter scope (``""`` is written as ``"model"`` by the exporters).
        external_name: Key of the tensor in the archive.

    Example:
        >>> import torch
        >>> t = torch.zeros(2)
        >>> ExternalTensorTrait("model", "fc.weight").set(t)
        >>> ExternalTensorTrait.get(t).external_name
        'fc.weight'
    """

    external_scope: str
    external_name: str

    @staticmethod
    def get(from_tensor: Any) -> ExternalTensorTrait | None:
        """Returns the trait attached to ``from_tensor``, or ``None``."""
        trait = getattr(from_tensor, _EXTERNAL_ATTR, None)
        return trait if isinstance(trait, ExternalTensorTrait) else None

    def set(self, to_tensor: Any) -> None:
        """Attaches this trait to ``to_tensor`` (replacing any previous external trait).

        Raises:
            TypeError: ``to_tensor`` does not accept attributes (not a torch tensor).
        """
        _attach(to_tensor, _EXTERNAL_ATTR, self, "an ExternalTensorTrait")
