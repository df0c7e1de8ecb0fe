"""Docs that run: every fenced Python block of README.md and docs/**/*.md runs as written.

Each Markdown file runs in one child process (tests/docs_blocks.py, which documents the
``<!-- excerpt: ... -->`` markers): blocks of a file share the interpreter (torch is imported
once per file) but never a namespace, unless a block is marked as continuing an earlier one.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import docs_blocks

ROOT = docs_blocks.ROOT
RUNNER = Path(docs_blocks.__file__)
TIMEOUT_S = 1200  # a whole page, IREE compiles included, on a loaded 2-core machine


def _run(md: Path, tmp_path: Path) -> tuple[subprocess.CompletedProcess, list[dict]]:
    results = tmp_path / "results.jsonl"
    proc = subprocess.run(
        [sys.executable, str(RUNNER), str(md), str(results)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    rows = (
        [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
    )
    return proc, rows


def _pages_with_blocks() -> list[Path]:
    return [p for p in docs_blocks.doc_files() if docs_blocks.python_blocks(p)]


def _skipped_blocks() -> list:
    blocks = [
        pytest.param(b, id=b.where)
        for p in docs_blocks.doc_files()
        for b in docs_blocks.python_blocks(p)
        if b.skip_reason
    ]
    return blocks or [pytest.param(None, id="none", marks=pytest.mark.skip("no block is marked"))]


@pytest.mark.slow
@pytest.mark.parametrize("page", _pages_with_blocks(), ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_run_as_written(page: Path, tmp_path: Path):
    proc, rows = _run(page, tmp_path)
    failures = [r["error"] for r in rows if r["status"] == "failed"]
    ran = {r["block"] for r in rows}
    expected = {b.number for b in docs_blocks.python_blocks(page)}
    assert proc.returncode == 0 and not failures and ran == expected, (
        "\n\n".join(failures)
        + f"\n--- blocks reported: {sorted(ran)} of {sorted(expected)}"
        + f"\n--- stdout (tail):\n{proc.stdout[-3000:]}\n--- stderr (tail):\n{proc.stderr[-3000:]}"
    )


@pytest.mark.parametrize("block", _skipped_blocks())
def test_blocks_marked_not_run(block: docs_blocks.Block):
    pytest.skip(f"{block.where} is marked not run: {block.skip_reason}")


# --- the runner itself, on planted pages (no torch: fast) ---------------------------------------


def _page(tmp_path: Path, text: str) -> Path:
    md = tmp_path / "page.md"
    md.write_text(textwrap.dedent(text))
    return md


def test_excerpt_runs_after_the_block_it_continues(tmp_path):
    md = _page(
        tmp_path,
        """\
        ```python
        value = 20
        open("made-by-block-1.txt", "w").write("x")
        ```

        <!-- excerpt: continues block 1 -->
        ```python
        assert value + 1 == 21
        assert open("made-by-block-1.txt").read() == "x"
        ```

        <!-- excerpt: continues block 2 -->
        ```python
        assert value == 20
        ```

        ```py
        assert "value" not in globals()
        ```

        <!-- excerpt: not run: needs a GPU -->
        ```python
        raise SystemExit("must not run")
        ```

        ```bash
        exit 1
        ```
        """,
    )
    blocks = docs_blocks.python_blocks(md)
    assert [(b.number, b.continues, b.skip_reason) for b in blocks] == [
        (1, None, None),
        (2, 1, None),
        (3, 2, None),
        (4, None, None),
        (5, None, "needs a GPU"),
    ]
    assert [b.number for b in docs_blocks.chain(blocks, blocks[2])] == [1, 2, 3]
    proc, rows = _run(md, tmp_path)
    assert proc.returncode == 0, rows
    assert [r["status"] for r in rows] == ["passed"] * 4 + ["skipped"]


def test_a_failing_block_fails_with_the_markdown_line(tmp_path):
    md = _page(
        tmp_path,
        """\
        Intro.

        ```python
        x = 1
        y = undefined_name
        ```

        <!-- excerpt: continues block 1 -->
        ```python
        print(x)
        ```
        """,
    )
    proc, rows = _run(md, tmp_path)
    assert proc.returncode == 1
    assert rows[0]["status"] == "failed"
    assert f'File "{md}", line 5' in rows[0]["error"]
    assert "NameError: name 'undefined_name' is not defined" in rows[0]["error"]
    assert rows[1] == {
        **rows[1],
        "status": "failed",
        "error": rows[1]["where"] + ": block 1 failed",
    }


def test_the_runner_installs_the_compat_shim_for_pages_that_need_it(tmp_path):
    """The environment's workaround is the runner's (examples stay as a user copies them): a
    page importing transformers/torchvision/timm runs after ``torchvision_compat.install()``,
    other pages without it (and without importing torch for it)."""
    needs = _page(
        tmp_path,
        """\
        ```python
        import sys

        assert "torchvision_compat" in sys.modules  # the runner's, not the page's
        if False:
            import torchvision  # what makes the page need it
        ```
        """,
    )
    proc, rows = _run(needs, tmp_path)
    assert [r["status"] for r in rows] == ["passed"], (rows, proc.stderr)
    plain = tmp_path / "plain.md"
    plain.write_text(
        '```python\nimport sys\n\nassert "torchvision_compat" not in sys.modules\n```\n'
    )
    proc, rows = _run(plain, tmp_path)
    assert [r["status"] for r in rows] == ["passed"], (rows, proc.stderr)


#: Pages whose subject is this environment's workaround itself (the zoo's torchvision note).
_EXPLAINS_THE_WORKAROUND = {"docs/models.md"}


def test_examples_carry_no_workaround_of_this_development_environment():
    found = [
        b.where
        for page in docs_blocks.doc_files()
        if str(page.relative_to(ROOT)) not in _EXPLAINS_THE_WORKAROUND
        for b in docs_blocks.python_blocks(page)
        if "torchvision_compat" in b.code
    ]
    assert not found, f"examples must not call torchvision_compat (the runner does): {found}"


@pytest.mark.parametrize(
    "marker, message",
    [
        ("<!-- excerpt: continues block 3 -->", "must name an earlier python block"),
        ("<!-- excerpt: see above -->", "unknown excerpt marker"),
    ],
)
def test_bad_markers_are_errors(tmp_path, marker, message):
    md = _page(tmp_path, f"```python\nx = 1\n```\n\n{marker}\n```python\nx\n```\n")
    with pytest.raises(docs_blocks.MarkerError, match=message):
        docs_blocks.python_blocks(md)


def test_new_docs_pages_are_picked_up(tmp_path):
    (tmp_path / "docs" / "sub").mkdir(parents=True)
    for rel in ("README.md", "docs/a.md", "docs/sub/b.md"):
        (tmp_path / rel).write_text("")
    assert [p.relative_to(tmp_path).as_posix() for p in docs_blocks.doc_files(tmp_path)] == [
        "README.md",
        "docs/a.md",
        "docs/sub/b.md",
    ]
