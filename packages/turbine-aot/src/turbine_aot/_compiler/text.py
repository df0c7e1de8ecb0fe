"""Splitting MLIR and flag text at its top-level commas (the one splitter: flag values such as
``--iree-hal-target-device=a,b``, ABI declarations, a function type's argument list)."""

from __future__ import annotations

__all__ = ["split_top_level_commas"]


def split_top_level_commas(text: str, *, strip: bool = False) -> list[str]:
    """``a,b<c,d>,"e,f"`` -> ``['a', 'b<c,d>', '"e,f"']``: commas inside brackets or quotes
    (attribute syntax such as ``#hal.device.target<"local", [...]>``) do not split.

    An unmatched closing bracket does not make later commas nested. Empty parts are left out;
    with ``strip``, each part is stripped of surrounding white space first.
    """
    parts: list[str] = []
    depth = 0
    quote = False
    start = 0
    for i, ch in enumerate(text):
        if ch == '"' and (i == 0 or text[i - 1] != "\\"):
            quote = not quote
        elif quote:
            continue
        elif ch in "<[({":
            depth += 1
        elif ch in ">])}":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    if strip:
        parts = [p.strip() for p in parts]
    return [p for p in parts if p]
