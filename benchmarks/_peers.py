"""The runtimes a user would pick instead of turbine for CPU inference, built as their users build them.

Each builder takes a model and its example inputs and returns a :class:`Built` callable, or raises
(the caller reports the failure; nothing is hidden). Every candidate is called with inputs already
in its own form (numpy arrays for ONNX Runtime and OpenVINO, torch tensors for the others), so
the timed call is the runtime's work plus its own input/output handling, as in a user's loop.

* ``eager`` — the module under ``torch.inference_mode``;
* ``aoti`` — AOTInductor: ``torch._inductor.aoti_compile_and_package`` of the exported program
  (its OpenMP thread count is fixed when it is compiled: build it in the process that times it);
* ``ort`` — ONNX Runtime's CPU execution provider on ``torch.onnx.export(dynamo=True)``, graph
  optimisation ``ORT_ENABLE_ALL``, sequential execution, ``intra_op_num_threads`` = threads;
* ``openvino-f32`` / ``openvino`` — OpenVINO's CPU plugin on ``openvino.convert_model`` of the
  module (its PyTorch front end; the ONNX file if that fails), ``PERFORMANCE_HINT=LATENCY``,
  ``INFERENCE_NUM_THREADS`` = threads; the first with ``INFERENCE_PRECISION_HINT=f32``, the
  second with OpenVINO's default precision (bf16 on CPUs with AVX512-BF16 or AMX);
* ``turbine`` — ``turbine_aot.export`` then ``ExportOutput.compile()`` with its defaults, run on
  ``local-sync`` (1 thread) or ``local-task`` with ``threads`` workers;
* ``turbine-bf16`` — the same with ``compile(precision="bf16")`` (matmuls in bf16 on AMX; fails,
  and says why, on a CPU without AMX-BF16): the column to read next to OpenVINO's default;
* ``turbine-prepared`` — the ``turbine`` module called through ``runtime.PreparedCall``: the
  call contract of the ONNX Runtime and OpenVINO candidates (arguments written into the
  runtime's buffers once, results returned as numpy arrays, copied here as ORT's and
  OpenVINO's are), where ``turbine`` is the eager-like call (torch tensors in, the model's
  output structure rebuilt around torch tensors at every call; docs/running.md).

These packages are dev requirements (``tools/requirements-dev.txt``), never dependencies of
turbine's packages.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

#: Every runtime this module builds, in table order.
RUNTIMES = (
    "eager",
    "aoti",
    "ort",
    "openvino-f32",
    "openvino",
    "turbine",
    "turbine-prepared",
    "turbine-bf16",
)
#: The fp32 peers turbine is measured against ("the faster of ONNX Runtime and OpenVINO-f32").
FP32_PEERS = ("ort", "openvino-f32")


@dataclass
class Built:
    """A runtime ready to call: ``call()`` runs the model once on the prepared inputs."""

    call: Callable[[], Any]
    outputs: Callable[[], list[np.ndarray]]  # one call's outputs, flattened, as numpy
    build_s: float
    notes: list[str] = field(default_factory=list)


def flat_tensors(obj: Any) -> list:
    """The tensors of a (nested) model output, in pytree order (HF ModelOutputs included)."""
    import torch
    from torch.utils import _pytree as pytree

    return [t for t in pytree.tree_leaves(obj) if isinstance(t, torch.Tensor)]


def _np(x: Any) -> np.ndarray:
    import torch

    if isinstance(x, torch.Tensor):
        return x.detach().float().cpu().numpy() if x.is_floating_point() else x.cpu().numpy()
    return np.asarray(x)


def max_abs_err(got: Sequence[np.ndarray], expected: Sequence[np.ndarray]) -> float:
    """Max abs difference over matching outputs; a count or shape mismatch raises."""
    if len(got) != len(expected):
        raise AssertionError(f"{len(got)} outputs, eager has {len(expected)}")
    err = 0.0
    for a, b in zip(got, expected):
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        if a.shape != b.shape:
            raise AssertionError(f"output shape {a.shape} != eager {b.shape}")
        err = max(err, float(np.abs(a - b).max()) if a.size else 0.0)
    return err


# ----------------------------------------------------------------------------------- torch side
def build_eager(module, args: tuple, kwargs: dict) -> Built:
    import torch

    def call() -> Any:
        with torch.inference_mode():
            return module(*args, **kwargs)

    return Built(call, lambda: [_np(t) for t in flat_tensors(call())], 0.0)


def build_aoti(module, args: tuple, kwargs: dict, workdir: Path) -> Built:
    import torch

    t0 = time.perf_counter()
    ep = torch.export.export(module, args, kwargs=kwargs or None, strict=False)
    path = torch._inductor.aoti_compile_and_package(ep, package_path=str(workdir / "aoti.pt2"))
    fn = torch._inductor.aoti_load_package(path)
    build_s = time.perf_counter() - t0

    def call() -> Any:
        with torch.inference_mode():
            return fn(*args, **kwargs)

    return Built(call, lambda: [_np(t) for t in flat_tensors(call())], build_s)


def build_turbine(
    module,
    args: tuple,
    kwargs: dict,
    threads: int,
    workdir: Path,
    *,
    compile_kw: dict | None = None,
    name: str = "turbine",
    prepared: bool = False,
) -> Built:
    """turbine's defaults (and ``compile_kw``); the compiled module is cached in ``workdir``
    across thread counts as ``<name>.vmfb``. ``prepared``: called through a
    ``runtime.PreparedCall`` on the example inputs, its numpy results copied (the module doc's
    ``turbine-prepared``)."""
    import turbine_aot
    from turbine_aot import runtime

    vmfb = workdir / f"{name}.vmfb"
    notes: list[str] = []
    t0 = time.perf_counter()
    if not vmfb.exists():
        eo = turbine_aot.export(module, args=args, kwargs=kwargs)
        eo.compile(save_to=vmfb, **(compile_kw or {}))
        notes.append("flags: " + " ".join(eo._last_compile_flags))
    build_s = time.perf_counter() - t0
    driver = "local-task" if threads > 1 else "local-sync"
    flags = [f"--task_topology_max_group_count={threads}"] if threads > 1 else []
    m = runtime.load_module(vmfb, device=driver, runtime_flags=flags)
    inputs = [*args, *kwargs.values()]
    if prepared:
        call_prepared = prepared_call(m, inputs)
        return Built(call_prepared, call_prepared, build_s, [*notes, "runtime.PreparedCall"])

    def call() -> Any:
        return m.main(*inputs)

    return Built(call, lambda: [_np(t) for t in flat_tensors(call())], build_s, notes)


def prepared_call(module: Any, inputs: Sequence[Any]) -> Callable[[], list[np.ndarray]]:
    """``module.main`` called as the peers are (the module doc's ``turbine-prepared``): through
    a ``runtime.PreparedCall`` made on ``inputs`` once, each call's numpy results copied."""
    from turbine_aot import runtime

    step = runtime.PreparedCall([module.main], inputs)
    return lambda: [np.array(r) for r in step(0)]


# ------------------------------------------------------------------------------------ ONNX side
def export_onnx(module, args: tuple, kwargs: dict, workdir: Path) -> tuple[Path, float]:
    """``torch.onnx.export(dynamo=True)`` to ``workdir/model.onnx`` (cached across processes),
    for inference: under ``torch.no_grad()`` (with autograd on, transformers' T5 encoder fails
    to export: a ``view`` of its transposed attention output)."""
    import torch

    path = workdir / "model.onnx"
    t0 = time.perf_counter()
    if not path.exists():
        tmp = workdir / "model.tmp.onnx"
        with torch.no_grad():
            prog = torch.onnx.export(
                module, args, kwargs=kwargs or None, dynamo=True, verbose=False
            )
        prog.save(str(tmp))
        tmp.rename(path)  # external data (if any) keeps the name it was saved with
    return path, time.perf_counter() - t0


def _feeds(names: Sequence[str], args: tuple, kwargs: dict) -> dict[str, np.ndarray]:
    """ONNX inputs by name: kwargs by their names, positional args by order (unused inputs the
    exporter dropped are left out)."""
    values = {k: _np(v) for k, v in kwargs.items()}
    positional = [_np(a) for a in args]
    feeds: dict[str, np.ndarray] = {}
    for name in names:
        if name in values:
            feeds[name] = values[name]
        elif positional:
            feeds[name] = positional.pop(0)
        else:
            raise ValueError(f"no input for ONNX input {name!r} (have {sorted(values)})")
    return feeds


def build_ort(onnx_path: Path, args: tuple, kwargs: dict, threads: int, export_s: float) -> Built:
    import onnxruntime as ort

    t0 = time.perf_counter()
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
    feeds = _feeds([i.name for i in sess.get_inputs()], args, kwargs)
    build_s = export_s + time.perf_counter() - t0

    def call() -> Any:
        return sess.run(None, feeds)

    return Built(call, lambda: list(call()), build_s, [f"ort {ort.__version__}"])


def convert_openvino(module, args: tuple, kwargs: dict, onnx_path: Path | None):
    """``openvino.convert_model`` of the module (PyTorch front end), else of the ONNX file."""
    import openvino as ov

    notes: list[str] = []
    t0 = time.perf_counter()
    try:
        example = dict(kwargs) if kwargs else (args if len(args) != 1 else args[0])
        model = ov.convert_model(module, example_input=example)
        notes.append("converted from the torch module")
    except Exception as e:
        if onnx_path is None:
            raise
        notes.append(f"torch front end failed ({type(e).__name__}); converted from ONNX")
        model = ov.convert_model(str(onnx_path))
    return model, time.perf_counter() - t0, notes


def build_openvino(
    ov_model,
    convert_s: float,
    notes: list[str],
    args: tuple,
    kwargs: dict,
    threads: int,
    *,
    f32: bool,
) -> Built:
    import openvino as ov

    t0 = time.perf_counter()
    config: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads}
    if f32:
        config["INFERENCE_PRECISION_HINT"] = "f32"
    compiled = ov.Core().compile_model(ov_model, "CPU", config)
    request = compiled.create_infer_request()
    names = [next(iter(p.get_names()), f"arg{i}") for i, p in enumerate(compiled.inputs)]
    feeds = _feeds(names, args, kwargs)
    inputs = [feeds[n] for n in names]
    precision = compiled.get_property("INFERENCE_PRECISION_HINT")
    build_s = convert_s + time.perf_counter() - t0

    def call() -> Any:
        return request.infer(inputs)

    def outputs() -> list[np.ndarray]:
        call()
        return [np.array(request.get_output_tensor(i).data) for i in range(len(compiled.outputs))]

    return Built(call, outputs, build_s, [*notes, f"openvino {ov.__version__}, {precision}"])
