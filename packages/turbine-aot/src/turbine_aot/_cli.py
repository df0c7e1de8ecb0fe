"""The ``turbine-aot`` command line: export, compile, run, bundle, inspect, demo.

Errors a user can fix (missing file, bad shape string, unknown device, compile failure) print one
line ``turbine-aot: error: ...`` and exit with status 2, without a traceback (``--debug`` shows
it). ``--json`` prints one JSON object on stdout instead of text; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

from turbine_aot import runtime as R
from turbine_aot._bundle.write import check_parameter_file
from turbine_aot._cli_errors import (
    check_input_dtypes,
    quiet_torch_export_logs,
    with_root_cause,
)
from turbine_aot._cli_inputs import CliError, _load_source, _make_input, parse_input_spec
from turbine_aot._cli_llm import register as _register_llm_commands
from turbine_aot._cli_progress import Stages
from turbine_aot._compiler.cache import CompileError as CacheCompileError
from turbine_aot._compiler.fallback import compile_with_fallback
from turbine_aot._compiler.refusals import check_program_for_target
from turbine_aot._compiler.rewrites import module_for_compile
from turbine_aot._compiler.targets import TargetError
from turbine_aot._compiler.traits import NO_TRAITS, program_traits
from turbine_aot._errors import TurbineAotError, TurbineRuntimeError
from turbine_aot._export import diagnosis as _export_errors
from turbine_aot._inspect import format_report, inspect_path
from turbine_aot._signatures.recording import compile_record
from turbine_params import (
    atomic_write_bytes,
    externalize_module_parameters,
    save_module_parameters,
    versions_text,
)

__all__ = ["CliError", "main", "parse_input_spec"]


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
    dynamic = None
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
    flags = R.device_compile_flags(devices, user_flags, traits=traits)
    if module is not None:
        check_program_for_target(module, flags)
    cache: Any = False if args.no_cache else (args.cache_dir or True)

    def compile_with(flags: list[str]) -> bytes:
        return R.compile_mlir(
            _source_for_compile(data, module, flags),
            flags,
            input_type=args.input_type,
            target=",".join(devices),
            cache=cache,
            rewrite=False,  # _source_for_compile applied them
        )

    with st("compile"):
        vmfb, flags = compile_with_fallback(
            compile_with, flags, user_flags, errors=(R.CompileError,)
        )
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
            m = R.load_bundle(
                target,
                device=args.device or None,
                parameters=_parameters(args.parameters),
                verify=args.verify,
                check_versions=not args.ignore_versions,
            )
        else:
            m = R.load_module(
                target,
                device=_devices(args),
                parameters=_parameters(args.parameters),
                verify=args.verify,
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
                report = R.check_numerics(
                    lambda *a: fn(*a, **e_kwargs), lambda *a: eager(*a, **e_kwargs), *e_args
                )
            else:
                report = R.check_numerics(fn, eager, *inputs)
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
        flags = R.device_compile_flags(devices, user_flags)
        data = src.read_bytes()
        program = _read_program(data)
        with st("compile"):
            module, flags = compile_with_fallback(
                lambda f: R.compile_mlir(
                    _source_for_compile(data, program, f),
                    f,
                    target=",".join(devices),
                    rewrite=False,  # _source_for_compile applied them
                ),
                flags,
                user_flags,
                errors=(R.CompileError,),
            )
    with st("bundle"):
        b = R.save_bundle(
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
    from turbine_aot._demo import run_demo

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


def _print_text(command: str, result: dict[str, Any], st: Stages) -> None:
    if command == "demo":
        print()
        print(
            "turbine-aot demo: tiny GPT exported with external weights, compiled for the host CPU"
        )
        print()
        print(st.table())
        print()
        print(result["report"])
        lat = result["latency_ms"]
        print()
        print(
            f"latency (median): IREE {lat['iree']:.3f} ms   eager {lat['eager']:.3f} ms   "
            f"IREE/eager {lat['ratio']:.2f}x"
        )
        print("result: " + ("OK, IREE matches eager" if result["ok"] else "MISMATCH against eager"))
        return
    if command == "inspect":
        print(format_report(result))
        return
    for line in _text_lines(command, result):
        print(line)


def _tensor_rows(rows: list[dict[str, Any]]) -> list[str]:
    width = max((len(str(r.get("name", ""))) for r in rows), default=0)
    return [
        f"  {r.get('name', '')!s:<{width}}  {r['dtype']} {list(r['shape'])}".rstrip() for r in rows
    ]


def _text_lines(command: str, result: dict[str, Any]) -> list[str]:
    """A command's result as formatted text (what --json prints as one object)."""
    lines: list[str] = []
    if command == "export":
        lines.append(f"wrote {result['mlir']}")
        if result.get("external_params"):
            lines.append(f"parameters: {result['external_params']}")
    elif command == "compile":
        lines.append(f"wrote {result['vmfb']} ({result['bytes']} bytes)")
        lines.append("compile flags:")
        lines += [f"  {f}" for f in result.get("flags") or []]
    elif command == "run":
        lines.append(f"function: {result['function']}")
        lines.append("inputs:")
        lines += _tensor_rows(result["inputs"])
        lines.append("outputs:")
        lines += _tensor_rows(result["outputs"])
        if result.get("written"):
            lines.append("written:")
            lines += [f"  {w}" for w in result["written"]]
        if "report" in result:
            lines.append("")
            lines.append(result["report"])
            lines.append("result: " + ("OK, matches eager" if result["ok"] else "MISMATCH"))
    elif command == "bundle":
        lines.append(f"wrote bundle {result['bundle']}")
        lines.append(f"functions: {', '.join(result['functions'])}")
        example = (result.get("iree_run_module") or {}).get("example")
        if example:
            lines.append(f"run it without Python: {example}")
    else:  # a command without its own layout: one "key: value" line per scalar
        for k, v in result.items():
            if k != "timings":
                lines.append(f"{k}: {_plain(v)}")
    return lines


def _plain(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={_plain(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(_plain(v) for v in value)
    return str(value)


class _VersionAction(argparse.Action):
    """``--version``: the package versions, torch's and IREE's."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None):

        print(
            versions_text(
                "turbine-aot",
                [
                    "turbine-params",
                    "turbine-ir",
                    "turbine-trace",
                    "turbine-fx",
                    "torch",
                    "iree-base-compiler",
                    "iree-base-runtime",
                ],
            )
        )
        parser.exit()


# ----------------------------------------------------------------------------- parser
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="turbine-aot",
        description="Export PyTorch programs, compile them with IREE, run and bundle them.",
    )
    p.add_argument("--json", action="store_true", help=_JSON_HELP)
    p.add_argument("--debug", action="store_true", help=_DEBUG_HELP)
    p.add_argument(
        "--version", action=_VersionAction, help="print the turbine, torch and IREE versions"
    )
    sub = p.add_subparsers(dest="command", required=True)

    _add_export_command(sub, _common)
    _add_compile_command(sub, _common)
    _add_run_command(sub, _common)
    _add_bundle_command(sub, _common)
    _add_demo_command(sub, _common)
    _add_inspect_command(sub, _common)
    _register_llm_commands(sub, _common, _COMMANDS)
    return p


def _common(sp: argparse.ArgumentParser) -> None:
    """The options every command takes too (after its name)."""
    sp.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=_JSON_HELP)
    sp.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=_DEBUG_HELP)


def _add_export_command(sub: Any, common: Any) -> None:
    e = sub.add_parser("export", help="export an nn.Module or CompiledModule to MLIR")
    e.add_argument(
        "source", help="file.py[:NAME] or package.module:NAME (nn.Module, class or factory)"
    )
    e.add_argument(
        "--input",
        "-i",
        action="append",
        help="example input (repeat per argument): SHAPExDTYPE (random), SHAPExDTYPE=V1,V2,... "
        "or file.npy",
    )
    e.add_argument(
        "--dynamic",
        action="append",
        metavar="ARG:DIM[:MIN]:MAX",
        help="make dimension DIM of input ARG dynamic (ARG:DIM, ARG:DIM:MAX or ARG:DIM:MIN:MAX, "
        "like torch.export.Dim(min=, max=)); repeatable",
    )
    e.add_argument("--external-params", metavar="FILE.irpa", help="externalize weights to FILE")
    e.add_argument(
        "--function-name", default=None, help="name of the exported function (default: main)"
    )
    e.add_argument(
        "--non-strict",
        action="store_true",
        help="torch.export with strict=False (traces forward() as Python, not with TorchDynamo)",
    )
    e.add_argument(
        "--seed", type=int, default=0, help="seed of the random example inputs (default 0)"
    )
    e.add_argument("-o", "--output", help="output .mlir / .mlirbc (default: <source>.mlir)")
    common(e)


def _add_compile_command(sub: Any, common: Any) -> None:
    c = sub.add_parser("compile", help="compile MLIR to a .vmfb for one or more devices")
    c.add_argument("input", help="a .mlir or .mlirbc file")
    c.add_argument("--device", "-d", action="append", help="device URI (repeat for multi-device)")
    c.add_argument("--flag", "-X", action="append", help="extra iree-compile flag (repeatable)")
    c.add_argument("--input-type", default="auto", help="--iree-input-type (auto, torch, ...)")
    c.add_argument("--no-cache", action="store_true", help="bypass the compile cache")
    c.add_argument(
        "--cache-dir", default=None, help="compile cache directory (default: the user cache)"
    )
    c.add_argument("-o", "--output", help="output .vmfb (default: <input>.vmfb here)")
    common(c)


def _add_run_command(sub: Any, common: Any) -> None:
    r = sub.add_parser(
        "run",
        help="run a .vmfb or a bundle",
        description="Call one function of a .vmfb or bundle and print its inputs and outputs "
        "(name, dtype, shape). Without --input, a function whose arguments all have static "
        "shapes is called once on random values of its signature (--seed), which prints its "
        "signature and exits 0; a function with dynamic dimensions then asks for --input.",
    )
    r.add_argument("module", help="a .vmfb, or a bundle directory / archive")
    r.add_argument("--function", "-f", default="main", help="function to call (default: main)")
    r.add_argument(
        "--input",
        "-i",
        action="append",
        help="one per function argument: SHAPExDTYPE (random values), SHAPExDTYPE=V1,V2,... "
        "(iree-run-module syntax; one value fills the tensor) or [@]file.npy. Without any: "
        "random values of the signature's static shapes (prints the signature, exit 0)",
    )
    r.add_argument("--parameters", "-p", action="append", help="[SCOPE=]FILE (repeatable)")
    r.add_argument("--device", "-d", action="append", help="device URI (repeat for multi-device)")
    r.add_argument("--output-dir", help="write each result as <function>_<i>.npy here")
    r.add_argument("--check-eager", metavar="SOURCE", help="compare with this eager model")
    r.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    r.add_argument(
        "--verify",
        action="store_true",
        help="a .vmfb: load it and call each function once on zeros in a child process "
        "first (a corrupted module that crashes there is refused); a bundle: also check "
        "every file's SHA-256",
    )
    r.add_argument(
        "--ignore-versions",
        action="store_true",
        help="load a bundle built under another IREE release anyway",
    )
    common(r)


def _add_bundle_command(sub: Any, common: Any) -> None:
    b = sub.add_parser("bundle", help="make a deployable bundle (vmfb + params + manifest)")
    b.add_argument("module", help="a .vmfb, or a .mlir to compile")
    b.add_argument("-o", "--output", required=True, help="directory, or .tar / .tar.gz")
    b.add_argument("--parameters", "-p", action="append", help="[SCOPE=]FILE (repeatable)")
    b.add_argument("--device", "-d", action="append", help="device URI it is built for")
    b.add_argument("--flag", "-X", action="append", help="extra iree-compile flag")
    b.add_argument("--force", action="store_true", help="replace an existing bundle")
    common(b)


def _add_demo_command(sub: Any, common: Any) -> None:
    d = sub.add_parser("demo", help="export, compile, run and compare an embedded transformer")
    d.add_argument("--device", default="local-task", help="device URI (default: local-task)")
    d.add_argument("--workdir", default=None, help="keep the .irpa/.vmfb here")
    d.add_argument(
        "--repeat", type=int, default=20, help="calls timed per side (default 20; median)"
    )
    d.add_argument("--no-cache", action="store_true", help="bypass the compile cache")
    d.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads for eager and IREE (default: each's own)",
    )
    common(d)


def _add_inspect_command(sub: Any, common: Any) -> None:
    i = sub.add_parser(
        "inspect",
        help="show what a .vmfb, bundle or .mlir holds: functions, parameters, flags",
        description="Functions with their argument/result specs and trees (dynamic dimensions "
        "with their ranges), the parameter scopes and keys the module reads with their sizes, "
        "and the compile flags, devices and versions that built it where recorded.",
    )
    i.add_argument("path", help="a .vmfb, a bundle (directory, .tar, .tar.gz) or .mlir/.mlirbc")
    common(i)


_JSON_HELP = "print one JSON object on stdout instead of text (progress goes to stderr)"
_DEBUG_HELP = "show the traceback of an error instead of one line"


_COMMANDS = {
    "export": _cmd_export,
    "compile": _cmd_compile,
    "run": _cmd_run,
    "bundle": _cmd_bundle,
    "demo": _cmd_demo,
    "inspect": _cmd_inspect,
}


def _user_error_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = [CliError, FileNotFoundError]
    types += [TurbineRuntimeError, CacheCompileError, TargetError, TurbineAotError]
    return tuple(types)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``turbine-aot``; returns the exit status."""
    args = _parser().parse_args(argv)
    st = Stages(quiet=args.json)
    try:
        result = _COMMANDS[args.command](args, st)
    except _user_error_types() as e:
        if args.debug:
            raise
        # A CompileError's first line only names the stage; its first error says what failed.
        text = getattr(e, "cli_message", None) or (
            e.errors[0].message if getattr(e, "errors", None) else str(e)
        )
        first = text.strip().splitlines()[0] if text.strip() else type(e).__name__
        if not isinstance(e, CliError):
            # An export's cli_message says what torch.export said; a kernel's own error at the
            # root (a shape mismatch) is added, torch's wrapping exception types are not.
            first = with_root_cause(e, first, builtin_only=bool(getattr(e, "cli_message", None)))
        if args.json:
            print(json.dumps({"ok": False, "error": first}))
        print(f"turbine-aot: error: {first}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("turbine-aot: interrupted", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(result, default=str))
    else:
        _print_text(args.command, result, st)
    return 0 if result.get("ok", True) else 1


if __name__ == "__main__":
    sys.exit(main())
