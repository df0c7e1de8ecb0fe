"""The torch ``nn.Module`` adapter: enumerate and externalize a module's parameters and buffers.

(The archive builder takes modules through :func:`module_tensors`; this module never imports it.)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ._traits import ExternalTensorTrait

__all__ = ["externalize_module_parameters", "module_tensors"]


def prefixed_name(prefix: str, name: str) -> str:
    """``prefix.name`` (``name`` alone for an empty prefix), as the reference joins them.

    A prefix that already ends with ``.`` is not given a second one.

    Example:
        >>> prefixed_name("foobar.model", "classifier.weight")
        'foobar.model.classifier.weight'
    """
    if not prefix:
        return name
    return f"{prefix}{name}" if prefix.endswith(".") else f"{prefix}.{name}"


def module_tensors(module: Any, *, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Yields ``(name, tensor)`` for every parameter and persistent buffer.

    Names are ``state_dict`` names, joined to ``prefix`` with a dot (:func:`prefixed_name`); tied
    tensors appear once per name (the same object twice), which is how the archive writer
    recognises them and stores their bytes once. Non-persistent buffers are skipped, as
    ``state_dict`` does.
    """
    state = module.state_dict(keep_vars=True)
    for name, value in state.items():
        if _is_tensor(value):
            yield prefixed_name(prefix, name), value


def _is_tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


def externalize_module_parameters(
    module: Any, *, external_scope: str = "", prefix: str = ""
) -> None:
    """Externalizes parameters and persistent buffers in a module by name.

    Sets an :class:`ExternalTensorTrait` ``(external_scope, "<prefix>.<name>")`` on each of them, so
    that exporters reference them as ``#flow.parameter.named<scope::name>`` instead of embedding
    their data. A tensor reachable under two names (tied weights) keeps the first name: the archive
    written by :func:`save_module_parameters` holds both names for the same bytes, so either
    resolves.

    Args:
        module: A ``torch.nn.Module``.
        external_scope: Parameter scope; ``""`` is written as ``"model"`` by the exporters.
        prefix: Joined to every state_dict name with a dot (``prefix="foobar.model"`` gives
            ``foobar.model.classifier.weight``).
    """
    seen: set[int] = set()
    for name, tensor in module_tensors(module, prefix=prefix):
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        ExternalTensorTrait(external_scope=external_scope, external_name=name).set(tensor)
