"""torch pytree specs of recorded calls: reading one back (node types not importable here read
as dicts), flattening a call's value along one (errors name the path), leaf paths and labels."""

from __future__ import annotations

import importlib
import json
import logging
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from .checks import describe
from .errors import type_error

__all__ = [
    "arg_label",
    "flatten_like",
    "leaf_paths",
    "load_spec",
    "newer_pytree_protocol",
    "result_label",
    "spec_children",
]

logger = logging.getLogger("turbine.aot.runtime")


def newer_pytree_protocol(text: Any) -> int | None:
    """The protocol of a serialized treespec when it is one torch does not read (a module
    built with a newer torch); None otherwise (also for damaged text: the reader says so)."""
    import torch.utils._pytree as pytree

    supported = getattr(pytree, "_SUPPORTED_PROTOCOLS", None) or {1: None}
    if not isinstance(text, str):
        return None
    m = re.match(r"\s*\[\s*(\d{1,9})\s*,", text)
    if m is None:
        return None
    protocol = int(m.group(1))
    return protocol if protocol not in supported and protocol > max(supported) else None


# ----------------------------------------------------------------------------- trees
def load_spec_exact(text: str) -> tuple[Any, bool]:
    """:func:`load_spec`, and whether the tree was read as recorded (every node type known
    here): such a tree cannot change later and may be kept; one read with dicts in place of
    unknown types may read differently once their package is imported."""
    from torch.utils._pytree import treespec_loads

    try:
        return treespec_loads(text), True
    except Exception:
        return load_spec(text), False


def load_spec(text: str, *, warn: bool = True) -> Any:
    """``treespec_loads``, with node types unknown here (e.g. a ModelOutput of a library not
    imported) imported when their top-level package is already loaded, else read as dicts."""
    from torch.utils._pytree import treespec_loads

    try:
        return treespec_loads(text)
    except Exception:
        pass
    data = json.loads(text)
    unknown: list[str] = []

    def fix(node: dict[str, Any]) -> None:
        t = node.get("type")
        if t is not None and not _serialized_type_known(t) and not _import_type_module(t):
            unknown.append(t)
            node["type"] = "builtins.dict"
        for child in node.get("children_spec", []):
            fix(child)

    fix(data[1])
    if unknown and warn:
        logger.warning(
            "result types %s are not importable here; returning dicts with the same keys "
            "(import their package before calling to get them)",
            ", ".join(sorted(set(unknown))),
        )
    return treespec_loads(json.dumps(data))


def _serialized_type_known(name: str) -> bool:
    from torch.utils._pytree import SERIALIZED_TYPE_TO_PYTHON_TYPE

    return name in SERIALIZED_TYPE_TO_PYTHON_TYPE


def _import_type_module(name: str) -> bool:
    module = name.rpartition(".")[0]
    if not module or module.split(".")[0] not in sys.modules:
        return False  # never import a package the process has not loaded itself
    try:
        importlib.import_module(module)
    except Exception:
        return False
    return _serialized_type_known(name)


def spec_children(spec: Any) -> list[Any]:
    return list(spec.children()) if hasattr(spec, "children") else list(spec.children_specs)


def flatten_like(fn_label: str, value: Any, spec: Any, path: str, out: list[Any]) -> None:
    """Flattens ``value`` along the recorded ``spec``; errors name the path."""
    import torch.utils._pytree as pytree

    if spec.is_leaf():
        out.append((path, value))
        return
    t = spec.type
    children = spec_children(spec)
    where = f"{fn_label}(): argument {path}"
    if t is type(None):
        if value is not None:
            raise type_error(f"{where} was None at export; got {describe(value)}")
        return
    if t in (tuple, list):
        if not isinstance(value, (tuple, list)) or len(value) != len(children):
            raise type_error(
                f"{where} expects a {t.__name__} of {len(children)}; got {describe(value)}"
            )
        for i, (v, c) in enumerate(zip(value, children)):
            flatten_like(fn_label, v, c, f"{path}[{i}]", out)
        return
    if isinstance(t, type) and issubclass(t, dict):
        keys = list(spec.context)
        if not isinstance(value, Mapping):
            raise type_error(
                f"{where} expects a dict with keys {', '.join(map(repr, keys))}; got "
                f"{describe(value)}"
            )
        missing = [k for k in keys if k not in value]
        extra = [k for k in value if k not in keys]
        if missing or extra:
            parts = []
            if missing:
                parts.append(f"missing {', '.join(map(repr, missing))}")
            if extra:
                parts.append(f"unexpected {', '.join(map(repr, extra))}")
            raise type_error(
                f"{where} expects a dict with keys {', '.join(map(repr, keys))}; got one "
                f"{' and '.join(parts)}"
            )
        for k, c in zip(keys, children):
            flatten_like(fn_label, value[k], c, f"{path}[{k!r}]", out)
        return
    # namedtuples and registered types: flatten with pytree, compare the node.
    node = pytree.SUPPORTED_NODES.get(type(value))
    if type(value) is not t or node is None:
        raise type_error(
            f"{where} expects a {getattr(t, '__qualname__', t)}; got {describe(value)}"
        )
    vals, context = node.flatten_fn(value)
    if context != spec.context or len(vals) != len(children):
        raise type_error(f"{where}: its structure differs from the exported one")
    for i, (v, c) in enumerate(zip(vals, children)):
        flatten_like(fn_label, v, c, f"{path}[{i}]", out)


# ----------------------------------------------------------------------------- recording
def leaf_paths(spec: Any) -> list[tuple[Any, ...]]:
    from torch.utils._pytree import tree_flatten_with_path, tree_unflatten

    dummy = tree_unflatten([0] * spec.num_leaves, spec)
    return [p for p, _ in tree_flatten_with_path(dummy)[0]]


def _key_text(key: Any) -> str:
    from torch.utils._pytree import keystr

    return keystr((key,))


def arg_label(path: tuple[Any, ...], pos_names: Sequence[str]) -> str:
    """``(SequenceKey(0), SequenceKey(1), MappingKey('a'))`` -> ``y['a']``."""
    first, second, *rest = path
    if getattr(first, "idx", None) == 0:
        i = second.idx
        name = pos_names[i] if i < len(pos_names) else f"arg{i}"
    else:
        name = str(getattr(second, "key", second))
    return name + "".join(_key_text(k) for k in rest)


def result_label(path: tuple[Any, ...]) -> str:
    return "".join(_key_text(k) for k in path) or "result"
