"""The ``turbine-aot`` commands' results as text for a terminal (``--json`` prints the same
results as one JSON object instead)."""

from __future__ import annotations

from typing import Any

from .inspection import format_report
from .progress import Stages

__all__ = ["print_text", "text_lines"]


def print_text(command: str, result: dict[str, Any], st: Stages) -> None:
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
    for line in text_lines(command, result):
        print(line)


def _tensor_rows(rows: list[dict[str, Any]]) -> list[str]:
    width = max((len(str(r.get("name", ""))) for r in rows), default=0)
    return [
        f"  {r.get('name', '')!s:<{width}}  {r['dtype']} {list(r['shape'])}".rstrip() for r in rows
    ]


def text_lines(command: str, result: dict[str, Any]) -> list[str]:
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
