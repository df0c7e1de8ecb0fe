"""nox sessions for turbine. ``nox -l`` lists them; ``nox -t ci`` is what CI runs.

Most sessions share one development environment (``.venv``, created by ``tools/dev.py`` with the
five packages installed editable and pinned by ``tools/constraints.txt``): installing torch and
IREE once instead of per session keeps CI inside its budget. ``params-standalone`` builds a fresh
virtualenv with numpy alone, to prove turbine-params works without torch or IREE.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "tools"))

import dev  # noqa: E402
import iree_devices  # noqa: E402

nox.options.error_on_missing_interpreters = False
nox.options.default_venv_backend = "venv"

# One table drives the per-package sessions: package -> pytest arguments.
PACKAGES: dict[str, list[str]] = {
    "params": [],
    "ir": [],
    "trace": [],
    "fx": [],
    "aot": [],
}
WORKERS = os.environ.get("TURBINE_PYTEST_WORKERS", "2")


def _dev_python(session: nox.Session) -> str:
    py = str(dev.ensure_env(quiet=True))
    session.log(f"using the shared dev environment {py}")
    return py


def _pytest(
    session: nox.Session, *args: str, env: dict[str, str] | None = None, workers: str = WORKERS
) -> None:
    py = _dev_python(session)
    xdist = ["-n", workers] if workers not in ("0", "1") else []
    session.run(py, "-m", "pytest", *xdist, *args, *session.posargs, env=env or {}, external=True)


def _make_package_session(pkg: str, extra: list[str]) -> None:
    def _tests(session: nox.Session) -> None:
        _pytest(session, f"packages/turbine-{pkg}/tests", *extra)

    _tests.__doc__ = f"Unit, golden-IR and end-to-end tests of turbine-{pkg} (device llvm-cpu)."
    nox.session(name=f"tests-{pkg}", python=False, tags=["ci", "tests"])(_tests)


for _pkg, _extra in PACKAGES.items():
    _make_package_session(_pkg, _extra)


@nox.session(name="tests-repo", python=False, tags=["ci", "tests"])
def tests_repo(session: nox.Session) -> None:
    """Repository-wide checks: the layering contract, docs examples, tooling."""
    _pytest(session, "tests")


@nox.session(name="params-standalone", tags=["ci"])
def params_standalone(session: nox.Session) -> None:
    """turbine-params alone in a fresh venv: numpy only, no torch, no IREE."""
    session.install(
        "-c", str(ROOT / "tools/constraints.txt"), "numpy", "pytest", "pytest-timeout", "hypothesis"
    )
    session.install("--no-deps", "-e", str(ROOT / "packages/turbine-params"))
    session.run(
        "python",
        "-c",
        "import importlib.util as u, sys; "
        "bad=[m for m in ('torch','iree') if u.find_spec(m)]; "
        "sys.exit(f'unexpected packages in standalone env: {bad}' if bad else 0)",
    )
    session.run("python", "-m", "pytest", "packages/turbine-params/tests", *session.posargs)


def _make_backend_session(device: iree_devices.TestDevice, tags: list[str]) -> None:
    def _e2e(session: nox.Session) -> None:
        py = _dev_python(session)
        reason = iree_devices.probe(device, python=py)
        if reason:
            session.skip(f"backend not available: {reason}")
        # Vulkan on Mesa lavapipe: one test process. Two, on a 2-core machine, starve each
        # other (an idle lavapipe device keeps threads busy): a quantized test that takes 11 s
        # alone took 20 minutes beside another worker (docs/development.md).
        workers = "1" if device.name == "vulkan-spirv" else WORKERS
        _pytest(
            session,
            "-m",
            "backend",
            f"--device={device.name}",
            "tests",
            *[f"packages/turbine-{p}/tests" for p in PACKAGES],
            workers=workers,
        )

    _e2e.__doc__ = (
        f"Backend tests on {device.name} (target {device.target_backend}, driver {device.driver})."
    )
    nox.session(name=f"e2e-{device.name}", python=False, tags=tags)(_e2e)


for _dev in iree_devices.DEVICES.values():
    # The default device already runs in every tests-* session; the others run here.
    _tags = ["e2e"] + ([] if _dev.name == iree_devices.DEFAULT_DEVICE else ["ci"])
    _make_backend_session(_dev, _tags)


@nox.session(python=False, tags=["ci"])
def lint(session: nox.Session) -> None:
    """ruff (lint + format check) and mypy on the packages' sources."""
    py = _dev_python(session)
    session.run(py, "-m", "ruff", "check", ".", external=True)
    session.run(py, "-m", "ruff", "format", "--check", ".", external=True)
    session.run(py, "-m", "mypy", external=True)


@nox.session(python=False)
def demo(session: nox.Session) -> None:
    """The main job: export -> compile -> run -> compare with eager on an embedded model."""
    py = _dev_python(session)
    session.run(py, "-m", "turbine_aot", "demo", *session.posargs, external=True)


@nox.session(python=False)
def zoo(session: nox.Session) -> None:
    """Model zoo: real transformers/torchvision/timm models, defaults vs eager, ONNX Runtime and
    OpenVINO (table + JSON)."""
    py = _dev_python(session)
    session.run(py, "benchmarks/zoo.py", "--peers", *session.posargs, external=True)


@nox.session(name="zoo-quick", python=False, tags=["ci"])
def zoo_quick(session: nox.Session) -> None:
    """The zoo's quick subset as tests: export -> compile -> run -> numerics vs eager; the
    benchmark's own turbine candidates (``benchmarks/test_peers.py``); the LLM benchmarks'
    weight bytes a decode step reads (``benchmarks/test_llm_bench.py``); the kernel A/B's
    weights-in-L1 experiment (``benchmarks/test_kernel_ab.py``)."""
    _pytest(
        session,
        "benchmarks/test_zoo.py",
        "benchmarks/test_peers.py",
        "benchmarks/test_llm_bench.py",
        "benchmarks/test_kernel_ab.py",
        "-s",
    )


@nox.session(python=False)
def bench(session: nox.Session) -> None:
    """Benchmarks (figures and ratios against baselines measured in the same run)."""
    py = _dev_python(session)
    session.run(py, "benchmarks/run.py", *session.posargs, external=True)


@nox.session(name="bench-quant", python=False)
def bench_quant(session: nox.Session) -> None:
    """Weight-only int8 / int4 against fp32 on llvm-cpu: 8 x Linear(2048, 2048), batch 1."""
    py = _dev_python(session)
    session.run(py, "benchmarks/quant_bench.py", *session.posargs, external=True)


@nox.session(name="bench-peers", python=False)
def bench_peers(session: nox.Session) -> None:
    """turbine vs ONNX Runtime, OpenVINO, AOTInductor and eager on CPU (fp32; 1 and 2 threads)."""
    py = _dev_python(session)
    session.run(py, "benchmarks/peer_runtimes.py", *session.posargs, external=True)


def _llama_cpp_cmake_args() -> str:
    """llama.cpp's build for this CPU: ``-DGGML_NATIVE=ON``, except on a CPU with AMX, where
    the native build's AMX matmul (llama-cpp-python 0.3.36) crashes the process on the first
    Q8_0 / Q4_0 decode of the benchmark's 110M Llama (a segmentation fault in
    ``ggml_backend_amx_mul_mat``, docs/quantization.md): there the AVX-512 build, every
    AVX-512 extension llama.cpp uses (VNNI, BF16, VBMI) but not AMX."""
    try:
        flags = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        flags = ""
    if "amx_int8" not in flags:
        return "-DGGML_NATIVE=ON"
    features = ("AVX", "AVX2", "FMA", "F16C", "BMI2", "AVX512", "AVX512_VBMI", "AVX512_VNNI")
    features += ("AVX512_BF16", "AVX_VNNI")
    return " ".join(["-DGGML_NATIVE=OFF", *(f"-DGGML_{f}=ON" for f in features)])


@nox.session(name="bench-llm", python=False)
def bench_llm(session: nox.Session) -> None:
    """Llama decode tokens/s: turbine fp32 / int8 / int4 next to llama.cpp F32 / Q8_0 / Q4_0.

    Installs tools/requirements-bench-llm.txt into the dev environment first (llama.cpp built
    for this CPU: several minutes the first time; on a CPU with AMX without llama.cpp's AMX
    path, which crashes there, see ``_llama_cpp_cmake_args``); not part of ``-t ci``.
    """
    py = _dev_python(session)
    env = {"CMAKE_ARGS": os.environ.get("CMAKE_ARGS", _llama_cpp_cmake_args())}
    req = str(ROOT / "tools" / "requirements-bench-llm.txt")
    session.run(py, "-m", "pip", "install", "-r", req, env=env, external=True)
    session.run(py, "benchmarks/llama_cpp_side_by_side.py", *session.posargs, external=True)
