"""FxPrograms: a named set of ExportedPrograms that share state; FxProgramsBuilder makes one.

torch gives every ExportedProgram its own ``state_dict`` and ``constants``; several entry points
of one model (prefill and decode) then look like several copies of the weights. Here the programs
of a set keep referring to the *same* tensor objects, so importing them into one module yields one
set of globals (the ModuleBuilder dedupes by identity), and saving stores each tensor once.

On disk (``save(path)``), next to the descriptor ``path`` (JSON), ``<gen>`` being new for each
save:

* ``<stem>.<gen>.<program>.ep.json``: each program's graph, serialized by torch's
  ExportedProgram serializer (JSON) with its tensors replaced by meta-device stand-ins;
* ``<stem>.<gen>.tensors.safetensors``: every distinct tensor that has data, once (tensors that
  are views of one storage: that storage once, and each tensor as a view of it);
* the descriptor: format/version, programs (file, argument device affinities), tensors (dtype,
  shape, kind, traits, where the data is) and, per program, which tensor each state_dict /
  constants entry is.

The set is saved atomically: the files of a save have names of their own, and the descriptor,
replaced atomically last, commits them; the previous set's files are removed after that. A save
that fails part way leaves the previous set as it was (and removes what it wrote).

``load(path)`` reads JSON and safetensors only — it never unpickles anything — and rebinds every
program's state to the shared tensors.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from torch.export import ExportedProgram

from turbine_params import (
    DeviceAffinity,
    DeviceTensorTrait,
    ExternalTensorTrait,
    ParameterArchiveError,
    atomic_write_bytes,
    write_safetensors,
)

from ._decompositions import current_aot_decompositions
from ._errors import FxProgramsError
from ._fx_programs_cleanup import remove_orphans, saving_marker
from ._fx_programs_validate import CheckedDescriptor, check_descriptor, check_graph, dtype_named

__all__ = ["FxProgram", "FxPrograms", "FxProgramsBuilder", "program_and_arg_device"]

_FORMAT = "turbine-fx-programs"
_VERSION = 1
# Version 2: some tensors are views of a stored storage ("storage" in their description). Written
# only then, so readers of version 1 still read every set without shared storage.
_VERSION_SHARED_STORAGE = 2
_VERSIONS = (_VERSION, _VERSION_SHARED_STORAGE)


class FxProgram:
    """One program of an :class:`FxPrograms` set, as the reference stores it.

    Attributes:
        target: The ``torch.export.ExportedProgram``.
        arg_device: ``{flat argument index: DeviceAffinity}`` or ``None``.

    Other attribute reads (``state_dict``, ``graph``, ...) are forwarded to ``target``, so code
    written against bare ``ExportedProgram`` values keeps working.
    """

    __slots__ = ("arg_device", "target")

    def __init__(self, target: ExportedProgram, *, arg_device: Mapping[int, Any] | None = None):
        self.target = target
        self.arg_device: dict[int, Any] | None = dict(arg_device) if arg_device else None

    def __getattr__(self, name: str) -> Any:
        if name in FxProgram.__slots__:  # not set yet (copy/unpickle): no forwarding loop
            raise AttributeError(name)
        return getattr(self.target, name)

    def __repr__(self) -> str:
        return f"FxProgram(target=<ExportedProgram>, arg_device={self.arg_device!r})"


def program_and_arg_device(value: Any) -> tuple[ExportedProgram, dict[int, Any] | None]:
    """``(ExportedProgram, arg_device)`` of a ``programs`` value: an :class:`FxProgram`, or a bare
    ``ExportedProgram`` a user put in the dict (its affinities then come from ``arg_devices``)."""
    if isinstance(value, FxProgram):
        return value.target, value.arg_device
    return value, None


class FxPrograms:
    """Represents a named set of ExportedPrograms whose lifted tensors are shared.

    Attributes:
        programs: Program name → :class:`FxProgram` (``.target``: the ``ExportedProgram``,
            ``.arg_device``), insertion ordered.
        arg_devices: Program name → ``{flat argument index: DeviceAffinity}``.
    """

    def __init__(self) -> None:
        self.programs: dict[str, FxProgram] = {}
        self.arg_devices: dict[str, dict[int, Any]] = {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(programs={list(self.programs)})"

    # Saving ---------------------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> int:
        """Saves the set of exported programs to a descriptor file (plus files beside it).

        Each tensor shared by several programs (or several names) is stored once, and distinct
        tensors over one storage (a buffer that is a slice of a weight) load as views of one
        storage again. The set is replaced atomically: if saving fails part way, ``path`` and
        the files it names are left as they were (see the module docstring).

        Args:
            path: The descriptor file to write (JSON); sibling files share its stem.

        Returns:
            The number of tensor references deduplicated (references minus distinct tensors).

        Raises:
            FxProgramsError: The set is empty or holds state that cannot be saved.
        """
        if not self.programs:
            raise FxProgramsError("FxPrograms.save: the set has no programs to save")
        path = Path(path)
        stem = path.name[: -len(path.suffix)] if path.suffix else path.name
        generation = uuid.uuid4().hex[:12]
        tensor_ids: dict[int, str] = {}
        tensors: dict[str, torch.Tensor] = {}
        tensor_meta: dict[str, dict[str, Any]] = {}
        bindings: dict[str, dict[str, dict[str, str]]] = {}
        references = 0

        def key_for(t: torch.Tensor, owner: str) -> str:
            nonlocal references
            references += 1
            key = tensor_ids.get(id(t))
            if key is None:
                key = f"t{len(tensor_ids)}"
                tensor_ids[id(t)] = key
                tensors[key] = t
                tensor_meta[key] = _describe_tensor(t, owner)
            return key

        descriptor_programs: dict[str, Any] = {}
        graphs: dict[str, bytes] = {}  # written once every program is known to be saveable
        for name, value in self.programs.items():
            _check_name(name)
            ep, _ = program_and_arg_device(value)
            sd_keys = {k: key_for(v, f"{name}:{k}") for k, v in ep.state_dict.items()}
            const_keys = {}
            for k, v in ep.constants.items():
                if not isinstance(v, torch.Tensor):
                    raise FxProgramsError(
                        f"program '{name}' has constant '{k}' of type {type(v).__name__}; only "
                        "tensor constants can be saved (script objects are not supported)"
                    )
                const_keys[k] = key_for(v, f"{name}:{k}")
            bindings[name] = {"state_dict": sd_keys, "constants": const_keys}
            graph_file = f"{stem}.{generation}.{name}.ep.json"
            graphs[graph_file] = _serialize_graph(ep)
            descriptor_programs[name] = {
                "file": graph_file,
                "arg_device": {
                    str(i): [a.ordinal, a.queues] for i, a in self.arg_devices.get(name, {}).items()
                },
            }

        data_file = f"{stem}.{generation}.tensors.safetensors"
        previous = _files_of_descriptor(path, stem)
        written: list[Path] = []
        path.parent.mkdir(parents=True, exist_ok=True)
        # The marker tells a cleanup running meanwhile that this generation is being written.
        with saving_marker(path.parent, stem, generation):
            try:
                for graph_file, graph in graphs.items():
                    written.append(path.parent / graph_file)
                    atomic_write_bytes(path.parent / graph_file, graph, parents=True)
                written.append(path.parent / data_file)
                _save_tensor_data(path.parent / data_file, tensors, tensor_meta)
                shared = any("storage" in m for m in tensor_meta.values())
                descriptor = {
                    "format": _FORMAT,
                    "version": _VERSION_SHARED_STORAGE if shared else _VERSION,
                    "data_file": data_file,
                    "programs": descriptor_programs,
                    "tensors": tensor_meta,
                    "bindings": bindings,
                }
                # The commit point: until this rename, the previous descriptor names its files.
                atomic_write_bytes(path, json.dumps(descriptor, indent=1).encode(), parents=True)
            except BaseException:
                for f in written:
                    with contextlib.suppress(OSError):
                        f.unlink()
                raise
        for name in previous - {data_file, *graphs}:
            with contextlib.suppress(OSError):
                (path.parent / name).unlink()
        # What saves of this set killed midway left behind.
        remove_orphans(path, stem, {data_file, *graphs})
        return references - len(tensors)

    # Loading --------------------------------------------------------------------------------

    @staticmethod
    def load(path: str | os.PathLike) -> FxPrograms:
        """Loads a set saved by :meth:`save`, with tensor sharing re-established.

        Only JSON and safetensors are read, and nothing of the files is executed: the
        descriptor and every path it names are checked first (each file must be a regular file
        in the descriptor's directory), then every graph file, whose expression strings (which
        torch's deserializer would evaluate) must pass a strict parser, before torch's
        deserializer sees any of them (see docs/security.md).

        Raises:
            FxProgramsError: The descriptor is missing, of another format, or inconsistent; a
                path leaves the directory; a graph file holds a string torch does not write.
                The message names the file and the JSON field.
        """
        path = Path(path)
        try:
            descriptor = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise FxProgramsError(f"cannot read FxPrograms descriptor {path}: {e}") from e
        if isinstance(descriptor, dict) and descriptor.get("format") == _FORMAT:
            remove_orphans(path, path.stem, _files_of_descriptor(path, path.stem, descriptor))
        if not isinstance(descriptor, dict):
            descriptor = {}
        if descriptor.get("format") != _FORMAT or descriptor.get("version") not in _VERSIONS:
            raise FxProgramsError(
                f"{path} is not a turbine FxPrograms descriptor (format "
                f"{descriptor.get('format')!r} version {descriptor.get('version')!r}; expected "
                f"{_FORMAT!r} version {' or '.join(map(str, _VERSIONS))}); write it with "
                "FxPrograms.save (or upgrade turbine-fx)"
            )
        checked = check_descriptor(path, descriptor)
        try:
            return FxPrograms._from_descriptor(path, checked)
        except (KeyError, TypeError, ValueError) as e:
            raise FxProgramsError(f"{path}: inconsistent FxPrograms descriptor ({e!r})") from e

    @staticmethod
    def _from_descriptor(path: Path, checked: CheckedDescriptor) -> FxPrograms:
        descriptor = checked.descriptor
        # Every graph is read and checked before torch's deserializer sees any of them.
        graphs: dict[str, bytes] = {}
        for name, graph_path in checked.graph_paths.items():
            try:
                graphs[name] = graph_path.read_bytes()
            except OSError as e:
                raise FxProgramsError(
                    f"{path}: cannot read the graph of program '{name}': {e}"
                ) from e
            check_graph(graph_path, graphs[name])
        tensors = _load_tensors(checked.data_path, descriptor["tensors"])
        result = FxPrograms()

        for name, info in descriptor["programs"].items():
            binding = descriptor["bindings"][name]
            try:
                state_dict = {k: tensors[v] for k, v in binding["state_dict"].items()}
                constants = {k: tensors[v] for k, v in binding["constants"].items()}
            except KeyError as e:
                raise FxProgramsError(
                    f"{path}: program '{name}' refers to tensor {e} which is not in the descriptor"
                ) from None
            program = _deserialize_graph(graphs[name], state_dict, constants, name)
            result.programs[name] = FxProgram(program)
            if info.get("arg_device"):
                result.arg_devices[name] = {
                    int(i): DeviceAffinity(o, q) for i, (o, q) in info["arg_device"].items()
                }
                result.programs[name].arg_device = dict(result.arg_devices[name])
        return result


class _EntryModule(nn.Module):
    """Presents ``f(root, *args)`` as ``forward`` while sharing root's parameters/buffers by name.

    The wrapper's parameter/buffer/submodule dicts *are* the root's, so state_dict names stay
    the root's (``fc1.weight``, not ``root.fc1.weight``) and tensors stay the same objects.
    """

    # Set through __dict__ (not nn.Module's __setattr__, which would register the root as a
    # submodule); declared so that type checkers know them.
    _turbine_root: nn.Module
    _turbine_f: Callable

    def __init__(self, root: nn.Module, f: Callable):
        super().__init__()
        self.__dict__["_parameters"] = root._parameters
        self.__dict__["_buffers"] = root._buffers
        self.__dict__["_modules"] = root._modules
        self.__dict__["_non_persistent_buffers_set"] = root._non_persistent_buffers_set
        self.__dict__["_turbine_root"] = root
        self.__dict__["_turbine_f"] = f

    def forward(self, *args, **kwargs):
        return self._turbine_f(self._turbine_root, *args, **kwargs)


class FxProgramsBuilder(FxPrograms):
    """Builds a set of exported programs that are all variations of the same root nn.Module.

    Usage::

        fxb = FxProgramsBuilder(model)

        @fxb.export_program(args=(prefill_tokens,))
        def prefill(m, tokens):
            return m.prefill(tokens)

        @fxb.export_program(args=(token, position), name="decode")
        def _(m, token, position):
            return m.decode(token, position)

        fxb.save("model.json")

    Args:
        root_module: The module whose state every program shares.
    """

    def __init__(self, root_module: nn.Module):
        super().__init__()
        if not isinstance(root_module, nn.Module):
            raise FxProgramsError(
                f"FxProgramsBuilder needs an nn.Module, got {type(root_module).__name__}"
            )
        self.root_module = root_module

    def export_program(
        self,
        f: Callable | None = None,
        *,
        args: Any = None,
        kwargs: Mapping[str, Any] | None = None,
        dynamic_shapes: Any = None,
        strict: bool = True,
        name: str | None = None,
        arg_device: Mapping[int, Any] | None = None,
    ):
        """Exports ``f(root_module, *args, **kwargs)`` as a program of this set (a decorator).

        The current AOT decompositions are applied (see :func:`current_aot_decompositions`)
        when the program holds an op of the table or must be functionalized; otherwise the
        program is kept as exported.

        Args:
            f: The function; its first parameter receives the root module.
            args: Example positional arguments (a tuple).
            kwargs: Example keyword arguments.
            dynamic_shapes: As ``torch.export.export`` takes them for a ``forward`` with ``f``'s
                signature after the module: keyed by ``f``'s parameter names (or a tuple in their
                order); ``def f(m, *args)`` takes ``{"args": (spec, spec, ...)}``.
            strict: ``torch.export`` strict mode (TorchDynamo); ``False`` traces with Python.
            name: Program name (default: ``f.__name__``).
            arg_device: Flat argument index → ``DeviceAffinity``.

        Returns:
            The ExportedProgram when called with ``f``, else a decorator returning it (the set
            stores it as an :class:`FxProgram` with the ``arg_device``).
        """

        def export(fn: Callable) -> ExportedProgram:
            program_name = name or getattr(fn, "__name__", None)
            if not program_name or program_name == "<lambda>":
                raise FxProgramsError("export_program: give a name= for a lambda or callable")
            _check_name(program_name)
            if program_name in self.programs:
                raise FxProgramsError(
                    f"export_program: a program named '{program_name}' already exists in this "
                    f"set ({', '.join(self.programs)}); pass another name="
                )
            example_args = tuple(args) if args is not None else ()
            shapes = dynamic_shapes
            if shapes:
                shapes = _dynamic_shapes_for(fn, shapes, len(example_args))
            program = torch.export.export(
                _EntryModule(self.root_module, fn),
                example_args,
                kwargs=dict(kwargs) if kwargs else None,
                dynamic_shapes=shapes,
                strict=strict,
            )
            program = _apply_aot_decompositions(program)
            self.programs[program_name] = FxProgram(program, arg_device=arg_device)
            if arg_device:
                self.arg_devices[program_name] = dict(arg_device)
            return program

        if f is not None:
            return export(f)
        return export


def _dynamic_shapes_for(fn: Callable, shapes: Any, num_args: int) -> Any:
    """Maps the user's ``dynamic_shapes`` for ``fn(module, ...)`` onto the wrapper's ``forward``.

    The user writes specs against ``fn``'s own signature, as ``torch.export.export`` takes them
    for a ``forward`` of that signature: a dict keyed by parameter name, or a tuple in parameter
    order; a ``*args`` parameter takes a tuple with one spec per argument it collects. The
    wrapper takes ``*args, **kwargs``, so torch.export wants ``{"args": (one spec per positional
    argument)}``. (torch 2.13 rejects dynamic shapes for a ``**kwargs`` wrapper; keyword
    arguments stay static.) Specs already in the wrapper's form are passed through.
    """
    import inspect

    params = list(inspect.signature(fn).parameters.values())[1:]  # skip the module
    if isinstance(shapes, (tuple, list)):
        if len(shapes) > len(params):
            return shapes  # not in fn's form: let torch.export report it
        shapes = {p.name: spec for p, spec in zip(params, shapes)}
    if not isinstance(shapes, dict) or not set(shapes) <= {p.name for p in params}:
        return shapes
    specs: list[Any] = []
    for p in params:
        if len(specs) >= num_args:
            break
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            specs.append(shapes.get(p.name))
        elif p.kind == p.VAR_POSITIONAL:
            rest = num_args - len(specs)
            spec = shapes.get(p.name)
            if spec is None:
                specs += [None] * rest
            elif not isinstance(spec, (tuple, list)) or len(spec) != rest:
                raise FxProgramsError(
                    f"export_program: dynamic_shapes[{p.name!r}] needs one spec per argument "
                    f"collected by *{p.name} ({rest}: args has {num_args} elements, "
                    f"{num_args - rest} of them for the parameters before it), got {spec!r}"
                )
            else:
                specs += list(spec)
            break
        else:
            break
    return {"args": tuple(specs)}


def _apply_aot_decompositions(program: ExportedProgram) -> ExportedProgram:
    """Applies the current AOT table only where needed (see ``prepare_program``)."""
    from ._program_prep import prepare_program, prepared_to_exported_program

    prepared = prepare_program(program, current_aot_decompositions())
    if prepared.strategy == "retraced":
        # prepare_program already ran run_decompositions; rebuild over its (copied) graph.
        return prepared_to_exported_program(prepared)
    try:
        return prepared_to_exported_program(prepared)
    except Exception:  # a verifier torch adds later may reject the spliced graph
        return program.run_decompositions(current_aot_decompositions())


def _files_of_descriptor(path: Path, stem: str, descriptor: Any = None) -> set[str]:
    """The files an existing descriptor at ``path`` names (to remove once it is replaced): only
    plain names beside it that start with ``<stem>.``, never anything else. ``descriptor``:
    its content, when already read."""
    if descriptor is None:
        try:
            descriptor = json.loads(path.read_text())
        except (OSError, ValueError):
            return set()
    if not isinstance(descriptor, dict) or descriptor.get("format") != _FORMAT:
        return set()
    programs = descriptor.get("programs")
    names = [descriptor.get("data_file")]
    if isinstance(programs, dict):
        names += [p.get("file") for p in programs.values() if isinstance(p, dict)]
    return {
        n
        for n in names
        if isinstance(n, str)
        and n.startswith(f"{stem}.")
        and n != path.name
        and not any(c in n for c in "/\\\0")
    }


def _check_name(name: str) -> None:
    if not name or any(c in name for c in "/\\\0") or name.startswith("."):
        raise FxProgramsError(
            f"program name {name!r} cannot name a file; use letters, digits, '_' and '.'"
        )


# ------------------------------------------------------------------------------------------
# Tensor descriptions and data


def _describe_tensor(t: torch.Tensor, owner: str) -> dict[str, Any]:

    ext = ExternalTensorTrait.get(t)
    dev = DeviceTensorTrait.get(t)
    return {
        "dtype": str(t.dtype).removeprefix("torch."),
        "shape": list(t.shape),
        "parameter": isinstance(t, nn.Parameter),
        "requires_grad": bool(t.requires_grad),
        "meta": bool(t.is_meta),
        "external": [ext.external_scope, ext.external_name] if ext is not None else None,
        "device_trait": [dev.ordinal, dev.queues] if dev is not None else None,
        "first_use": owner,
    }


def _save_tensor_data(path: Path, tensors: dict[str, torch.Tensor], meta: dict) -> None:
    payload: dict[str, torch.Tensor] = {}
    by_storage: dict[tuple[str, int], list[str]] = {}
    for key, t in tensors.items():
        if t.is_meta:
            continue  # shape/dtype only: a meta tensor has no data
        storage = t.untyped_storage()
        # An empty storage has no address to share (data_ptr 0): each stands alone.
        sid = (str(t.device), storage.data_ptr() if storage.nbytes() else -len(by_storage) - 1)
        by_storage.setdefault(sid, []).append(key)
    for n, keys in enumerate(by_storage.values()):
        if len(keys) == 1:
            payload[keys[0]] = tensors[keys[0]].detach().cpu().contiguous()
            continue
        # Distinct tensors over one storage (a view, a slice of a weight): the storage is stored
        # once (safetensors refuses tensors that share memory) and each tensor as a view of it,
        # so they share it again after load. The whole storage is kept, even bytes no tensor
        # of the set covers.
        first = tensors[keys[0]].detach()
        storage_key = f"storage{n}"
        whole = torch.empty(0, dtype=torch.uint8, device=first.device)
        payload[storage_key] = whole.set_(first.untyped_storage()).cpu()
        for key in keys:
            t = tensors[key]
            meta[key]["storage"] = {
                "data": storage_key,
                "offset": t.storage_offset(),
                "stride": list(t.stride()),
            }
    # turbine_params' writer, not safetensors' save_file: that one writes through a temporary
    # of its own (.tmpXXXXXX) that a killed save leaves and no later save can attribute.
    try:
        write_safetensors(path, payload, metadata={"format": _FORMAT})
    except ParameterArchiveError as e:
        raise FxProgramsError(f"FxPrograms.save: {e}") from e


def _dtype(name: str) -> torch.dtype:
    dtype = dtype_named(name)
    if dtype is None:
        raise FxProgramsError(f"unknown tensor dtype {name!r} in FxPrograms descriptor")
    return dtype


def _load_tensors(data_path: Path, meta: dict[str, dict]) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    out: dict[str, torch.Tensor] = {}
    try:
        handle = safe_open(str(data_path), framework="pt")
    except Exception as e:
        raise FxProgramsError(f"cannot open FxPrograms tensor data {data_path}: {e}") from e
    with handle as f:
        available = set(f.keys())
        storages: dict[str, torch.Tensor] = {}
        for key, info in meta.items():
            dtype = _dtype(info["dtype"])
            shape = tuple(info["shape"])
            if info["meta"]:
                t = torch.empty(shape, dtype=dtype, device="meta")
            elif info.get("storage"):
                view = info["storage"]
                if view["data"] not in storages:
                    if view["data"] not in available:
                        raise FxProgramsError(
                            f"{data_path}: storage {view['data']} of tensor {key} "
                            f"({info['first_use']}) is missing"
                        )
                    storages[view["data"]] = f.get_tensor(view["data"])
                t = _view_of(storages[view["data"]], dtype, shape, view, data_path, key)
            elif key in available:
                t = f.get_tensor(key)
                if t.dtype != dtype or tuple(t.shape) != shape:
                    raise FxProgramsError(
                        f"{data_path}: tensor {key} is {t.dtype}{list(t.shape)}, the descriptor "
                        f"says {dtype}{list(shape)}"
                    )
            else:
                raise FxProgramsError(f"{data_path}: tensor {key} ({info['first_use']}) is missing")
            if info["parameter"]:
                t = nn.Parameter(t, requires_grad=info["requires_grad"])
            if info.get("external"):
                ExternalTensorTrait(*info["external"]).set(t)
            if info.get("device_trait"):
                DeviceTensorTrait(*info["device_trait"]).set(t)
            out[key] = t
    return out


def _view_of(
    storage: torch.Tensor, dtype: torch.dtype, shape: tuple, view: dict, data_path: Path, key: str
) -> torch.Tensor:
    """Tensor ``key`` as a view (offset, stride) of a stored storage (bytes), bounds-checked."""
    offset, stride = int(view["offset"]), tuple(int(s) for s in view["stride"])
    itemsize = torch.empty((), dtype=dtype).element_size()
    last = offset + sum((n - 1) * s for n, s in zip(shape, stride)) if all(shape) else offset - 1
    if (
        storage.dtype != torch.uint8
        or len(stride) != len(shape)
        or offset < 0
        or min(stride, default=0) < 0
        or (last + 1) * itemsize > storage.numel()
    ):
        raise FxProgramsError(
            f"{data_path}: tensor {key} ({dtype}{list(shape)} at offset {offset}, stride "
            f"{list(stride)}) does not fit in its storage {view['data']} ({storage.numel()} "
            "bytes); the descriptor and the tensor data do not belong together: save again"
        )
    return torch.empty(0, dtype=dtype).set_(storage.untyped_storage(), offset, shape, stride)


# ------------------------------------------------------------------------------------------
# Graph serialization (JSON via torch's serializer, tensors as meta stand-ins)


def _meta_like(t: torch.Tensor) -> torch.Tensor:
    m = torch.empty(t.shape, dtype=t.dtype, device="meta")
    return nn.Parameter(m, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else m


def _serialize_graph(ep: ExportedProgram) -> bytes:
    from torch._export.serde.serialize import serialize

    stand_in = ExportedProgram(
        root=ep.graph_module,
        graph=ep.graph,
        graph_signature=ep.graph_signature,
        state_dict={k: _meta_like(v) for k, v in ep.state_dict.items()},
        range_constraints=ep.range_constraints,
        module_call_graph=ep.module_call_graph,
        example_inputs=None,
        constants={
            k: _meta_like(v) if isinstance(v, torch.Tensor) else v for k, v in ep.constants.items()
        },
        verifiers=ep.verifiers,
    )
    artifact = serialize(stand_in)
    return artifact.exported_program


def _deserialize_graph(
    graph_bytes: bytes, state_dict: dict, constants: dict, name: str
) -> ExportedProgram:
    from torch._export.serde.serialize import SerializedArtifact, deserialize

    # Passing already-built dicts means torch's deserializer never unpickles anything.
    artifact = SerializedArtifact(
        graph_bytes,
        dict(state_dict),  # type: ignore[arg-type]
        dict(constants),  # type: ignore[arg-type]
        ((), {}),  # type: ignore[arg-type]
    )
    try:
        return deserialize(artifact)
    except Exception as e:
        raise FxProgramsError(f"cannot deserialize program '{name}': {e}") from e
