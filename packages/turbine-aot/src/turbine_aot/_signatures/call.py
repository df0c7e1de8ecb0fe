"""The eager call's record, :class:`CallSignature`: how a compiled function was called (argument
names and trees, dynamic dimension ranges, defaults) and what it returned, its checks when a
module is loaded, binding a call to the flat arguments, and rebuilding the results."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from turbine_aot._errors import TurbineRuntimeError

from .checks import check_tensor, describe, same_constant
from .element_types import element_type_name
from .errors import damaged_module_error, type_error, value_error
from .keys import ARGS_SCHEMA, RETURN_SCHEMA, SIGNATURE_FORMAT, SIGNATURE_KEY
from .leaf import Leaf, check_leaf_record, value_text
from .model_outputs import ModelOutputBuilder, is_model_output_type
from .trees import flatten_like, load_spec, load_spec_exact, newer_pytree_protocol, spec_children

__all__ = ["CallSignature", "rebuild_results"]

logger = logging.getLogger("turbine.aot.runtime")


@dataclass(frozen=True)
class CallSignature:
    """How a compiled function is called and what it returns, as recorded at export.

    Attributes:
        args_schema: ``treespec_dumps`` of the ``(positional, keyword)`` argument tree.
        return_schema: ``treespec_dumps`` of the result tree (None: results stay flat).
        arg_names: the names of the top-level arguments, positional ones first, in the order
            positional calls fill them.
        args: the argument tree's leaves, in pytree order.
        results: the result tree's leaves, in pytree order (empty with no ``return_schema``).
        dims: dynamic dimension symbol -> (min, max or None for unbounded).
        defaults: parameters the export did not pass, with their (JSON) default: a call may pass
            the same value.
    """

    args_schema: str
    return_schema: str | None
    arg_names: tuple[str, ...]
    args: tuple[Leaf, ...]
    results: tuple[Leaf, ...] = ()
    dims: Mapping[str, tuple[int, int | None]] = field(default_factory=dict)
    defaults: Mapping[str, Any] = field(default_factory=dict)

    # ---- serialization
    def to_json(self) -> dict[str, Any]:
        return {
            "format": SIGNATURE_FORMAT,
            "args_schema": self.args_schema,
            "return_schema": self.return_schema,
            "arg_names": list(self.arg_names),
            "args": [leaf.to_json() for leaf in self.args],
            "results": [leaf.to_json() for leaf in self.results],
            "dims": {k: {"min": lo, "max": hi} for k, (lo, hi) in self.dims.items()},
            "defaults": dict(self.defaults),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CallSignature:
        return cls(
            args_schema=str(d["args_schema"]),
            return_schema=d.get("return_schema"),
            arg_names=tuple(d.get("arg_names", ())),
            args=tuple(Leaf.from_json(x) for x in d.get("args", ())),
            results=tuple(Leaf.from_json(x) for x in d.get("results", ())),
            dims={k: (int(v["min"]), v.get("max")) for k, v in (d.get("dims") or {}).items()},
            defaults=dict(d.get("defaults") or {}),
        )

    def to_reflection(self) -> dict[str, str]:
        """The ``iree.reflection`` entries (strings) recording this signature."""
        body = self.to_json()
        out = {ARGS_SCHEMA: body.pop("args_schema"), SIGNATURE_KEY: json.dumps(body)}
        schema = body.pop("return_schema")
        if schema is not None:
            out[RETURN_SCHEMA] = schema
        return out

    @classmethod
    def from_reflection(
        cls, reflection: Mapping[str, str] | None, *, where: str = "the module"
    ) -> CallSignature | None:
        """The signature a compiled function's reflection records, or None (no records, or
        records of a newer format or pytree protocol than this version reads: the function is
        then called with flat arguments).

        Every field the calls rely on is checked here, when the module is loaded, so that a
        damaged record is an error that names it, not an exception at the first call.

        Raises:
            TurbineRuntimeError: a record is damaged (not JSON, missing or mistyped fields,
                trees that do not match the leaves); ``where`` names the module in the message.
        """
        if not reflection or SIGNATURE_KEY not in reflection:
            return None
        what = f"its call signature record ({SIGNATURE_KEY})"
        try:
            body = json.loads(reflection[SIGNATURE_KEY])
            if not isinstance(body, dict):
                raise TypeError(f"a JSON {type(body).__name__}, not an object")
            fmt = body.get("format", 0)
            if not isinstance(fmt, int):
                raise TypeError(f"format is {type(fmt).__name__}, not an integer")
        except (ValueError, TypeError, RecursionError) as e:
            raise damaged_module_error(where, what, e) from e
        if fmt > SIGNATURE_FORMAT:
            logger.warning(
                "call signature format %s is newer than this turbine-aot reads; calls take "
                "flat arguments",
                fmt,
            )
            return None
        if ARGS_SCHEMA not in reflection:
            missing = KeyError(f"{ARGS_SCHEMA} is missing")
            raise damaged_module_error(
                where, f"its argument tree ({ARGS_SCHEMA})", missing
            ) from missing
        body["args_schema"] = reflection[ARGS_SCHEMA]
        body["return_schema"] = reflection.get(RETURN_SCHEMA)
        try:
            sig = cls.from_json(body)
            sig._check_leaves()
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
            raise damaged_module_error(where, what, e) from e
        try:
            sig._check_trees(where)
        except TurbineRuntimeError:
            for key in (ARGS_SCHEMA, RETURN_SCHEMA):
                newer = newer_pytree_protocol(reflection.get(key))
                if newer is not None:  # not damage: a module from a newer torch
                    logger.warning(
                        "%s: the %s record uses pytree protocol %s, newer than this torch "
                        "reads; calls take flat arguments",
                        where,
                        key,
                        newer,
                    )
                    return None
            raise
        return sig

    def _check_leaves(self) -> None:
        """Raises ValueError/TypeError naming the first field of the record that has a wrong
        type or value (what ``from_json`` converts leniently is checked here)."""
        if not isinstance(self.args_schema, str):
            raise TypeError("args_schema is not a string")
        if self.return_schema is not None and not isinstance(self.return_schema, str):
            raise TypeError("return_schema is not a string")
        for i, n in enumerate(self.arg_names):
            if not isinstance(n, str):
                raise TypeError(f"arg_names[{i}] is {type(n).__name__}, not a string")
        for group, leaves in (("args", self.args), ("results", self.results)):
            for i, leaf in enumerate(leaves):
                check_leaf_record(f"{group}[{i}]", leaf)
            indices = [leaf.index for leaf in leaves if leaf.index is not None]
            if sorted(indices) != list(range(len(indices))):
                raise ValueError(
                    f"{group}: the flat indices {indices} are not 0..{len(indices) - 1}"
                )
        for sym, (lo, hi) in self.dims.items():
            if (
                not isinstance(sym, str)
                or lo < 0
                or not (hi is None or type(hi) is int)
                or (hi is not None and hi < lo)
            ):
                raise ValueError(f"dims[{sym!r}]: the range {lo}..{hi} is not a valid size range")
        if not isinstance(self.defaults, dict) or not all(
            isinstance(k, str) for k in self.defaults
        ):
            raise TypeError("defaults is not an object of names")

    def _check_trees(self, where: str) -> None:
        """The argument tree is a (positional tuple or list, keyword dict) pair with one leaf
        per recorded argument; the result tree has one leaf per recorded result."""
        try:
            spec = load_spec(self.args_schema, warn=False)
            children = spec_children(spec)
            if spec.type is not tuple or len(children) != 2:
                raise ValueError("not a (positional, keyword) pair")
            pos, kw = children
            if pos.type not in (tuple, list) or kw.type is not dict:
                raise ValueError("not a (positional tuple or list, keyword dict) pair")
            if not all(isinstance(k, str) for k in (kw.context or [])):
                raise ValueError("keyword names are not strings")
            if spec.num_leaves != len(self.args):
                raise ValueError(
                    f"{spec.num_leaves} leaves for {len(self.args)} recorded arguments"
                )
        except Exception as e:  # torch's reader raises whatever a damaged tree makes it hit
            raise damaged_module_error(where, f"its argument tree ({ARGS_SCHEMA})", e) from e
        if self.return_schema is None:
            return
        try:
            out = load_spec(self.return_schema, warn=False)
            if out.num_leaves != len(self.results):
                raise ValueError(
                    f"{out.num_leaves} leaves for {len(self.results)} recorded results"
                )
        except Exception as e:
            raise damaged_module_error(where, f"its result tree ({RETURN_SCHEMA})", e) from e

    # ---- flat ABI view
    def flat_inputs(self) -> list[Leaf]:
        """The non-constant argument leaves, by function argument index."""
        return sorted((a for a in self.args if a.index is not None), key=lambda a: a.index or 0)

    def flat_results(self) -> list[Leaf]:
        return sorted((a for a in self.results if a.index is not None), key=lambda a: a.index or 0)

    # ---- calling
    def tree(self, which: str) -> Any:
        """The parsed ``args_schema`` or ``return_schema`` (``which``). Parsed once per
        signature when every node type is known here (a call would otherwise parse both trees'
        JSON again: docs/running.md, "What a call costs"); a tree read with dicts in place of
        unknown types is parsed at each call, so that it reads right once their package is
        imported."""
        cache: dict[str, Any] = self.__dict__.setdefault("_trees", {})  # frozen: not a field
        spec = cache.get(which)
        if spec is None:
            spec, exact = load_spec_exact(getattr(self, which))
            if exact:
                cache[which] = spec
        return spec

    def argument_specs(self) -> tuple[Any, Any, list[str]]:
        """The positional and keyword argument specs, and the arguments' names (positional
        first, then the keywords): the recorded names, or ``arg0``, ``arg1``, ... and the
        keywords' own when fewer were recorded."""
        kept = self.__dict__.get("_argument_specs")
        if kept is not None:
            return kept[0], kept[1], list(kept[2])
        args_tree = self.tree("args_schema")
        pos_spec, kw_spec = spec_children(args_tree)
        n_pos = pos_spec.num_children
        kw_names = [str(k) for k in (kw_spec.context or [])]
        names = list(self.arg_names)
        if len(names) < n_pos + len(kw_names):
            names = [f"arg{i}" for i in range(n_pos)] + kw_names
        names = names[: n_pos + len(kw_names)]
        if "args_schema" in self.__dict__["_trees"]:  # kept by tree(): parsed exactly
            self.__dict__["_argument_specs"] = (pos_spec, kw_spec, tuple(names))
        return pos_spec, kw_spec, names

    def _positional_plan(self) -> tuple[tuple[Any, tuple[Any, ...] | None, Leaf], ...] | None:
        """Per argument, in call order: (torch dtype, static shape or None where a dimension is
        dynamic, leaf), where every top-level argument is one tensor leaf of a tree kept as
        recorded (:meth:`bind_positional`'s case); None otherwise. Computed once."""
        if "_kept_positional_plan" in self.__dict__:
            return self.__dict__["_kept_positional_plan"]
        plan = None
        try:
            pos_spec, kw_spec, names = self.argument_specs()
            children = [*spec_children(pos_spec), *spec_children(kw_spec)]
            if (
                "_argument_specs" in self.__dict__  # the tree was read exactly
                and len(children) == len(names) == len(self.args)
                and all(c.is_leaf() for c in children)
                and all(a.kind == "tensor" and a.index is not None and a.dtype for a in self.args)
            ):
                dtypes = [element_type_name(str(a.dtype)) for a in self.args]
                if all(d is not None for d in dtypes):
                    plan = tuple(
                        (
                            dtype,
                            tuple(a.shape) if all(isinstance(d, int) for d in a.shape) else None,
                            a,
                        )
                        for dtype, a in zip(dtypes, self.args)
                    )
        except Exception:  # a tree this cannot read: bind() reports it
            plan = None
        self.__dict__["_kept_positional_plan"] = plan
        return plan

    def bind_positional(self, args: Sequence[Any]) -> list[Any] | None:
        """:meth:`bind` for the common call, the function's tensors passed positionally in their
        recorded order, with less work per call (docs/running.md, "What a call costs"): the
        compiled function's flat arguments, or None where the call is of another kind or fails
        a check (then :meth:`bind` binds it, and raises its error)."""
        import torch

        plan = self._positional_plan()
        if plan is None or len(args) != len(plan):
            return None
        flat: list[Any] = [None] * len(plan)
        symbols: dict[str, tuple[int, str]] | None = None
        for value, (dtype, shape, leaf) in zip(args, plan):
            if type(value) is not torch.Tensor or value.dtype is not dtype:
                return None
            if shape is not None:
                if value.shape != shape:
                    return None
            else:
                if symbols is None:
                    symbols = {}
                try:
                    check_tensor("", leaf, value, self.dims, symbols)
                except Exception:
                    return None
            flat[leaf.index] = value  # type: ignore[index]
        return flat

    def bind(self, fn_label: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[Any]:
        """Binds and checks a call; returns the compiled function's flat arguments.

        Raises:
            CallArgumentTypeError: wrong count, an unknown, repeated or missing keyword, a
                structure (tuple length, dict keys, None) other than the recorded one, a
                non-tensor where a tensor is expected.
            CallArgumentValueError: dtype, rank, a static dimension, a dynamic dimension out of
                its range or inconsistent with another argument's, a specialized constant with
                another value.
        """
        pos_spec, kw_spec, all_names = self.argument_specs()
        n_pos = pos_spec.num_children
        pos_names = all_names[:n_pos]
        kw_names = [str(k) for k in (kw_spec.context or [])]
        # Keywords exported as keywords can also be given positionally, in the names' order.
        positional_ok = all_names
        if len(args) > len(positional_ok):
            raise type_error(
                f"{fn_label}() takes {len(positional_ok)} positional argument(s) "
                f"({', '.join(positional_ok) or 'none'}); got {len(args)}"
            )
        bound: dict[str, Any] = dict(zip(positional_ok, args))
        for k, v in kwargs.items():
            if k in bound:
                raise type_error(f"{fn_label}() got multiple values for argument {k!r}")
            if k not in all_names:
                if k in self.defaults and same_constant(v, self.defaults[k]):
                    continue  # the default the export used
                if k in self.defaults:
                    raise value_error(
                        f"{fn_label}(): argument {k!r} was not passed at export, so the compiled "
                        f"program uses its default {value_text(self.defaults[k])}; got "
                        f"{describe(v)}. Export again passing {k}=..."
                    )
                raise type_error(
                    f"{fn_label}() got an unexpected keyword argument {k!r}; it takes "
                    f"{', '.join(all_names) or 'no arguments'}"
                )
            bound[k] = v
        missing = [n for n in all_names if n not in bound]
        if missing:
            raise type_error(
                f"{fn_label}() missing {len(missing)} required argument(s): "
                f"{', '.join(repr(n) for n in missing)}"
            )
        leaves: list[Any] = []
        pos_children = pos_spec.children() if hasattr(pos_spec, "children") else []
        for name, child in zip(pos_names, pos_children):
            flatten_like(fn_label, bound[name], child, name, leaves)
        kw_children = kw_spec.children() if hasattr(kw_spec, "children") else []
        for name, child in zip(kw_names, kw_children):
            flatten_like(fn_label, bound[name], child, name, leaves)
        if len(leaves) != len(self.args):
            raise type_error(
                f"{fn_label}(): the call has {len(leaves)} leaves but the recorded signature "
                f"{len(self.args)}; the module's records are inconsistent: export it again"
            )
        flat: list[Any] = [None] * len(self.flat_inputs())
        symbols: dict[str, tuple[int, str]] = {}
        for leaf, (_path, value) in zip(self.args, leaves):
            converted = self.check_leaf(fn_label, leaf, value, symbols)
            if leaf.index is not None:
                flat[leaf.index] = converted
        return flat

    def unflatten_inputs(self, flat: Sequence[Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The eager call's ``(args, kwargs)`` from the compiled function's flat arguments
        (constants specialized at export put back)."""
        from torch.utils._pytree import tree_unflatten

        leaves = [flat[a.index] if a.index is not None else a.value for a in self.args]
        pos, kw = tree_unflatten(leaves, self.tree("args_schema"))
        return tuple(pos), dict(kw)

    def check_flat(self, fn_label: str, flat: Sequence[Any]) -> None:
        """The same per-argument checks for the compiled function's flat arguments (the CLI's
        ``run``): dtype, rank, static dims, dynamic dims against their ranges."""
        inputs = self.flat_inputs()
        if len(flat) != len(inputs):
            raise type_error(
                f"{fn_label}() takes {len(inputs)} tensor argument(s) "
                f"({', '.join(f'{a.path}: {a.type_text()}' for a in inputs)}); got {len(flat)}"
            )
        symbols: dict[str, tuple[int, str]] = {}
        for leaf, value in zip(inputs, flat):
            self.check_leaf(fn_label, leaf, value, symbols)

    def check_leaf(
        self, fn_label: str, leaf: Leaf, value: Any, symbols: dict[str, tuple[int, str]]
    ) -> Any:
        """Checks one leaf's value; returns it (numpy arrays as tensors)."""
        import torch

        where = f"{fn_label}(): argument {leaf.path}"
        if leaf.kind == "constant":
            if not same_constant(value, leaf.value):
                raise value_error(
                    f"{where} was specialized to {value_text(leaf.value)} at export; got "
                    f"{describe(value)}. Export again with that value, or make it a tensor to "
                    "vary it"
                )
            return value
        if leaf.kind == "scalar":
            if isinstance(value, torch.Tensor) or not isinstance(value, (bool, int, float)):
                raise type_error(
                    f"{where} expects a Python number ({leaf.dtype}); got {describe(value)}"
                )
            return value
        if type(value).__module__ == "numpy" and hasattr(value, "dtype"):
            value = torch.from_numpy(value)
        if not isinstance(value, torch.Tensor):
            raise type_error(f"{where} expects a tensor {leaf.type_text()}; got {describe(value)}")
        check_tensor(where, leaf, value, self.dims, symbols)
        return value


def rebuild_results(sig: CallSignature, flat: Sequence[Any]) -> Any:
    """The recorded result structure from the compiled function's flat results (constants put
    back where they were)."""
    from torch.utils._pytree import tree_unflatten

    assert sig.return_schema is not None
    leaves: list[Any] = []
    for leaf in sig.results:
        if leaf.index is None:
            leaves.append(leaf.value)
        elif leaf.index < len(flat):
            leaves.append(flat[leaf.index])
        else:
            raise TurbineRuntimeError(
                f"the function returned {len(flat)} result(s) but its recorded signature has "
                f"result {leaf.path} at index {leaf.index}; the module's records are "
                "inconsistent: export it again"
            )
    builder = sig.__dict__.get("_result_builder")
    if builder is not None:
        return builder(leaves)
    spec = sig.tree("return_schema")
    if "return_schema" not in sig.__dict__.get("_trees", {}):
        return tree_unflatten(leaves, spec)  # a tree parsed anew each call (CallSignature.tree)
    # a tree kept for the signature: its builder too (a ModelOutput at the root from a template
    # after the first call: model_outputs.py)
    if is_model_output_type(spec.type):
        builder = ModelOutputBuilder(spec, tree_unflatten)
    else:
        builder = lambda flat_leaves: tree_unflatten(flat_leaves, spec)  # noqa: E731
    return sig.__dict__.setdefault("_result_builder", builder)(leaves)
