"""A call's ``ModelOutput`` result rebuilt without its constructor (docs/running.md, "What a call
costs").

A Hugging Face model returns a ``ModelOutput`` (``BaseModelOutput``, ``CausalLMOutputWithPast``,
...): a dataclass that is also an ``OrderedDict`` of its fields that are not None. Its
constructor, run once per call to give the caller what eager gives, checks the fields in
``__post_init__`` (is the first one a tensor, an iterator of pairs, ...): about 12 µs warm, but
90 µs right after a call that streamed its weights through the caches, a third of a small
model's call (the zoo's Whisper encoder: 0.25 ms in its dispatches).

:class:`ModelOutputBuilder` builds the first result of a signature with the constructor and
keeps it as a template: the order of the instance's attributes and items, which of them are the
call's values and which the fields left None. Later results are made
from the template (``__new__``, the items set as ``OrderedDict``'s, the attributes as a dict),
an instance equal to the constructor's in type, attributes and items, each value the same
object. The template is only kept after a second instance built from it for the first call's
values has been compared with the constructor's; any difference (another transformers
version) keeps the constructor for that signature, as does a ``ModelOutput`` subclass with its
own ``__post_init__``, ``__setitem__`` or ``__setattr__``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["ModelOutputBuilder", "is_model_output_type"]


def is_model_output_type(cls: Any) -> bool:
    """Whether ``cls`` is a plain transformers ``ModelOutput`` dataclass (found by its bases,
    without importing transformers): none of its classes below ``ModelOutput`` defines its own
    ``__post_init__``, ``__setitem__`` or ``__setattr__`` (whose effects a template would not
    repeat)."""
    if not isinstance(cls, type) or not issubclass(cls, OrderedDict):
        return False
    if "__dataclass_fields__" not in cls.__dict__:
        return False
    for c in cls.__mro__:
        if c.__name__ == "ModelOutput" and c.__module__.startswith("transformers."):
            return True
        if any(k in c.__dict__ for k in ("__post_init__", "__setitem__", "__setattr__")):
            return False
    return False


class ModelOutputBuilder:
    """Builds the ``ModelOutput`` at the root of a result tree ``spec`` (a torch pytree spec
    whose root type passes :func:`is_model_output_type`) from the call's flat leaves.

    Args:
        spec: the result tree.
        unflatten: ``torch.utils._pytree.tree_unflatten`` (for the whole tree on the first call,
            and for subtrees below the root).
    """

    def __init__(self, spec: Any, unflatten: Callable[[Sequence[Any], Any], Any]):
        self._spec = spec
        self._unflatten = unflatten
        self._type = spec.type
        self._keys = [str(k) for k in spec.context]
        children = [spec.child(i) for i in range(spec.num_children)]
        self._children: list[tuple[int, int, Any]] = []  # (first leaf, leaves, subtree or None)
        first = 0
        for child in children:
            n = child.num_leaves
            self._children.append((first, n, None if child.is_leaf() else child))
            first += n
        #: per attribute of the template, in its order: (name, index of its value or None for
        #: a field left None)
        self._attributes: list[tuple[str, int | None]] | None = None
        self._disabled = False

    def __call__(self, leaves: Sequence[Any]) -> Any:
        attributes = self._attributes
        if attributes is not None:
            return self._build(self._values(leaves), attributes)
        result = self._unflatten(leaves, self._spec)
        if not self._disabled:
            self._attributes = self._template(result)
            if self._attributes is None:
                self._disabled = True
        return result

    def _values(self, leaves: Sequence[Any]) -> list[Any]:
        return [
            leaves[first] if sub is None else self._unflatten(leaves[first : first + n], sub)
            for first, n, sub in self._children
        ]

    def _build(self, values: list[Any], attributes: list[tuple[str, int | None]]) -> Any:
        out = self._type.__new__(self._type)
        for key, value in zip(self._keys, values, strict=True):
            OrderedDict.__setitem__(out, key, value)
        out.__dict__.update(
            (name, None if index is None else values[index]) for name, index in attributes
        )
        return out

    def _template(self, made: Any) -> list[tuple[str, int | None]] | None:
        """The attributes' template of ``made`` (the constructor's instance), or None where an
        instance built from it would differ."""
        if type(made) is not self._type or list(made.keys()) != self._keys:
            return None
        values = list(made.values())
        attributes: list[tuple[str, int | None]] = []
        for name, value in made.__dict__.items():
            if name in self._keys:
                index = self._keys.index(name)
                if value is not values[index]:
                    return None
                attributes.append((name, index))
            elif value is None:
                attributes.append((name, None))
            else:  # an attribute that is neither an item nor None: not a plain ModelOutput
                return None
        copy = self._build(values, attributes)
        same = (
            type(copy) is type(made)
            and list(copy.keys()) == list(made.keys())
            and all(a is b for a, b in zip(copy.values(), made.values(), strict=True))
            and list(copy.__dict__) == list(made.__dict__)
            and all(copy.__dict__[k] is v for k, v in made.__dict__.items())
            and copy == made
        )
        return attributes if same else None
