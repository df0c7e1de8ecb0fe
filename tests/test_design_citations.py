"""The design lives in the repository: code and docs cite docs/design.md, and every citation of
one of its sections names a section that exists.

Citations take two forms: a Markdown link ``design.md#<anchor>`` (docs) and a comment or
docstring ``docs/design.md, "<section title>"`` (code). Nothing cites the ``DESIGN.md`` the
project started from, which is not part of the repository.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "design.md"
#: Where citations may stand: the docs and every package's sources.
CITING = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *(
        p
        for package in ("params", "ir", "trace", "fx", "aot")
        for p in sorted((ROOT / "packages" / f"turbine-{package}").rglob("*.py"))
    ),
]


def _anchor(title: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as dashes."""
    text = re.sub(r"[^\w\- ]", "", title.strip().lower())
    return text.replace(" ", "-")


def _sections() -> dict[str, str]:
    titles = re.findall(r"^#{2,4} (.+)$", DESIGN.read_text(encoding="utf-8"), re.MULTILINE)
    return {_anchor(t): t for t in titles}


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_design_doc_has_the_sections_code_relies_on():
    titles = set(_sections().values())
    for needed in (
        "Module and function names",
        "Globals and their names",
        "Parameters: scopes and keys",
        "Function signatures",
        "Device affinities",
        "Import phases",
        "IRPA archives",
        "Bundles",
    ):
        assert needed in titles, f"docs/design.md lost its section {needed!r}"


def test_no_citation_of_a_design_file_outside_the_repository():
    bad = [
        f"{_rel(path)}: {m.group(0)}"
        for path in CITING
        for m in re.finditer(
            r"(?<![\w/])DESIGN\.md|\.\./shared|/work/shared", path.read_text(encoding="utf-8")
        )
    ]
    assert not bad, "cite docs/design.md (a section) instead of:\n" + "\n".join(bad)


def test_every_cited_section_exists():
    sections = _sections()
    titles = set(sections.values())
    missing = []
    found = 0
    for path in CITING:
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(r"design\.md#([\w-]+)", text):
            found += 1
            if m.group(1) not in sections:
                missing.append(f"{_rel(path)}: #{m.group(1)}")
        for m in re.finditer(r'docs/design\.md, "([^"]+)"', text):
            found += 1
            if m.group(1) not in titles:
                missing.append(f"{_rel(path)}: {m.group(1)!r}")
    assert found >= 2, "no citation of docs/design.md found: the pattern above is stale"
    assert not missing, "citations of sections docs/design.md does not have:\n" + "\n".join(missing)
