"""The ``turbine-aot`` commands: export, compile, run, bundle, inspect, demo (``llm`` in
:mod:`.llm_commands`), each a function of the parsed arguments and the progress stages that
returns its result as a JSON-able dict."""

from __future__ import annotations

import argparse
import io
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

from turbine_aot._bundle.load import load_bundle
from turbine_aot._bundle.write import check_parameter_file, save_bundle
from turbine_aot._compiler.cache import CompileError, compile_mlir
from turbine_aot._compiler.fallback import compile_with_fallback
from turbine_aot._compiler.flags import device_compile_flags
from turbine_aot._compiler.refusals import check_program_for_target
from turbine_aot._compiler.rewrites import module_for_compile
from turbine_aot._compiler.traits import NO_TRAITS, program_traits
from turbine_aot._export import diagnosis as _export_errors
from turbine_aot._runtime.loading import load_module
from turbine_aot._runtime.numerics import check_numerics
from turbine_aot._signatures.recording import compile_record
from turbine_params import atomic_write_bytes, externalize_module_parameters, save_module_parameters

from .errors import check_input_dtypes, quiet_torch_export_logs
from .inputs import CliError, _load_source, _make_input
from .inspection import inspect_path
from .progress import Stages

__all__ = ["COMMANDS"]


def _devices(args: argparse.Namespace) -> list[str]:
    import iree.runtime as rt

    devs = args.device or ["local-task"]
    available = rt.query_available_drivers()
    for d in devs:
        driver = d.split("://", 1)[0].split(":", 1)[0]
        if driver not in available:
            raise CliError(f"unknown device {d!r}; available IREE drivers: {', '.join(available)}")
    return devs


def _parameters(values: list[str] | None) -> dict[str, list[str]] | None:
    if not values:
        return None
    out: dict[str, list[str]] = {}
    for v in values:
        scope, sep, path = v.partition("=")
        if not sep:
            scope, path = "model", v
        if not Path(path).is_file():
            raise CliError(f"parameter file {path!r} does not exist")
        check_parameter_file(Path(path), scope)  # random bytes are refused here, not by IREE
        out.setdefault(scope, []).append(path)
    return out


# ----------------------------------------------------------------------------- commands
def _cmd_export(args: argparse.Namespace, st: Stages) -> dict[str, Any]:
    import torch

    import turbine_aot

    with st("load source"):
        obj = _load_source(args.source)
    gen = torch.Generator().manual_seed(args.seed)
    inputs = [_make_input(s, gen) for s in args.input or []]
    is_cm = isinstance(obj, type) and issubclass(obj, turbine_aot.CompiledModule)
    if not is_cm and not inputs:
        raise CliError("give example inputs with --input SHAPExDTYPE (e.g. --input 1x128xi64)")
    if args.external_params:
        if not isinstance(obj, torch.nn.Module):
            raise CliError("--external-params needs an nn.Module")

        with st("save params"):
            externalize_module_parameters(obj)
            save_module_parameters(args.external_params, obj)
    dynamic: list[dict[int, Any]] | None = None
    dynamic_flags: dict[str, str] = {}  # the Dim's name -> the --dynamic value that made it
    if args.dynamic:
        dynamic = [dict() for _ in inputs]
        for spec in args.dynamic:
            a, d, kw = _parse_dynamic(spec, inputs)
            dynamic[a][d] = torch.export.Dim(f"arg{a}_dim{d}", **kw)
            dynamic_flags[f"arg{a}_dim{d}"] = spec
    with st("export"), quiet_torch_export_logs(not args.debug):
        if is_cm:
            eo = turbine_aot.export(obj)
        else:
            try:
                eo = turbine_aot.export(
                    obj,
                    args=tuple(inputs),
                    dynamic_shapes=tuple(dynamic) if dynamic else None,
                    function_name=args.function_name,
                    strict_export=not args.non_strict,
                )
            except turbine_aot.ExportError as e:
                if e.torch_message:
                    e.cli_message = _export_errors.cli_message(e, dynamic_flags)
                raise
    if not is_cm:  # torch.export accepts an i64 input into a float matmul: say what it expects
        check_input_dtypes(eo.mlir_module, list(args.input or []), CliError)
    out = Path(args.output or (Path(args.source.split(":")[0]).stem + ".mlir"))
    with st("save mlir"):
        eo.save_mlir(out)
    return {"mlir": str(out), "external_params": args.external_params, "timings": st.timings}


def _parse_dynamic(spec: str, inputs: list[Any]) -> tuple[int, int, dict[str, int]]:
    """``ARG:DIM``, ``ARG:DIM:MAX`` or ``ARG:DIM:MIN:MAX`` -> (arg, dim, Dim keywords)."""
    m = re.fullmatch(r"(\d+):(\d+)(?::(\d+))?(?::(\d+))?", spec)
    usage = (
        f"expected ARG:DIM, ARG:DIM:MAX or ARG:DIM:MIN:MAX with ARG < {len(inputs)}, e.g. "
        "0:1:1:512 makes dimension 1 of input 0 dynamic from 1 to 512"
    )
    if not m or int(m.group(1)) >= len(inputs):
        raise CliError(f"bad --dynamic {spec!r}: {usage}")
    a, d = int(m.group(1)), int(m.group(2))
    if d >= inputs[a].dim():
        raise CliError(
            f"bad --dynamic {spec!r}: input {a} has {inputs[a].dim()} dimension(s); {usage}"
        )
    kw: dict[str, int] = {}
    if m.group(4):
        kw = {"min": int(m.group(3)), "max": int(m.group(4))}
    elif m.group(3):
        kw = {"max": int(m.group(3))}
    if "min" in kw and kw["min"] > kw["max"]:
        raise CliError(f"bad --dynamic {spec!r}: MIN {kw['min']} is above MAX {kw['max']}")
    size = inputs[a].shape[d]
    if size < kw.get("min", 0) or size > kw.get("max", size):
        raise CliError(
            f"bad --dynamic {spec!r}: the example input {a} has size {size} in dimension {d}, "
            "outside the range; give an example inside it"
        )
    return a, d, kw


def _read_program(data: bytes) -> Any:
    """The MLIR module in ``data`` (text or bytecode), or ``None`` when it does not parse here
    (the compiler then reports what is wrong)."""
    from turbine_ir import ir

    try:
        return ir.Module.parse(data, context=ir.Context())
    except Exception:
        return None


def _source_for_compile(data: bytes, module: Any, flags: list[str]) -> bytes:
    """What ``compile`` and ``bundle`` hand to IREE for ``flags``, as ExportOutput.compile does:
    the compile-time rewrites (``module_for_compile``, on a copy), and the flags and
    compiler version recorded in the module (``inspect``). ``data`` itself when it did not parse.
    """
    if module is None:
        return data
    target, owned = module_for_compile(module.operation, flags)
    try:
        buf = io.BytesIO()
        with compile_record(target.operation, flags):
            target.operation.write_bytecode(buf)
        return buf.getvalue()
    finally:
        if owned:
            target.operation.erase()


def _cmd_compile(args: argparse.Namespace, st: Stages) -> dict[str, Any]:

    src = Path(args.input)
    if not src.is_file():
        raise CliError(f"input file {args.input!r} does not exist")
    devices = _devices(args)
    user_flags = list(args.flag or [])
    data = src.read_bytes()
    # The same program-dependent defaults and checks as ExportOutput.compile.
    module = _read_program(data)
    traits = program_traits(module) if module is not None else NO_TRAITS
    flags = device_compile_flags(devices, user_flags, traits=traits)
    if module is not None:
        check_program_for_target(module, flags)
    cache: Any = False if args.no_cache else (args.cache_dir or True)

    def compile_with(flags: list[str]) -> bytes:
        return compile_mlir(
            _source_for_compile(data, module, flags),
            flags,
            input_type=args.input_type,
            target=",".join(devices),
            cache=cache,
            rewrite=False,  # _source_for_compile applied them
        )

    with st("compile"):
        vmfb, flags = compile_with_fallback(compile_with, flags, user_flags, errors=(CompileError,))
    out = Path(args.output or src.with_suffix(".vmfb").name)

    atomic_write_bytes(out, vmfb, parents=True)  # usual file mode; no temp file left on failure
    return {"vmfb": str(out), "bytes": len(vmfb), "flags": flags, "timings": st.timings}


def _cmd_run(args: argparse.Namespace, st: Stages) -> dict[str, Any]:
    import torch

    target = Path(args.module)
    if not target.exists():
        raise CliError(f"module {args.module!r} does not exist")
    with st("load"):
        if target.is_dir() or (target.is_file() and not target.name.endswith(".vmfb")):
            m = load_bundle(
                target,
                device=args.device or None,
                parameters=_parameters(args.parameters),
                verify=args.verify,
                check_versions=not args.ignore_versions,
                check_in_child=args.check_in_child,
            )
        else:
            if args.verify:  # its meaning for a .vmfb before --check-in-child had its name
                print(
                    "turbine-aot: warning: --verify on a .vmfb is now --check-in-child",
                    file=sys.stderr,
                )
            m = load_module(
                target,
                device=_devices(args),
                parameters=_parameters(args.parameters),
                check_in_child=args.check_in_child or args.verify,
            )
    fn = m[args.function]
    call = fn.signature.call
    gen = torch.Generator().manual_seed(args.seed)
    specs = list(args.input or [])
    if not specs and fn.signature.inputs:
        dynamic = [i for i, s in enumerate(fn.signature.inputs) if None in s.shape]
        if dynamic:
            raise CliError(
                f"{args.function} has dynamic dimensions ({_input_names(fn)}): give --input "
                "for each argument, e.g. -i 1x16xi64 or -i 1x4xi64=1,2,3,4"
            )
        specs = [str(s).removeprefix("tensor<").removesuffix(">") for s in fn.signature.inputs]
    inputs = [_make_input(s, gen) for s in specs]
    with st("run"):
        # Flat ABI arguments, checked like a Python call (dtype, rank, dims and their ranges).
        outs = fn.call_flat(*inputs)
    names = _output_names(fn, len(outs))
    written = []
    if args.output_dir:
        d = Path(args.output_dir)
        d.mkdir(parents=True, exist_ok=True)
        for i, r in enumerate(outs):
            t = r.float() if r.dtype in (torch.bfloat16,) or "float8" in str(r.dtype) else r
            p = d / f"{args.function}_{i}.npy"
            np.save(p, t.numpy())
            written.append(str(p))
    in_names = _input_names(fn).split(", ") if fn.signature.inputs else []
    result: dict[str, Any] = {
        "function": args.function,
        "inputs": [
            {
                "name": in_names[i] if i < len(in_names) else str(i),
                "shape": list(x.shape),
                "dtype": str(x.dtype).removeprefix("torch."),
            }
            for i, x in enumerate(inputs)
        ],
        "outputs": [
            {"name": names[i], "shape": list(r.shape), "dtype": str(r.dtype).removeprefix("torch.")}
            for i, r in enumerate(outs)
        ],
        "written": written,
    }
    if args.check_eager:
        with st("eager check"):
            eager = _load_source(args.check_eager)
            if call is not None:
                # The eager model takes the structured call the flat inputs come from.
                e_args, e_kwargs = call.unflatten_inputs(inputs)
                report = check_numerics(
                    lambda *a: fn(*a, **e_kwargs), lambda *a: eager(*a, **e_kwargs), *e_args
                )
            else:
                report = check_numerics(fn, eager, *inputs)
        result["numerics"] = report.to_json()
        result["report"] = str(report)
        result["ok"] = report.ok
    result["timings"] = st.timings
    return result


def _input_names(fn: Any) -> str:
    call = fn.signature.call
    if call is not None:
        return ", ".join(leaf.path for leaf in call.flat_inputs())
    return ", ".join(str(i) for i in range(len(fn.signature.inputs)))


def _output_names(fn: Any, n: int) -> list[str]:
    call = fn.signature.call
    if call is not None and call.return_schema is not None:
        leaves = call.flat_results()
        if len(leaves) == n:
            return [leaf.path for leaf in leaves]
    return [str(i) for i in range(n)]


def _cmd_inspect(args: argparse.Namespace, st: Stages) -> dict[str, Any]:
    return inspect_path(args.path)


def _cmd_bundle(args: argparse.Namespace, st: Stages) -> dict[str, Any]:

    src = Path(args.module)
    if not src.is_file():
        raise CliError(f"module {args.module!r} does not exist")
    devices = _devices(args)
    module: Any = src
    flags = None
    if src.suffix in (".mlir", ".mlirbc"):
        user_flags = list(args.flag or [])
        flags = device_compile_flags(devices, user_flags)
        data = src.read_bytes()
        program = _read_program(data)
        with st("compile"):
            module, flags = compile_with_fallback(
                lambda f: compile_mlir(
                    _source_for_compile(data, program, f),
                    f,
                    target=",".join(devices),
                    rewrite=False,  # _source_for_compile applied them
                ),
                flags,
                user_flags,
                errors=(CompileError,),
            )
    with st("bundle"):
        b = save_bundle(
            args.output,
            module,
            parameters=_parameters(args.parameters),
            device=devices,
            compile_flags=flags,
            overwrite=args.force,
        )
    return {
        "bundle": str(b.path),
        "functions": list(b.manifest["functions"]),
        "iree_run_module": b.manifest["iree_run_module"],
        "timings": st.timings,
    }


def _cmd_demo(args: argparse.Namespace, st: Stages) -> dict[str, Any]:
    from .demo import run_demo

    if args.repeat < 1:
        raise CliError(f"--repeat {args.repeat}: give a number of timed calls, at least 1")
    if args.threads is not None and args.threads < 1:
        raise CliError(f"--threads {args.threads}: give a number of CPU threads, at least 1")
    if args.workdir is not None and Path(args.workdir).exists() and not Path(args.workdir).is_dir():
        raise CliError(f"--workdir {args.workdir!r} is a file, not a directory; give a directory")
    cache: Any = not args.no_cache
    return run_demo(
        stages=st,
        device=args.device,
        workdir=args.workdir,
        repeat=args.repeat,
        cache=cache,
        threads=args.threads,
    ) | {"timings": st.timings}


COMMANDS = {
    "export": _cmd_export,
    "compile": _cmd_compile,
    "run": _cmd_run,
    "bundle": _cmd_bundle,
    "demo": _cmd_demo,
    "inspect": _cmd_inspect,
}
