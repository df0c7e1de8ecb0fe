"""Dask: the fan-out demo (examples/dask_fanout.py) and the ``--turbine-generate-dask`` backend.

Each test starts a ``LocalCluster`` of two worker processes bound to 127.0.0.1 (nothing listens
on another interface). They run by default: ``distributed`` is a dev requirement
(tools/requirements-dev.txt); without it they skip saying so. Every build runs under a bounded
timeout, so a hang fails the test instead of stalling CI.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[1] / "examples" / "dask_fanout.py"
TIMEOUT_S = 300


def _require_dask() -> None:
    pytest.importorskip(
        "distributed",
        reason="dask's distributed scheduler is not installed (pip install -r "
        "tools/requirements-dev.txt)",
    )


def _build_on_local_dask(tmp_path: Path, build_text: str) -> subprocess.CompletedProcess:
    """Runs ``build_text`` as an iree.build file on a 2-worker local Dask cluster (bounded)."""
    _require_dask()
    build_file = tmp_path / "builder.py"
    build_file.write_text(build_text)
    cmd = [
        sys.executable,
        str(build_file),
        "--output-dir",
        str(tmp_path / "out"),
        "--turbine-generate-dask",
        "local",
        "--turbine-generate-jobs",
        "2",
    ]
    try:
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"Dask build hung for {TIMEOUT_S} s\nstderr so far:\n{e.stderr}")


@pytest.mark.slow
def test_dask_fanout_demo_exports_every_variant(tmp_path: Path) -> None:
    _require_dask()
    out = tmp_path / "out"
    cmd = [sys.executable, str(DEMO), "--output-dir", str(out), "--workers", "2"]
    try:
        result = subprocess.run(
            cmd, capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"Dask demo hung for {TIMEOUT_S} s\nstderr so far:\n{e.stderr}")
    assert result.returncode == 0, result.stderr
    assert "3 variants exported on the cluster" in result.stdout
    signatures = {
        p.stem: re.search(r"func\.func @main\(([^)]*)\)", p.read_text()).group(1)
        for p in out.glob("*.mlir")
    }
    assert sorted(signatures) == ["two_branch_b1", "two_branch_b8", "two_branch_dyn"]
    assert "[?,16]" in signatures["two_branch_dyn"]
    assert "[8,16]" in signatures["two_branch_b8"]


BUILD_FILE = textwrap.dedent(
    """
    from __future__ import annotations

    import os
    from pathlib import Path

    from iree.build import entrypoint, iree_build_main
    from turbine_aot.build_actions import turbine_generate


    class FakeExportOutput:
        def __init__(self, text: str):
            self.text = text

        def save_mlir(self, path) -> None:
            Path(path).write_text(self.text)


    def variant(n: int, *, mode: str = "ok") -> FakeExportOutput:
        if mode == "raise":
            raise ValueError(f"variant {n} cannot be exported")
        return FakeExportOutput(f"// variant {n} from pid {os.getpid()}\\nmodule {{}}\\n")


    @entrypoint
    def variants():
        outs = [turbine_generate(variant, i, name=f"v{i}") for i in range(3)]
        outs.append(turbine_generate(variant, 9, name="bad", mode="raise"))
        return outs


    if __name__ == "__main__":
        iree_build_main()
    """
)


@pytest.mark.slow
def test_generate_on_a_local_dask_cluster(tmp_path: Path) -> None:
    result = _build_on_local_dask(tmp_path, BUILD_FILE)
    # The raising generator fails its action with its traceback; the others are built.
    assert result.returncode != 0
    assert "ValueError: variant 9 cannot be exported" in result.stderr
    gen = tmp_path / "out" / "genfiles" / "variants"
    assert sorted(p.name for p in gen.glob("*.mlir")) == ["v0.mlir", "v1.mlir", "v2.mlir"]
    assert (gen / "v1.mlir").read_text().startswith("// variant 1 from pid")


KILLED_WORKER_BUILD_FILE = textwrap.dedent(
    """
    from __future__ import annotations

    import os
    import signal
    from pathlib import Path

    from iree.build import entrypoint, iree_build_main
    from turbine_aot.build_actions import turbine_generate

    MARKS = Path(__file__).parent / "marks"


    class FakeExportOutput:
        def __init__(self, text: str):
            self.text = text

        def save_mlir(self, path) -> None:
            Path(path).write_text(self.text)


    def variant(n: int, *, dies: str = "never") -> FakeExportOutput:
        # The worker process is killed (SIGKILL) in the middle of the export: once for
        # "once" (the retry on another worker succeeds), every time for "always".
        MARKS.mkdir(exist_ok=True)
        attempt = len(list(MARKS.glob(f"{n}-*")))
        (MARKS / f"{n}-{attempt}-{os.getpid()}").write_text("")
        if dies == "always" or (dies == "once" and attempt == 0):
            os.kill(os.getpid(), signal.SIGKILL)
        return FakeExportOutput(f"// variant {n} attempt {attempt}\\nmodule {{}}\\n")


    @entrypoint
    def variants():
        outs = [turbine_generate(variant, i, name=f"v{i}") for i in range(3)]
        outs.append(turbine_generate(variant, 7, name="flaky", dies="once"))
        outs.append(turbine_generate(variant, 8, name="doomed", dies="always"))
        return outs


    if __name__ == "__main__":
        iree_build_main()
    """
)


@pytest.mark.slow
def test_a_worker_killed_mid_export(tmp_path: Path) -> None:
    """A variant whose worker dies once is retried on another worker and built; one whose
    worker dies on every attempt fails with an error naming it; the others are built; nothing
    hangs."""
    result = _build_on_local_dask(tmp_path, KILLED_WORKER_BUILD_FILE)
    assert result.returncode != 0, result.stdout + result.stderr
    gen = tmp_path / "out" / "genfiles" / "variants"
    built = sorted(p.name for p in gen.glob("*.mlir"))
    assert built == ["flaky.mlir", "v0.mlir", "v1.mlir", "v2.mlir"], result.stderr
    # Attempt 0 dies; attempt 1 builds it. Only the variant running on a worker pays for its
    # death: one queued behind it on that worker, or finished there with its result not yet
    # fetched, is resubmitted without using an attempt, so "doomed" killing its workers never
    # costs "flaky" a try (a resubmitted finished attempt runs again: marks 7-2...).
    assert "variant 7 attempt 0" not in (gen / "flaky.mlir").read_text()
    marks = sorted(p.name.split("-")[:2] for p in (tmp_path / "marks").iterdir())
    assert [m for m in marks if m[0] == "7"][:2] == [["7", "0"], ["7", "1"]]
    pids = {p.name.split("-")[2] for p in (tmp_path / "marks").glob("7-*")}
    assert len(pids) >= 2  # the retry ran in another worker process
    assert "flaky with __main__.variant (out of process): its Dask worker died (attempt 2" not in (
        result.stderr
    )  # one death, one attempt used
    assert re.search(
        r"Generating doomed .*: the Dask worker process running it died on each of 3 attempts "
        r".*each time on another worker; it was not built",
        result.stderr,
    ), result.stderr
    assert [m for m in marks if m[0] == "8"] == [["8", "0"], ["8", "1"], ["8", "2"]]
    # v0-v2 each ran at least once; one may run again when its result was lost with a
    # worker killed before the result was fetched (never counted as an attempt: no error).
    assert {m[0] for m in marks} == set("01278")
    assert "Generating flaky" not in result.stderr.split("Root causes:")[-1]
    assert not list(gen.glob(".*.tmp"))  # the killed writers' temporaries are gone
