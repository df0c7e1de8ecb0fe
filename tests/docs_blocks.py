"""Runs the fenced Python blocks of README.md and docs/**/*.md as written (tests/test_docs.py).

A block runs on its own, in a fresh namespace and a fresh temporary working directory, unless
the nearest non-blank line above its opening fence is one of these markers:

* ``<!-- excerpt: continues block N -->``: the block continues the file's Python block N
  (1-based, counted in that file): it runs after block N, in block N's namespace and directory,
  as if appended to it (each continuation gets its own shallow copy of block N's namespace, so
  sibling continuations do not see each other's names).
* ``<!-- excerpt: not run: REASON -->``: the block is not run; the test reports the skip with
  REASON.

Examples are written as a user copies them. What this development environment needs besides
is done here, not in the pages: before a page whose blocks import transformers, torchvision or
timm runs, the runner calls ``tools/torchvision_compat.install()`` (the registry's torchvision
wheel needs stand-in op schemas against the CPU torch), as the root ``conftest.py`` does for the
tests.

Usage (one Markdown file per process): ``python tests/docs_blocks.py FILE.md RESULTS.jsonl``:
writes one JSON object per block to RESULTS.jsonl (the blocks' own output goes to stdout) and
exits 0 when every block that runs passes.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time
import traceback
import types
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^(?P<indent> *)(?P<ticks>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
MARKER = re.compile(r"^<!--\s*excerpt:\s*(?P<body>.*?)\s*-->$")
CONTINUES = re.compile(r"^continues block (?P<n>\d+)$")
NOT_RUN = re.compile(r"^not run:\s*(?P<reason>\S.*)$")
NEEDS_COMPAT = re.compile(r"^\s*(?:import|from)\s+(transformers|torchvision|timm)\b", re.M)


class MarkerError(ValueError):
    """A malformed excerpt marker, or one continuing a block that does not exist."""


@dataclass(frozen=True)
class Block:
    path: Path
    number: int  # 1-based among the file's python blocks
    line: int  # line of the first code line (1-based)
    code: str
    continues: int | None = None
    skip_reason: str | None = None

    @property
    def where(self) -> str:
        try:
            rel = self.path.relative_to(ROOT)
        except ValueError:
            rel = self.path
        return f"{rel}:{self.line} (python block {self.number})"


def doc_files(root: Path = ROOT) -> list[Path]:
    """README.md and every Markdown page under docs/ (new pages are picked up automatically)."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def python_blocks(path: Path) -> list[Block]:
    """The fenced ``python`` blocks of one Markdown file, with their excerpt markers."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        ticks, indent = m["ticks"], len(m["indent"])
        lang = m["info"].strip().split(maxsplit=1)[0].lower() if m["info"].strip() else ""
        j = i + 1
        while j < len(lines) and not re.match(
            rf"^ {{0,{indent}}}{ticks[0]}{{{len(ticks)},}}\s*$", lines[j]
        ):
            j += 1
        if lang in ("python", "py", "python3"):
            body = [ln[indent:] if ln[:indent].strip() == "" else ln for ln in lines[i + 1 : j]]
            continues, skip = _marker(path, lines, i, len(blocks) + 1)
            blocks.append(
                Block(path, len(blocks) + 1, i + 2, "\n".join(body) + "\n", continues, skip)
            )
        i = j + 1
    for b in blocks:
        if b.continues is not None and not 1 <= b.continues < b.number:
            raise MarkerError(
                f"{b.where}: 'continues block {b.continues}' must name an earlier python block "
                f"of the same file (1..{b.number - 1})"
            )
    return blocks


def _marker(path: Path, lines: list[str], fence: int, number: int) -> tuple[int | None, str | None]:
    k = fence - 1
    while k >= 0 and not lines[k].strip():
        k -= 1
    if k < 0:
        return None, None
    m = MARKER.match(lines[k].strip())
    if not m:
        return None, None
    body = m["body"]
    if c := CONTINUES.match(body):
        return int(c["n"]), None
    if s := NOT_RUN.match(body):
        return None, s["reason"]
    raise MarkerError(
        f"{path}:{k + 1}: unknown excerpt marker {lines[k].strip()!r} above python block {number}; "
        "write '<!-- excerpt: continues block N -->' or '<!-- excerpt: not run: REASON -->'"
    )


def chain(blocks: list[Block], block: Block) -> list[Block]:
    """The blocks that run for ``block``, first to last (its ancestors, then itself)."""
    out = [block]
    while out[0].continues is not None:
        out.insert(0, blocks[out[0].continues - 1])
    return out


def needs_compat(blocks: list[Block]) -> bool:
    """Whether a page's blocks import a library that needs ``torchvision_compat`` here."""
    return any(NEEDS_COMPAT.search(b.code) for b in blocks if b.skip_reason is None)


def install_environment(blocks: list[Block]) -> None:
    """This development environment's workarounds, before a page's blocks run (not in them)."""
    sys.path.insert(0, str(ROOT / "tools"))
    if needs_compat(blocks):
        import torchvision_compat

        torchvision_compat.install()


def _run_file(path: Path, results: Path) -> int:
    blocks = python_blocks(path)
    install_environment(blocks)
    # Each block runs as the __main__ module, as a script would. One module object serves every
    # block (its namespace is replaced per block): libraries that look __main__ up once (torch's
    # dynamo does) keep seeing the running block.
    main = types.ModuleType("__main__")
    ns = main.__dict__
    saved_main, saved_argv, home = sys.modules["__main__"], sys.argv, os.getcwd()
    states: dict[int, tuple[dict, str]] = {}  # block number -> (namespace after it, directory)
    failed = 0
    with tempfile.TemporaryDirectory(prefix="turbine-docs-") as top, results.open("w") as out:
        for b in blocks:
            result: dict = {"block": b.number, "line": b.line, "where": b.where}
            if b.skip_reason is not None:
                result.update(status="skipped", reason=b.skip_reason)
            elif b.continues is not None and b.continues not in states:
                result.update(status="failed", error=f"{b.where}: block {b.continues} failed")
            else:
                ns.clear()
                if b.continues is None:
                    workdir = tempfile.mkdtemp(dir=top, prefix=f"block{b.number}-")
                else:
                    base, workdir = states[b.continues]
                    ns.update(base)
                # A script file with the blocks' code, for child processes that re-import
                # __main__ (multiprocessing's spawn does).
                script = Path(workdir, f"block{b.number}.py")
                script.write_text("".join(c.code for c in chain(blocks, b)), encoding="utf-8")
                ns.update(
                    __name__="__main__",
                    __file__=str(script),
                    __builtins__=__builtins__,
                    __spec__=None,  # as for `python script.py`
                    __loader__=None,
                    __package__=None,
                    __doc__=None,
                )
                # Pad so that tracebacks name the Markdown file's own line numbers.
                source = "\n" * (b.line - 1) + b.code
                t0 = time.perf_counter()
                try:
                    os.chdir(workdir)
                    sys.modules["__main__"], sys.argv = main, [str(b.path)]
                    exec(compile(source, str(b.path), "exec"), ns)
                except BaseException:
                    tb = traceback.format_exc()
                    result.update(status="failed", error=f"{b.where} raised:\n{tb}")
                else:
                    result.update(status="passed")
                    states[b.number] = (dict(ns), workdir)
                finally:
                    sys.modules["__main__"], sys.argv = saved_main, saved_argv
                    os.chdir(home)
                result["seconds"] = round(time.perf_counter() - t0, 2)
            failed += result["status"] == "failed"
            out.write(json.dumps(result) + "\n")
            out.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(_run_file(Path(sys.argv[1]).resolve(), Path(sys.argv[2])))
