"""turbine_generate on iree.build: outputs, reuse, failures, crashes, pickling, never hanging.

Builds run as real ``iree.build`` command lines in a subprocess with a timeout, so a hang fails
the test instead of blocking CI. The generators here return a stand-in with ``save_mlir`` (what
``turbine_generate`` relies on) to keep these tests fast; test_build_actions_example.py runs the
real ``turbine_aot.export`` through the same machinery and compiles and runs the result.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from iree.build.args import argument_namespace_context
from iree.build.executor import Executor, ProgressReporter

from turbine_aot.build_actions import (
    GeneratorNotRemotableError,
    GeneratorSignatureError,
    RemoteGenerator,
    TurbineBuilderAction,
    turbine_generate,
)

BUILD_TIMEOUT_S = 90

# A build file: generators at module level, a stand-in for ExportOutput, several entrypoints.
BUILD_FILE = textwrap.dedent(
    '''
    from __future__ import annotations

    import os
    import signal
    import time
    from pathlib import Path

    from iree.build import entrypoint, iree_build_main
    from turbine_aot.build_actions import turbine_generate

    LOG = Path(__file__).with_name("calls.log")


    class FakeExportOutput:
        """Has save_mlir(path), like turbine_aot.ExportOutput."""

        def __init__(self, text: str, crash_mid_write: bool = False):
            self.text = text
            self.crash_mid_write = crash_mid_write

        def save_mlir(self, path) -> None:
            with open(path, "w") as f:
                f.write(self.text[: len(self.text) // 2])
                f.flush()
                if self.crash_mid_write:
                    os._exit(3)
                f.write(self.text[len(self.text) // 2 :])


    def variant(n: int, *, mode: str = "ok", sleep: float = 0.0) -> FakeExportOutput:
        with open(LOG, "a") as f:
            f.write(f"{n} {os.getpid()}\\n")
        if mode == "raise":
            raise ValueError(f"variant {n} cannot be exported")
        if mode == "exit":
            os._exit(7)
        if mode == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(sleep)
        text = f"// variant {n} from pid {os.getpid()}\\nmodule @variant_{n} {{\\n}}\\n"
        return FakeExportOutput(text, crash_mid_write=(mode == "crash_in_save"))


    def pair(n: int) -> tuple[FakeExportOutput, FakeExportOutput]:
        return FakeExportOutput(f"module @a{n} {{}}\\n"), FakeExportOutput(f"module @b{n} {{}}\\n")


    class Generator:
        """A class with __call__ works as a generator too."""

        def __init__(self, tag: str):
            self.tag = tag

        def __call__(self, n: int) -> FakeExportOutput:
            return FakeExportOutput(f"// {self.tag} {n}\\nmodule {{}}\\n")


    '''
)

# Entrypoints, one build file each: iree.build analyzes every entrypoint of a file, whichever
# one is built, so one that fails analysis on purpose must live alone.
ENTRYPOINTS = {
    "good": """
@entrypoint
def good():
    outs = [turbine_generate(variant, i, name=f"v{i}", sleep=0.3) for i in range(4)]
    outs.extend(turbine_generate(pair, 1, name="pair"))
    outs.append(turbine_generate(Generator("callable"), 5, name="obj"))
    return outs
""",
    "in_process": """
@entrypoint
def in_process():
    return [
        turbine_generate(variant, 9, name="local", out_of_process=False),
        turbine_generate(variant, 8, name="local_bad", mode="raise", out_of_process=False),
    ]
""",
    "failing": """
@entrypoint
def failing():
    return [
        turbine_generate(variant, 0, name="raises", mode="raise"),
        turbine_generate(variant, 1, name="exits", mode="exit"),
        turbine_generate(variant, 2, name="killed", mode="sigkill"),
        turbine_generate(variant, 3, name="fine"),
        turbine_generate(variant, 4, name="after", sleep=0.2),
    ]
""",
    "crash_in_save": """
@entrypoint
def crash_in_save():
    return [turbine_generate(variant, 0, name="v0", mode="crash_in_save")]
""",
    "slow": """
@entrypoint
def slow():
    return [
        turbine_generate(variant, 0, name="slow", sleep=600.0),
        turbine_generate(variant, 1, name="quick", sleep=0.5),
    ]
""",
    "unpicklable": """
@entrypoint
def unpicklable():
    def nested(n: int) -> FakeExportOutput:
        return FakeExportOutput("module {}")

    return [turbine_generate(nested, 1, name="nested")]
""",
}


def _write_build_file(tmp_path: Path, entrypoint: str) -> Path:
    path = tmp_path / "builder.py"
    main = '\n\nif __name__ == "__main__":\n    iree_build_main()\n'
    path.write_text(BUILD_FILE + "\n\n" + ENTRYPOINTS[entrypoint] + main)
    return path


def _run_build(
    build_file: Path, *args: str, as_module_runner: bool = False, timeout: float = BUILD_TIMEOUT_S
) -> subprocess.CompletedProcess:
    out = build_file.parent / "out"
    if as_module_runner:
        cmd = [sys.executable, "-m", "iree.build", str(build_file)]
    else:
        cmd = [sys.executable, str(build_file)]
    cmd += ["--output-dir", str(out), *args]
    env = dict(os.environ)
    env.pop("TURBINE_GENERATE_MP_CONTEXT", None)
    env.pop("IREE_BUILD_MP_CONTEXT", None)
    try:
        return subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=build_file.parent,
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"build hung for {timeout} s: {cmd}\nstderr so far:\n{e.stderr}")


def _calls(build_file: Path) -> list[tuple[int, int]]:
    log = build_file.with_name("calls.log")
    if not log.exists():
        return []
    return [tuple(map(int, line.split())) for line in log.read_text().splitlines()]


def _gen_dir(build_file: Path, entrypoint: str) -> Path:
    return build_file.parent / "out" / "genfiles" / entrypoint


def _no_temp_files(directory: Path) -> None:
    if directory.exists():
        leftovers = [p.name for p in directory.iterdir() if p.name.endswith(".tmp")]
        assert not leftovers, f"temporary files left behind: {leftovers}"


def test_outputs_parallel_workers_and_reuse(tmp_path: Path) -> None:
    build_file = _write_build_file(tmp_path, "good")
    result = _run_build(build_file, "good", "--turbine-generate-jobs", "2")
    assert result.returncode == 0, result.stderr
    gen = _gen_dir(build_file, "good")
    names = sorted(p.name for p in gen.iterdir())
    assert names == sorted(
        ["v0.mlir", "v1.mlir", "v2.mlir", "v3.mlir", "pair_0.mlir", "pair_1.mlir", "obj.mlir"]
    )
    assert (gen / "pair_1.mlir").read_text() == "module @b1 {}\n"
    assert (gen / "obj.mlir").read_text().startswith("// callable 5")
    # Every output path is printed on stdout by iree.build.
    for name in names:
        assert str(gen / name) in result.stdout
    # Out of process: the generator ran in worker processes (two of them), not the build.
    calls = _calls(build_file)
    assert sorted(n for n, _ in calls) == [0, 1, 2, 3]
    pids = {pid for _, pid in calls}
    assert len(pids) == 2, f"expected 2 workers, saw pids {pids}"
    mtimes = {p.name: p.stat().st_mtime_ns for p in gen.iterdir()}

    # Second build: everything up to date, nothing regenerated.
    again = _run_build(build_file, "good", "--turbine-generate-jobs", "2")
    assert again.returncode == 0, again.stderr
    assert len(_calls(build_file)) == 4
    assert {p.name: p.stat().st_mtime_ns for p in gen.iterdir()} == mtimes

    # A damaged output is not trusted: it is regenerated, and only it.
    (gen / "v2.mlir").write_text("// trunc")
    third = _run_build(build_file, "good", "--turbine-generate-jobs", "2")
    assert third.returncode == 0, third.stderr
    assert [n for n, _ in _calls(build_file)[4:]] == [2]
    assert (gen / "v2.mlir").read_text().startswith("// variant 2 from pid")
    metadata = json.loads((tmp_path / "out" / ".metadata.json").read_text())
    assert "turbine_generate.sha256" in metadata["paths"]["gen/good/v2.mlir"]
    _no_temp_files(gen)

    # A corrupt metadata file (iree.build rewrites it in place) costs a regeneration, not a
    # failed build.
    (tmp_path / "out" / ".metadata.json").write_text('{"paths": {"gen/good/v0.ml')
    fourth = _run_build(build_file, "good", "--turbine-generate-jobs", "2")
    assert fourth.returncode == 0, fourth.stderr
    assert sorted(n for n, _ in _calls(build_file)[5:]) == [0, 1, 2, 3]
    json.loads((tmp_path / "out" / ".metadata.json").read_text())


def test_in_process_runs_in_build_process(tmp_path: Path) -> None:
    build_file = _write_build_file(tmp_path, "in_process")
    result = _run_build(build_file, "in_process")
    # The raising generator fails its action (and the build), the other one is built.
    assert result.returncode != 0
    assert "GenerationError" in result.stderr
    assert "ValueError: variant 8 cannot be exported" in result.stderr
    gen = _gen_dir(build_file, "in_process")
    assert sorted(p.name for p in gen.iterdir()) == ["local.mlir"]
    text = (gen / "local.mlir").read_text()
    pid = dict(_calls(build_file))[9]
    assert f"from pid {pid}" in text
    assert "(in process)" in result.stderr
    # Same process for both: the build's own.
    assert len({p for _, p in _calls(build_file)}) == 1


@pytest.mark.parametrize("mp_context", ["spawn", "forkserver"])
def test_raise_and_worker_death_fail_their_actions_only(tmp_path: Path, mp_context: str) -> None:
    build_file = _write_build_file(tmp_path, "failing")
    start = time.monotonic()
    result = _run_build(
        build_file,
        "failing",
        "--turbine-generate-jobs",
        "2",
        "--turbine-generate-mp-context",
        mp_context,
    )
    elapsed = time.monotonic() - start
    assert result.returncode != 0
    err = result.stderr
    # The raise: its message and the worker's traceback, naming the generator's source line.
    assert "ValueError: variant 0 cannot be exported" in err
    assert "Traceback in the worker process" in err
    assert 'builder.py", line' in err and "in variant" in err
    # The deaths: exit status and signal reported, not a hang, not a BrokenProcessPool.
    assert "exited with code 7" in err
    assert "killed by signal SIGKILL" in err
    assert "BrokenProcessPool" not in err
    assert "ERROR: Failed to build" in err
    # The healthy variants still built after the crashes (the pool replaced dead workers).
    gen = _gen_dir(build_file, "failing")
    assert sorted(p.name for p in gen.iterdir()) == ["after.mlir", "fine.mlir"]
    _no_temp_files(gen)
    assert elapsed < BUILD_TIMEOUT_S


def test_crash_while_saving_leaves_no_truncated_output(tmp_path: Path) -> None:
    build_file = _write_build_file(tmp_path, "crash_in_save")
    result = _run_build(build_file, "crash_in_save")
    assert result.returncode != 0
    assert "exited with code 3" in result.stderr
    gen = _gen_dir(build_file, "crash_in_save")
    # The half-written temp file was removed and no v0.mlir exists for a later build to trust.
    assert not (gen / "v0.mlir").exists()
    _no_temp_files(gen)


def test_timeout_kills_a_stuck_generator(tmp_path: Path) -> None:
    build_file = _write_build_file(tmp_path, "slow")
    start = time.monotonic()
    result = _run_build(
        build_file, "slow", "--turbine-generate-timeout", "2", "--turbine-generate-jobs", "2"
    )
    assert time.monotonic() - start < 60
    assert result.returncode != 0
    assert "did not finish within 2 s" in result.stderr
    # The limit is on the generator, not on starting its worker (spawn + importing torch takes
    # about as long as the limit here): the quick one is built.
    gen = _gen_dir(build_file, "slow")
    assert sorted(p.name for p in gen.iterdir()) == ["quick.mlir"]


def test_build_file_run_by_iree_build_module_runner(tmp_path: Path) -> None:
    # `python -m iree.build builder.py` loads the file as module `__iree_build__`, which no
    # spawned worker can import by name; the generator must still reach the workers.
    build_file = _write_build_file(tmp_path, "good")
    result = _run_build(build_file, "good", as_module_runner=True)
    assert result.returncode == 0, result.stderr
    assert "__iree_build__.variant" in result.stderr
    assert (_gen_dir(build_file, "good") / "v3.mlir").read_text().startswith("// variant 3")


def test_unpicklable_generator_fails_the_build_up_front(tmp_path: Path) -> None:
    build_file = _write_build_file(tmp_path, "unpicklable")
    result = _run_build(build_file, "unpicklable")
    assert result.returncode != 0
    assert "GeneratorNotRemotableError" in result.stderr
    assert "defined at module level" in result.stderr
    assert _calls(build_file) == []


def test_interpreter_exit_with_a_running_worker_does_not_hang(tmp_path: Path) -> None:
    script = tmp_path / "exit_while_busy.py"
    script.write_text(
        textwrap.dedent(
            """
            import functools, pickle, time
            from turbine_aot._build_actions.pool import GeneratorPool

            pool = GeneratorPool(max_workers=1, mp_context="spawn")
            busy = pool.submit(pickle.dumps(functools.partial(time.sleep, 600)), desc="sleeps")
            time.sleep(3)  # The worker is now inside time.sleep(600).
            print("exiting", flush=True)
            """
        )
    )
    start = time.monotonic()
    try:
        result = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        pytest.fail("interpreter exit hung waiting for a busy worker")
    assert "exiting" in result.stdout, result.stderr
    assert time.monotonic() - start < 60


# -- analysis-time checks, in this process ----------------------------------------------------


class StandInOutput:
    def __init__(self, text: str = "module {}\n"):
        self.text = text

    def save_mlir(self, path: str | Path) -> None:
        Path(path).write_text(self.text)


def module_level_generator(n: int) -> StandInOutput:
    return StandInOutput(f"// {n}\nmodule {{}}\n")


def unannotated_generator(n):
    return StandInOutput()


def varargs_tuple_generator(n: int) -> tuple[StandInOutput, ...]:
    return (StandInOutput(),)


def wrong_type_generator(n: int) -> int:
    return n


@contextlib.contextmanager
def _analysis(tmp_path: Path):
    executor = Executor(tmp_path, stderr=io.StringIO(), reporter=ProgressReporter())
    with argument_namespace_context(argparse.Namespace()), executor.get_context("") as ctx:
        yield ctx


def test_lambda_and_nested_generators_fail_up_front(tmp_path: Path) -> None:
    def nested(n: int) -> StandInOutput:
        return StandInOutput()

    with _analysis(tmp_path):
        with pytest.raises(GeneratorNotRemotableError, match="module level"):
            turbine_generate(nested, 1, name="nested")
        with pytest.raises(GeneratorSignatureError, match="no return annotation"):
            turbine_generate(lambda: StandInOutput(), name="lam")


def test_unpicklable_argument_fails_up_front(tmp_path: Path) -> None:
    with _analysis(tmp_path):
        with pytest.raises(GeneratorNotRemotableError, match="picklable arguments"):
            turbine_generate(module_level_generator, threading.Lock(), name="lock")
        # In process, no pickling is needed.
        out = turbine_generate(
            module_level_generator, threading.Lock(), name="lock_local", out_of_process=False
        )
        assert out.path == "lock_local.mlir"


def test_return_annotation_is_required_and_checked(tmp_path: Path) -> None:
    with _analysis(tmp_path):
        with pytest.raises(GeneratorSignatureError, match="no return annotation"):
            turbine_generate(unannotated_generator, 1, name="a")
        with pytest.raises(GeneratorSignatureError, match="number of outputs must be fixed"):
            turbine_generate(varargs_tuple_generator, 1, name="b")
        with pytest.raises(GeneratorSignatureError, match="cannot save"):
            turbine_generate(wrong_type_generator, 1, name="c")
        with pytest.raises(GeneratorSignatureError, match="pass an instance"):
            turbine_generate(StandInOutput, name="d")


def test_declared_outputs_become_build_files_marked_as_torch_input(tmp_path: Path) -> None:
    from iree.build.metadata import CompileSourceMeta

    with _analysis(tmp_path):
        out = turbine_generate(module_level_generator, 3, name="m")
        assert out.path == "m.mlir"
        (action,) = out.deps
        assert isinstance(action, TurbineBuilderAction)
        assert action.thunk is module_level_generator and action.thunk_args == (3,)
        assert CompileSourceMeta.get(out).input_type == "torch"
        remote = action._remotable_thunk()
        assert isinstance(remote, RemoteGenerator)


def test_remote_generator_writes_atomically_and_checks_arity(tmp_path: Path) -> None:
    from turbine_aot.build_actions import ExportOutputMarshaller

    target = tmp_path / "x.mlir"
    written = RemoteGenerator(
        module_level_generator, (4,), {}, [(ExportOutputMarshaller(), target)]
    )()
    assert written == [str(target)]
    assert target.read_text() == "// 4\nmodule {}\n"
    two = [
        (ExportOutputMarshaller(), tmp_path / "a.mlir"),
        (ExportOutputMarshaller(), tmp_path / "b.mlir"),
    ]
    with pytest.raises(GeneratorSignatureError, match="declares 2 outputs but returned one value"):
        RemoteGenerator(module_level_generator, (4,), {}, two)()
    with pytest.raises(GeneratorSignatureError, match="where an ExportOutput"):
        RemoteGenerator(wrong_type_generator, (4,), {}, [(ExportOutputMarshaller(), target)])()
    assert target.read_text() == "// 4\nmodule {}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.mlir"]


def test_signatures_match_the_reference() -> None:
    import inspect

    def params(fn):
        return [(p.name, p.kind.name) for p in inspect.signature(fn).parameters.values()]

    assert params(turbine_generate) == [
        ("generator", "POSITIONAL_OR_KEYWORD"),
        ("args", "VAR_POSITIONAL"),
        ("name", "KEYWORD_ONLY"),
        ("out_of_process", "KEYWORD_ONLY"),
        ("kwargs", "VAR_KEYWORD"),
    ]
    assert inspect.signature(turbine_generate).parameters["out_of_process"].default is True
    assert [p[0] for p in params(RemoteGenerator.__init__)] == [
        "self",
        "generation_thunk",
        "thunk_args",
        "thunk_kwargs",
        "return_info",
    ]
    assert [p[0] for p in params(TurbineBuilderAction.__init__)] == [
        "self",
        "thunk",
        "thunk_args",
        "thunk_kwargs",
        "concurrency",
        "kwargs",
    ]
