"""The GitHub workflow (.github/workflows/ci.yml) runs exactly the nox sessions tagged "ci" (what
``.ci/run`` runs), each once, on Python 3.11 and on the lowest Python the packages declare."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "ci.yml"
NOX_RUN = re.compile(r"\bnox\b(?: --)? -s (.+)$")


@pytest.fixture(scope="module")
def nox_sessions() -> dict[str, dict]:
    """``nox -l --json``: session name -> its record (tags, python)."""
    out = subprocess.run(
        [sys.executable, "-m", "nox", "-l", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    return {s["session"]: s for s in json.loads(out)}


@pytest.fixture(scope="module")
def jobs() -> dict[str, dict]:
    return yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))["jobs"]


def _sessions_run(job: dict) -> list[str]:
    """The sessions a job's steps name after ``nox -s``, the matrix groups expanded."""
    groups = job.get("strategy", {}).get("matrix", {}).get("group", [])
    names: list[str] = []
    for step in job["steps"]:
        m = NOX_RUN.search(step.get("run", ""))
        if m is None:
            continue
        if m.group(1).strip() == "${{ matrix.group }}":
            for group in groups:
                names += group.split()
        else:
            names += m.group(1).split()
    return names


def _python(job: dict) -> str:
    (version,) = [
        s["with"]["python-version"] for s in job["steps"] if "setup-python" in s.get("uses", "")
    ]
    return str(version)


def _lowest_declared_python() -> str:
    lowest = set()
    for pyproject in sorted((ROOT / "packages").glob("*/pyproject.toml")):
        spec = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["requires-python"]
        m = re.fullmatch(r">=\s*(3\.\d+)", spec)
        assert m, f"{pyproject}: requires-python {spec!r} is not of the form '>=3.N'"
        lowest.add(m.group(1))
    assert len(lowest) == 1, f"the packages declare different lowest Pythons: {sorted(lowest)}"
    return lowest.pop()


def test_main_job_runs_every_ci_session_once(nox_sessions, jobs):
    ci = {name for name, s in nox_sessions.items() if "ci" in s["tags"]}
    run = _sessions_run(jobs["test"])
    repeated = sorted({n for n in run if run.count(n) > 1})
    assert not repeated, f"sessions in more than one matrix group: {repeated}"
    assert not ci - set(run), (
        f"`nox -t ci` sessions the workflow leaves out: {sorted(ci - set(run))}"
    )
    assert not set(run) - ci, f"workflow sessions not tagged ci: {sorted(set(run) - ci)}"
    assert _python(jobs["test"]) == "3.11"


def test_a_job_runs_on_the_lowest_declared_python(nox_sessions, jobs):
    lowest = _lowest_declared_python()
    assert lowest == "3.10"
    on_lowest = [j for j in jobs.values() if _python(j) == lowest]
    assert len(on_lowest) == 1, f"{len(on_lowest)} jobs run on Python {lowest}; expected one"
    (job,) = on_lowest
    run = _sessions_run(job)
    assert run, f"the Python {lowest} job runs no nox session"
    for name in run:
        assert name in nox_sessions and "ci" in nox_sessions[name]["tags"], name
        # The shared dev environment (python=False sessions) needs 3.11; on the lowest Python
        # only sessions that make their own virtualenv can run.
        assert nox_sessions[name]["python"] is not False, (
            f"{name} uses the shared 3.11 dev environment; it cannot run on Python {lowest}"
        )
