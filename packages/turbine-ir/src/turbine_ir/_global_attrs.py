"""GlobalAttributes: how a global is initialized (inline, external parameter, uninitialized)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from turbine_params import DeviceTensorTrait, ExternalTensorTrait

__all__ = ["DEFAULT_PARAMETER_SCOPE", "GlobalAttributes"]

#: The scope an empty external scope is written as (``--parameters=model=file.irpa``).
DEFAULT_PARAMETER_SCOPE = "model"


class GlobalAttributes:
    """Settings for how to initialize a global.

    Args:
        mutable: The global can be stored to (``util.global private mutable``).
        external: ``True``: load from a parameter archive (``#flow.parameter.named``); ``False``:
            never external; ``None``: decide per tensor from its ``ExternalTensorTrait``.
        external_scope: Parameter scope for external globals (``None``/empty: the tensor trait's
            scope, else ``"model"``).
        name_mapper: Maps a logical name to the parameter key; returning ``None`` keeps the name.
        noinline: Keep the global's value out of constant folding/inlining
            (``inlining_policy = #util.inline.never``).
        uninitialized: Declare without an initial value (``#util.uninitialized``); the program
            must store before loading, so the global must be ``mutable``.

    Raises:
        ValueError: ``external=True`` with ``uninitialized=True``; ``uninitialized=True``
            without ``mutable=True``.

    Example:
        >>> GlobalAttributes(external=True, name_mapper=lambda n: "w." + n).map_name("fc")
        'w.fc'
    """

    __slots__ = (
        "external",
        "external_scope",
        "mutable",
        "name_mapper",
        "noinline",
        "uninitialized",
    )

    def __init__(
        self,
        mutable: bool = False,
        external: bool | None = None,
        external_scope: str | None = None,
        name_mapper: Callable[[str], str | None] | None = None,
        noinline: bool = False,
        uninitialized: bool | None = None,
    ):
        # Checked in the reference's order, with its messages' key phrases.
        if external and uninitialized:
            raise ValueError(
                "GlobalAttributes: external=True and uninitialized=True contradict each other "
                "(an external global is initialized from its parameter); choose one"
            )
        if uninitialized and not mutable:
            raise ValueError(
                "Globals with uninitialized=True must also be mutable=True (the program must "
                "store an uninitialized global before loading it)"
            )
        self.mutable = mutable
        self.external = external
        self.external_scope = external_scope
        self.name_mapper = name_mapper
        self.noinline = noinline
        self.uninitialized = uninitialized

    def map_name(self, name: str) -> str:
        """The parameter key for a logical name (``name_mapper(name)``, or ``name`` if ``None``)."""
        if self.name_mapper is not None:
            mapped = self.name_mapper(name)
            if mapped is not None:
                return mapped
        return name

    def infer_external_from_tensor(self, t: Any) -> tuple[bool, str | None, str | None]:
        """If externality is not specified, infers it from the tensor.

        Returns:
            ``(external, external_scope, external_name)``. ``external_name`` is only set when it
            comes from the tensor's ``ExternalTensorTrait``; otherwise callers derive it with
            :meth:`map_name`.
        """
        if self.external is not None:
            return bool(self.external), self.external_scope, None
        trait = _external_trait(t)
        if trait is None:
            return False, None, None
        return True, self.external_scope or trait.external_scope, trait.external_name

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__)
        return f"GlobalAttributes({fields})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GlobalAttributes):
            return NotImplemented
        return all(getattr(self, k) == getattr(other, k) for k in self.__slots__)

    __hash__ = None  # type: ignore[assignment]


def _external_trait(t: Any) -> Any:
    return ExternalTensorTrait.get(t)


def device_trait(t: Any) -> Any:
    """The tensor's ``DeviceTensorTrait`` or ``None``."""
    return DeviceTensorTrait.get(t)
