"""``turbine-aot inspect``: what a ``.vmfb``, a bundle or an ``.mlir`` holds.

For each public function: its flat ABI arguments and results and, when the module records them
(exported by turbine), the eager call signature: argument names and trees, result tree, dynamic
dimensions with their ranges. Then the parameters the module reads (scope, key, type, bytes),
and, where known, the compile flags, target devices and versions that built it. The report is a
JSON-able dict (``--json``) and formats as text.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from turbine_aot._bundle.read import read_bundle
from turbine_aot._compiler.torch_ir import public_functions
from turbine_aot._errors import TurbineRuntimeError
from turbine_aot._signatures.abi import FlatSignature, signatures_from_mlir
from turbine_aot._signatures.call import CallSignature
from turbine_aot._signatures.keys import PARAMETERS_KEY
from turbine_aot._signatures.leaf import Leaf
from turbine_aot._signatures.recording import module_parameters, reflection_of
from turbine_aot._signatures.reflection import (
    compile_record_of,
    function_signature,
    module_functions,
    module_name,
)
from turbine_aot._signatures.trees import load_spec, spec_children

__all__ = ["format_report", "inspect_path"]


def inspect_path(path: str | Path) -> dict[str, Any]:
    """A report on a ``.vmfb``, a bundle (directory or ``.tar``/``.tar.gz``) or an MLIR file
    (``.mlir`` text or ``.mlirbc`` bytecode).

    Raises:
        TurbineRuntimeError: the path does not exist or is none of those.
    """
    p = Path(path)
    if not p.exists():
        raise TurbineRuntimeError(f"{str(p)!r} does not exist")
    if p.is_dir() or p.name.endswith((".tar", ".tar.gz", ".tgz")):
        return _inspect_bundle(p)
    if p.suffix in (".mlir", ".mlirbc"):
        return _inspect_mlir(p)
    if p.suffix == ".vmfb" or _looks_like_vmfb(p):
        return _inspect_vmfb(p)
    raise TurbineRuntimeError(
        f"{str(p)!r} is not a .vmfb, a bundle (directory, .tar, .tar.gz) or an .mlir/.mlirbc "
        "file; give one of those"
    )


def _looks_like_vmfb(p: Path) -> bool:
    with open(p, "rb") as f:
        head = f.read(64)
    return head[:2] == b"PK" or b"IREE" in head


# ----------------------------------------------------------------------------- readers
def _vmfb_functions(
    path: Path,
) -> tuple[str, dict[str, FlatSignature], list[Any] | None, dict[str, Any] | None]:
    import iree.runtime as rt

    try:
        vm = rt.VmModule.mmap(rt.VmInstance(), str(path))
    except Exception as e:
        raise TurbineRuntimeError(
            f"{str(path)!r} is not a loadable IREE module: {str(e).splitlines()[0]}"
        ) from e
    sigs: dict[str, FlatSignature] = {}
    params: list[Any] | None = None
    built: dict[str, Any] | None = None
    where = repr(str(path))
    for name, _fn, reflection in module_functions(vm, where):
        sigs[name] = function_signature(name, reflection, where=where)
        if params is None and PARAMETERS_KEY in reflection:
            params = _json_or_none(reflection[PARAMETERS_KEY])
        if built is None:
            built = compile_record_of(reflection)
    return module_name(vm, where), sigs, params, built


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _inspect_vmfb(path: Path) -> dict[str, Any]:
    name, sigs, params, built = _vmfb_functions(path)
    return {
        "path": str(path),
        "kind": "vmfb",
        "module": name,
        "bytes": path.stat().st_size,
        "functions": {k: s.to_json() for k, s in sigs.items()},
        "parameters": _by_scope(params),
        "compile_flags": (built or {}).get("flags"),
        "versions": {"iree_compiler": built.get("compiler")} if built else None,
        "devices": None,
    }


def _inspect_bundle(path: Path) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="turbine-inspect-")) if path.is_file() else None
    try:
        bundle = read_bundle(path, extract_to=tmp)
        name, sigs, params, built = _vmfb_functions(bundle.module_path)
        manifest = bundle.manifest
        # The module is the truth; a manifest written before call records still has shapes.
        recorded = manifest.get("functions") or {}
        for fname, sig in sigs.items():
            if not sig.inputs and not sig.outputs and isinstance(recorded.get(fname), dict):
                sigs[fname] = FlatSignature.from_json(fname, recorded[fname])
        files = {
            scope: [{"path": p, "bytes": (bundle.path / p).stat().st_size} for p in ps]
            for scope, ps in (manifest.get("parameters") or {}).items()
        }
        return {
            "path": str(path),
            "kind": "bundle",
            "module": name,
            "bytes": bundle.module_path.stat().st_size,
            "functions": {k: s.to_json() for k, s in sigs.items()},
            "parameters": _by_scope(params),
            "parameter_files": files,
            "compile_flags": manifest.get("compile_flags") or (built or {}).get("flags"),
            "versions": manifest.get("versions"),
            "devices": [d.get("uri") for d in manifest.get("devices") or []],
        }
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _inspect_mlir(path: Path) -> dict[str, Any]:
    from turbine_ir import ir

    try:
        module = ir.Module.parse(path.read_bytes(), context=ir.Context())
    except Exception as e:
        raise TurbineRuntimeError(
            f"{str(path)!r} does not parse as MLIR: {str(e).strip().splitlines()[0]}"
        ) from e
    flat = signatures_from_mlir(module.operation)
    sigs: dict[str, FlatSignature] = {}
    for f in public_functions(module.operation, kinds=("func.func",)):
        name = str(f.attributes["sym_name"]).strip('"')
        if name in flat:
            call = CallSignature.from_reflection(reflection_of(f))
            sigs[name] = FlatSignature(name, flat[name].inputs, flat[name].outputs, call)
    return {
        "path": str(path),
        "kind": "mlir",
        "module": _module_name(module),
        "bytes": path.stat().st_size,
        "functions": {k: s.to_json() for k, s in sigs.items()},
        "parameters": _by_scope(module_parameters(module.operation)),
        "compile_flags": None,
        "versions": None,
        "devices": None,
    }


def _module_name(module: Any) -> str | None:
    attrs = module.operation.attributes
    return str(attrs["sym_name"]).strip('"') if "sym_name" in attrs else None


def _by_scope(params: list[Any] | None) -> dict[str, list[dict[str, Any]]] | None:
    if params is None:
        return None
    out: dict[str, list[dict[str, Any]]] = {}
    for p in params:
        out.setdefault(str(p.get("scope", "")), []).append(
            {"key": p.get("key"), "type": p.get("type"), "bytes": p.get("bytes")}
        )
    return out


# ----------------------------------------------------------------------------- text
def _size(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _tree_text(spec: Any, leaves: list[str]) -> str:
    """The tree with its leaves' texts: ``{'y': tensor<?x4xf32>, 'z': (…, None)}``."""
    it = iter(leaves)

    def walk(s: Any) -> str:
        if s.is_leaf():
            return next(it)
        t = s.type
        kids = list(s.children()) if hasattr(s, "children") else list(s.children_specs)
        if t is type(None):
            return "None"
        if t is tuple:
            parts = [walk(c) for c in kids]
            return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"
        if t is list:
            return "[" + ", ".join(walk(c) for c in kids) + "]"
        ctx = s.context
        if isinstance(t, type) and issubclass(t, dict):
            return "{" + ", ".join(f"{k!r}: {walk(c)}" for k, c in zip(ctx, kids)) + "}"
        name = getattr(t, "__name__", str(t))
        if isinstance(ctx, (list, tuple)) and len(ctx) == len(kids):
            return f"{name}(" + ", ".join(f"{k}={walk(c)}" for k, c in zip(ctx, kids)) + ")"
        return f"{name}(" + ", ".join(walk(c) for c in kids) + ")"

    return walk(spec)


def _leaf_text(leaf: Leaf) -> str:
    return leaf.type_text(symbols=True)


def _call_lines(name: str, call: CallSignature) -> list[str]:
    pos, kw, names = call.argument_specs()
    it = iter(call.args)
    params = []
    for pname, child in zip(names, [*spec_children(pos), *spec_children(kw)]):
        leaves = [_leaf_text(next(it)) for _ in range(child.num_leaves)]
        params.append(f"{pname}: {_tree_text(child, leaves)}")
    result = "..."
    if call.return_schema is not None:
        result = _tree_text(load_spec(call.return_schema), [_leaf_text(r) for r in call.results])
    lines = [f"{name}({', '.join(params)}) -> {result}"]
    for sym, (lo, hi) in call.dims.items():
        lines.append(f"    dynamic {sym}: {lo}..{hi if hi is not None else 'unbounded'}")
    for k, v in call.defaults.items():
        lines.append(f"    {k}={v!r} (not passed at export: fixed to its default)")
    return lines


def format_report(report: dict[str, Any]) -> str:
    """The report as text for a terminal."""
    kind = {"vmfb": "compiled module", "bundle": "bundle", "mlir": "MLIR module"}[report["kind"]]
    lines = [f"{report['path']}: {kind} {report.get('module')!r} ({_size(report.get('bytes'))})"]
    lines.append("")
    lines.append("functions:")
    for fname, rec in report["functions"].items():
        sig = FlatSignature.from_json(fname, rec)
        if sig.call is not None:
            lines += ["  " + line for line in _call_lines(fname, sig.call)]
        else:
            ins = ", ".join(str(s) for s in sig.inputs)
            outs = ", ".join(str(s) for s in sig.outputs)
            lines.append(f"  {fname}({ins}) -> ({outs})")
            lines.append("    (no recorded call signature: called with flat arguments)")
        if sig.call is not None:
            ins = ", ".join(str(s) for s in sig.inputs)
            outs = ", ".join(str(s) for s in sig.outputs)
            lines.append(f"    ABI: ({ins}) -> ({outs})")
    params = report.get("parameters")
    lines.append("")
    if params is None:
        lines.append("parameters: not recorded in this module")
    elif not params:
        lines.append("parameters: none")
    else:
        total = sum(p["bytes"] or 0 for ps in params.values() for p in ps)
        count = sum(len(ps) for ps in params.values())
        lines.append(f"parameters: {count} in {len(params)} scope(s), {_size(total)}")
        for scope, ps in params.items():
            lines.append(f"  scope {scope!r}: {len(ps)} key(s)")
            width = max(len(str(p["key"])) for p in ps)
            for p in ps:
                lines.append(f"    {p['key']!s:<{width}}  {p['type']:<24} {_size(p['bytes'])}")
    files = report.get("parameter_files")
    if files:
        lines.append("parameter files:")
        for scope, fs in files.items():
            for f in fs:
                lines.append(f"  {scope}: {f['path']} ({_size(f['bytes'])})")
    lines.append("")
    flags = report.get("compile_flags")
    if report["kind"] == "mlir":
        lines.append("compile flags: not compiled (compile it with `turbine-aot compile`)")
    elif flags:
        lines.append("compile flags:")
        lines += [f"  {f}" for f in flags]
    else:
        lines.append(
            "compile flags: not recorded (compiled by another tool; `turbine-aot compile`, "
            "ExportOutput.compile and bundles record them)"
        )
    versions = report.get("versions")
    if versions:
        lines.append(
            "built with: " + ", ".join(f"{k} {v}" for k, v in versions.items() if v is not None)
        )
    if report.get("devices"):
        lines.append("devices: " + ", ".join(report["devices"]))
    return "\n".join(lines)
