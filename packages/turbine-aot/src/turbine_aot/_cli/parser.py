"""The ``turbine-aot`` argument parser: the global options, one subcommand per command with its
options and help, and ``--version``."""

from __future__ import annotations

import argparse
from typing import Any

from turbine_params import versions_text

from .commands import COMMANDS
from .llm_commands import register as _register_llm_commands

__all__ = ["build_parser"]


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
def build_parser() -> argparse.ArgumentParser:
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
    _register_llm_commands(sub, _common, COMMANDS)
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
        "--check-in-child",
        action="store_true",
        help="load the module (a .vmfb or a bundle's) and call each function once on zeros in "
        "a child process first: a corrupted module that crashes there is refused",
    )
    r.add_argument(
        "--verify",
        action="store_true",
        help="a bundle: check every file's SHA-256 against its manifest (a .vmfb: the former "
        "spelling of --check-in-child)",
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
