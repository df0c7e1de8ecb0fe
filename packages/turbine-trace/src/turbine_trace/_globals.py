"""Globals descriptors (export_global, export_parameters, ...): tensors and scalars as a module's globals.

A ``GlobalsDef`` describes a tree of values and how to make globals of them
(``GlobalAttributes``); ``track()`` creates the globals in a ``ModuleBuilder`` and returns the same
tree with each leaf replaced by an ``IrGlobalTensor`` / ``IrGlobalScalar`` intrinsic that loads
(and, when mutable, stores) the global inside procedures.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from turbine_ir import GlobalAttributes
from turbine_ir.ir import (
    F64Type,
    FloatAttr,
    IntegerAttr,
    IntegerType,
)
from turbine_params import is_wrapper_subclass

from ._abstract import (
    Abstractifiable,
    AbstractScalar,
    AbstractTensor,
    AbstractTypedef,
    TreeAbstractifiable,
    abstractify,
    abstractify_single_value,
)
from ._errors import TraceError
from ._global_intrinsics import IrGlobalScalar, IrGlobalTensor
from ._tree import TreeSpec, tree_flatten, tree_map, tree_unflatten

if TYPE_CHECKING:
    from turbine_ir import ModuleBuilder


__all__ = [
    "GlobalsDef",
    "GlobalsDefError",
    "export_buffers",
    "export_global",
    "export_global_tree",
    "export_parameters",
]

NameMapCallback = Callable[[str], "str | None"]


class GlobalsDefError(TraceError, TypeError):
    """A value given to a globals descriptor cannot become a global."""


class GlobalsDef:
    """Base class for all exporting descriptors.

    Args:
        attrs: How the globals are created (mutability, externalization, …).
    """

    __slots__ = ["_attrs"]

    def __init__(self, attrs: GlobalAttributes):
        self._attrs = attrs

    @property
    def attrs(self) -> GlobalAttributes:
        """The attributes every global of this descriptor is created with."""
        return self._attrs

    def items(self) -> Generator[tuple[str, Any], None, None]:
        """Yields tuples of name/value exports."""
        raise NotImplementedError

    def schema(self) -> TreeSpec:
        """A schema used to unflatten for access from Python."""
        raise NotImplementedError

    def track(self, module_builder: ModuleBuilder, export_namespace: str) -> Any:
        """Track the given pack of globals, returning a struct that can be used to access them.

        Each ``(name, value)`` of ``items()`` becomes a global with symbol
        ``_<export_namespace>.<name>`` (uniqued by the module builder) and logical name
        ``<export_namespace>.<name>``: the key of an external parameter, after ``name_mapper``
        (``params.fc.weight`` for ``params = export_parameters(m, external=True)``, as in the
        reference; a tensor's ``ExternalTensorTrait`` name wins). The result has the shape of
        ``schema()`` with ``IrGlobalTensor`` / ``IrGlobalScalar`` leaves.

        Args:
            module_builder: The module to create the globals in.
            export_namespace: Prefix of the global names (the attribute name in a
                ``CompiledModule``).

        Raises:
            GlobalsDefError: a value is not a tensor, abstract tensor/scalar or Python scalar.
        """
        flat_globals = []
        for name, value in self.items():
            fq_name = f"{export_namespace}.{name}" if export_namespace else name
            flat_globals.append(_create_global(module_builder, self, fq_name, value))
        return tree_unflatten(flat_globals, self.schema())


def _create_global(
    module_builder: ModuleBuilder, info: GlobalsDef, fq_name: str, value: Any
) -> IrGlobalTensor | IrGlobalScalar:
    attrs = info.attrs
    symbol = f"_{fq_name}"
    if is_wrapper_subclass(value):
        raise GlobalsDefError(
            f"global {fq_name!r}: a {type(value).__module__.split('.')[0]} "
            f"{type(value).__name__} is a tensor subclass (a quantized weight), which a globals "
            "descriptor cannot hold as one global; export the model with "
            "turbine_aot.export(model, args=...) or llm.export_causal_lm, which import it as "
            "globals of its inner tensors (docs/quantization.md)"
        )
    if isinstance(value, torch.Tensor):
        # One global per tensor (and per tied storage): a tensor exported twice, or later
        # referenced by an imported FX program, resolves to the first global.
        mapping = module_builder.global_ref_tracker.track(value)
        if not mapping.is_empty:
            existing = mapping.value
            if isinstance(existing, IrGlobalTensor):
                if existing.info.attrs.mutable != attrs.mutable:
                    raise GlobalsDefError(
                        f"global {fq_name!r}: this tensor is already exported as "
                        f"{existing.export_name!r} (@{existing.symbol_name}, "
                        f"mutable={existing.info.attrs.mutable}); one tensor is one global, so "
                        f"it cannot also be exported with mutable={attrs.mutable}; export a "
                        "clone, or export it once with the mutability it needs"
                    )
                return existing
            actual_symbol, global_op, global_type = existing
        else:
            actual_symbol, global_op, global_type = module_builder.create_tensor_global(
                symbol, value, attrs=attrs, logical_name=fq_name
            )
        ir_global = IrGlobalTensor(
            fq_name,
            info,
            symbol_name=actual_symbol,
            global_op=global_op,
            global_type=global_type,
            dtype=value.dtype,
        )
        mapping.value = ir_global
        return ir_global
    if isinstance(value, AbstractTensor):
        global_type = value.get_ir_type(module_builder)
        actual_symbol, global_op = module_builder.create_typed_global(
            symbol, global_type, attrs=attrs, logical_name=fq_name
        )
        return IrGlobalTensor(
            fq_name,
            info,
            symbol_name=actual_symbol,
            global_op=global_op,
            global_type=global_type,
            dtype=value.dtype,
        )
    if isinstance(value, AbstractScalar):
        global_type = value.get_ir_type(module_builder)
        actual_symbol, global_op = module_builder.create_typed_global(
            symbol, global_type, attrs=_scalar_attrs(attrs), logical_name=fq_name
        )
        return IrGlobalScalar(
            fq_name,
            info,
            symbol_name=actual_symbol,
            global_op=global_op,
            global_type=global_type,
        )
    if isinstance(value, (bool, int, float)):
        with module_builder.context:
            if isinstance(value, bool):
                global_type = IntegerType.get_signless(1)
                initial = IntegerAttr.get(global_type, int(value))
            elif isinstance(value, int):
                global_type = IntegerType.get_signless(64)
                initial = IntegerAttr.get(global_type, value)
            else:
                global_type = F64Type.get()
                initial = FloatAttr.get(global_type, value)
        scalar_attrs = _scalar_attrs(attrs)
        actual_symbol, global_op = module_builder.create_typed_global(
            symbol, global_type, attrs=scalar_attrs, logical_name=fq_name
        )
        if not scalar_attrs.uninitialized:
            global_op.attributes["initial_value"] = initial
        return IrGlobalScalar(
            fq_name,
            info,
            symbol_name=actual_symbol,
            global_op=global_op,
            global_type=global_type,
        )
    raise GlobalsDefError(
        f"global {fq_name!r}: cannot export a value of type {type(value).__name__} "
        f"({value!r:.60}) as a global; supported leaves: torch.Tensor, AbstractTensor, "
        "AbstractScalar (e.g. AbstractI64) and Python bool/int/float"
    )


def _scalar_attrs(attrs: GlobalAttributes) -> GlobalAttributes:
    # Scalars are never parameters in an archive: keep mutability, drop externalization.
    return GlobalAttributes(
        mutable=attrs.mutable,
        external=False,
        noinline=attrs.noinline,
        uninitialized=bool(attrs.uninitialized),
    )


def _make_attrs(
    attrs: GlobalAttributes | None,
    *,
    mutable: bool,
    external: bool | None,
    external_scope: str | None,
    name_mapper: NameMapCallback | None,
    noinline: bool,
    uninitialized: bool | None,
    initialize: bool = True,
) -> GlobalAttributes:
    if attrs is not None:
        return attrs
    if not initialize:
        uninitialized = True
    return GlobalAttributes(
        mutable=mutable,
        external=external,
        external_scope=external_scope,
        name_mapper=name_mapper,
        noinline=noinline,
        uninitialized=uninitialized,
    )


class export_global(GlobalsDef, Abstractifiable):
    """Exports a single global into a CompiledModule.

    Args:
        value: A ``torch.Tensor`` (its contents initialize the global), an ``AbstractTensor`` /
            ``AbstractScalar`` (an uninitialized or external global of that type) or a Python
            bool/int/float (a scalar global: i1 / i64 / f64).
        name: The name of the global within its namespace.
        initialize: ``False`` is the same as ``uninitialized=True``.
        mutable: Procedures may assign to the global.
        external: Load the tensor from a parameter archive (``None``: inferred from an
            ``ExternalTensorTrait`` on the tensor).
        name_mapper: Maps the full dotted name (``<attribute>.<name>``, e.g. ``state.global``)
            to the parameter key (``None`` result: keep the full name).
        external_scope: Parameter scope of an external global (default ``"model"``).
        noinline: Keep the global's contents out of the IR even when small.
        uninitialized: Create the global without an initial value.
        attrs: A complete ``GlobalAttributes``; overrides the individual options.
    """

    __slots__ = ["_name", "_schema", "_value"]

    def __init__(
        self,
        value: Any,
        *,
        name: str = "global",
        initialize: bool = True,
        mutable: bool = False,
        external: bool | None = None,
        external_scope: str | None = None,
        name_mapper: NameMapCallback | None = None,
        noinline: bool = False,
        uninitialized: bool | None = None,
        attrs: GlobalAttributes | None = None,
    ):
        super().__init__(
            _make_attrs(
                attrs,
                mutable=mutable,
                external=external,
                external_scope=external_scope,
                name_mapper=name_mapper,
                noinline=noinline,
                uninitialized=uninitialized,
                initialize=initialize,
            )
        )
        self._name = name
        self._value = value
        _, self._schema = tree_flatten(value)

    def items(self) -> Generator[tuple[str, Any], None, None]:
        """Yields tuples of name/value exports."""
        yield (self._name, self._value)

    def schema(self) -> TreeSpec:
        """A schema used to unflatten for access from Python."""
        return self._schema

    def abstractify(self) -> AbstractTypedef:
        return abstractify_single_value(self._value)


class export_global_tree(GlobalsDef, Abstractifiable):
    """Exports a tree of globals into a CompiledModule.

    Leaves are named by their path: ``{"a": [t0, t1], "b": t2}`` gives ``a.0``, ``a.1`` and ``b``.

    Args:
        tree: A pytree (dict/list/tuple) whose leaves are what ``export_global`` accepts.
        Other args: as for ``export_global``.
    """

    __slots__ = ["_names", "_schema", "_tree", "_values"]

    def __init__(
        self,
        tree: Any,
        *,
        initialize: bool = True,
        mutable: bool = False,
        external: bool | None = None,
        external_scope: str | None = None,
        name_mapper: NameMapCallback | None = None,
        noinline: bool = False,
        uninitialized: bool | None = None,
        attrs: GlobalAttributes | None = None,
    ):
        super().__init__(
            _make_attrs(
                attrs,
                mutable=mutable,
                external=external,
                external_scope=external_scope,
                name_mapper=name_mapper,
                noinline=noinline,
                uninitialized=uninitialized,
                initialize=initialize,
            )
        )
        self._tree = tree
        self._values, self._schema = tree_flatten(tree)
        self._names = _leaf_names(tree)

    def items(self) -> Generator[tuple[str, Any], None, None]:
        """Yields tuples of name/value exports."""
        yield from zip(self._names, self._values)

    def schema(self) -> TreeSpec:
        """A schema used to unflatten for access from Python."""
        return self._schema

    def abstractify(self) -> Any:  # type: ignore[override]
        return abstractify(self._tree)


def _leaf_names(tree: Any) -> list[str]:
    from torch.utils._pytree import tree_flatten_with_path

    names = []
    for path, _ in tree_flatten_with_path(tree)[0]:
        parts = []
        for entry in path:
            for attr in ("key", "idx", "name"):
                if hasattr(entry, attr):
                    parts.append(str(getattr(entry, attr)))
                    break
            else:
                parts.append(str(entry))
        names.append(".".join(parts) if parts else "global")
    return names


class _ModuleTensorsDef(GlobalsDef, TreeAbstractifiable):
    """The tensors of an nn.Module that ``_named_tensors`` lists, as globals."""

    __slots__ = ["_param_list", "_schema", "_tree"]
    #: The ``nn.Module`` method listing the tensors (``named_parameters`` / ``named_buffers``).
    _named_tensors: ClassVar[str]

    def __init__(
        self,
        nn_module: torch.nn.Module,
        *,
        mutable: bool = False,
        external: bool | None = None,
        external_scope: str | None = None,
        name_mapper: NameMapCallback | None = None,
        noinline: bool = False,
        uninitialized: bool | None = None,
        attrs: GlobalAttributes | None = None,
    ):
        _check_module(nn_module, type(self).__name__)
        super().__init__(
            _make_attrs(
                attrs,
                mutable=mutable,
                external=external,
                external_scope=external_scope,
                name_mapper=name_mapper,
                noinline=noinline,
                uninitialized=uninitialized,
            )
        )
        named: list[tuple[str, torch.Tensor]] = list(getattr(nn_module, self._named_tensors)())
        self._param_list = named
        self._tree = dict(named)
        _, self._schema = tree_flatten(self._tree)

    def items(self) -> Generator[tuple[str, Any], None, None]:
        """Yields tuples of name/value exports."""
        yield from self._param_list

    def schema(self) -> TreeSpec:
        """A schema used to unflatten for access from Python."""
        return self._schema

    def abstractify_tree(self) -> Any:
        return tree_map(abstractify_single_value, self._tree)

    def __getitem__(self, key: str) -> Any:
        return self._tree[key]


class export_parameters(_ModuleTensorsDef):
    """Exports parameters from an nn.Module.

    These are exposed to procedural programs as a dictionary of param/values (keys are
    ``named_parameters()`` names; the global of ``fc.weight`` exported as ``params`` is
    ``@_params.fc.weight``).

    Args:
        nn_module: The module whose parameters to export.
        Other args: as for ``export_global``.
    """

    __slots__ = ()
    _named_tensors = "named_parameters"


class export_buffers(_ModuleTensorsDef):
    """Exports buffers from an nn.Module.

    These are exposed to procedural programs as a dictionary of param/values.

    Args:
        nn_module: The module whose (persistent and non-persistent) buffers to export.
        Other args: as for ``export_global``.
    """

    __slots__ = ()
    _named_tensors = "named_buffers"


def _check_module(m: Any, what: str) -> None:
    if not isinstance(m, torch.nn.Module):
        raise GlobalsDefError(f"{what} needs a torch.nn.Module, got {type(m).__name__}")
