"""Checked loading of untrusted ``.vmfb`` files: load and call once in a short-lived child first.

IREE does not verify a module's contents: a corrupted or hostile ``.vmfb`` can make
``VmModule.mmap``, the module's initializer or its compiled code read out of bounds and kill the
process (SIGSEGV, SIGBUS, SIGILL), with no Python exception to catch. ``load_module(...,
check_in_child=True)`` (CLI: ``turbine-aot run --check-in-child``) therefore first runs the same steps in a child
process (this file, run as a script: it imports only ``iree.runtime``, not torch) and loads
in-process only when the child survived:

1. map the module and read its public functions' reflection, which the child sends back;
2. create the devices and bind the parameter files given as paths;
3. create the VM context, which links the module and runs its initializers;
4. call each public function once on zeros shaped by its signature (read here from the
   reflection of step 1, with the same reader as the in-process load): every static
   dimension as recorded, each dynamic one at the smallest size of at least 1 that its
   recorded range allows. The damage of a byte-flipped module is often in the compiled code,
   which only runs when called. ``check_in_child="load"`` stops after step 3.

A function is not called (and the check says why in ``LoadedModule.checked_calls``) when its
inputs cannot be built: a dynamic dimension without a recorded range (a ``.vmfb`` not exported
by turbine), an argument that is not a tensor or a number, an element type IREE's runtime has no
buffer type for, or more than :data:`MAX_CALL_INPUT_BYTES` of inputs. The child's calls change
only the child's globals (a stateful module starts from its initial state in-process).

If the child dies, :func:`check_module_in_child` raises :class:`TurbineRuntimeError` naming the
signal and the step (loading, or calling which function); if it does not finish within
``timeout`` seconds, it is killed and the error says so. A child that fails with an ordinary
error passes the check: while loading (not a module, a missing parameter), the in-process load
then reports that error with its usual message; while calling (IREE refused the zeros, e.g. an
index the program checks), the function's entry in ``checked_calls`` says ``call failed`` and
a warning is logged: the error would be an exception in-process too, not a crash. Parameters
passed in memory (a dict of tensors, a ``ParameterIndex``) cannot be handed to the child, which
then neither initializes nor calls the module with them: the check is weaker there.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from turbine_aot._errors import TurbineRuntimeError
from turbine_aot._runtime.tensors import hal_element_type
from turbine_aot._signatures.abi import FlatSignature, affinity_device_index
from turbine_aot._signatures.checks import eval_expression
from turbine_aot._signatures.reflection import function_signature

__all__ = ["DEFAULT_CHECK_TIMEOUT", "MAX_CALL_INPUT_BYTES", "check_module_in_child"]

logger = logging.getLogger("turbine.aot.runtime")

#: Seconds the checking child may take (device creation + mapping + initializers + calls).
DEFAULT_CHECK_TIMEOUT = 300.0
#: A function whose zero inputs would take more bytes than this is not called by the check.
MAX_CALL_INPUT_BYTES = 1 << 30

_EXIT_ERROR = 3  # the child raised an ordinary exception while loading: not a crash
_LINE = "turbine-check:"  # the prefix of the child's protocol lines on its stdout


def check_module_in_child(
    data: bytes | memoryview | None,
    path: str | os.PathLike | None,
    devices: Sequence[str],
    parameters: Any = None,
    *,
    timeout: float | None = None,
    calls: bool = True,
    signatures: Mapping[str, FlatSignature] | None = None,
) -> dict[str, str]:
    """Loads the module (``data``, or the file ``path``) in a child process, calls each public
    function once on zeros of its signature (with ``calls``), and raises if the child dies.

    Args:
        data: the module's bytes (written to a temporary file for the child), or None.
        path: the module's file when ``data`` is None.
        devices: device URIs, as for ``load_module``.
        parameters: as for ``load_module``; only parameter files are passed to the child.
        timeout: seconds before the child is considered hung (default:
            :data:`DEFAULT_CHECK_TIMEOUT`, read at each call).
        calls: also call the functions (False: load only).
        signatures: as for ``load_module``, for functions without recorded signatures.

    Returns:
        Function name -> ``"called"``, ``"call failed: ..."`` or ``"not called: ..."`` (empty
        without ``calls``, or when the child failed with an ordinary error while loading).

    Raises:
        TurbineRuntimeError: the child was killed by a signal (the module crashes IREE), hung,
            or a signature record of the module is damaged.
    """
    where = repr(str(path)) if data is None else "the given module bytes"
    tmp: str | None = None
    try:
        if data is not None:
            fd, tmp = tempfile.mkstemp(prefix="turbine-check-", suffix=".vmfb")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            module_file = tmp
        else:
            module_file = str(path)
        config = {
            "module": module_file,
            "devices": list(devices),
            "parameters": _parameter_files(parameters),
            "calls": calls,
            "sys_path": [p for p in sys.path if p],  # -I drops PYTHONPATH: iree is found anyway
        }
        if timeout is None:
            timeout = DEFAULT_CHECK_TIMEOUT
        return _Child(config, where, timeout, signatures or {}, len(devices)).run()
    finally:
        if tmp is not None:
            os.unlink(tmp)


class _Child:
    """One checking child: started, fed the call plan, watched until it exits."""

    def __init__(
        self,
        config: dict[str, Any],
        where: str,
        timeout: float,
        signatures: Mapping[str, FlatSignature],
        num_devices: int,
    ):
        self.config = config
        self.where = where
        self.timeout = timeout
        self.signatures = signatures
        self.num_devices = num_devices
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.step = "loading"
        self.outcomes: dict[str, str] = {}

    def run(self) -> dict[str, str]:
        deadline = time.monotonic() + self.timeout
        with tempfile.TemporaryFile("w+", errors="replace") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-I", __file__, json.dumps(self.config)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                errors="replace",
            )
            reader = threading.Thread(target=self._read, args=(proc.stdout,), daemon=True)
            reader.start()
            try:
                self._converse(proc, deadline)
                proc.wait(timeout=max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise TurbineRuntimeError(
                    f"{self.where} did not finish {self._step_text()} within {self.timeout:g} s "
                    "in a checking child process (it was killed); the module may be corrupted "
                    "or loop: it was not loaded here"
                ) from None
            except BaseException:
                proc.kill()
                proc.wait()
                raise
            finally:
                with contextlib.suppress(OSError):
                    proc.stdin.close()  # type: ignore[union-attr]
                reader.join(timeout=5)
            stderr.seek(0)
            said = [ln for ln in stderr.read().splitlines() if ln.strip()]
        self._judge(proc.returncode, said)
        return self.outcomes

    def _read(self, stream: Any) -> None:
        for line in stream:
            if line.startswith(_LINE):
                self.lines.put(line[len(_LINE) :])
        self.lines.put(None)

    def _converse(self, proc: subprocess.Popen, deadline: float) -> None:
        """Follows the child's lines until it closes its output: answers its reflection report
        with the call plan, and remembers which function it is calling."""
        while True:
            try:
                line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise subprocess.TimeoutExpired(proc.args, self.timeout) from None
            if line is None:
                return
            msg = json.loads(line)
            if "functions" in msg:
                plan = self._plan(msg["functions"]) if self.config["calls"] else {}
                # From a thread: a large plan fills the pipe until the child reads it, after
                # loading, and a child that hangs while loading must still time out here.
                threading.Thread(
                    target=_send, args=(proc.stdin, json.dumps(plan) + "\n"), daemon=True
                ).start()
            elif "calling" in msg:
                self.step = f"calling {msg['calling']}()"
            elif "called" in msg:
                self.outcomes[msg["called"]] = "called"
                self.step = f"after calling {msg['called']}()"
            elif "failed" in msg:
                self.outcomes[msg["failed"]] = f"call failed: {msg.get('error', '')}"
                logger.warning(
                    "%s: %s() on zeros of its signature failed in the checking child: %s "
                    "(not a crash; the module is loaded)",
                    self.where,
                    msg["failed"],
                    msg.get("error", ""),
                )
                self.step = f"after calling {msg['failed']}()"

    def _plan(self, reflections: Mapping[str, Mapping[str, str]]) -> dict[str, Any]:
        """Function -> the zero arguments the child calls it with; reasons for the others."""
        plan: dict[str, Any] = {}
        named: dict[str, int] = {}
        for name, reflection in reflections.items():
            # A damaged record raises here, as the in-process load would.
            sig = function_signature(name, reflection, self.signatures.get(name), where=self.where)
            args = zero_arguments(sig, named, self.num_devices)
            if isinstance(args, str):
                self.outcomes[name] = f"not called: {args}"
                continue
            plan[name] = {"args": args, "results": len(sig.outputs)}
        return plan

    def _step_text(self) -> str:
        return "loading" if self.step == "loading" else f"{self.step}, after loading"

    def _judge(self, returncode: int, said: list[str]) -> None:
        if returncode < 0:
            try:
                name = signal.Signals(-returncode).name
            except ValueError:
                name = f"signal {-returncode}"
            detail = f" (it printed: {said[-1].strip()[:200]})" if said else ""
            if self.step != "loading":
                what = (
                    f"crashed the IREE runtime {'while ' if self.step.startswith('calling') else ''}"
                    f"{self.step} on zeros of its signature: a checking child process was "
                    f"killed by {name}{detail}. The module's compiled code is corrupted (or "
                    "crashes on such inputs); it was not loaded here. Recompile it, or get an "
                    "intact copy (or load it with check_in_child='load', which does not call it)"
                )
            else:
                what = (
                    f"crashed the IREE runtime while loading: a checking child process was "
                    f"killed by {name}{detail}. The module is corrupted, or not one this IREE "
                    "can load; it was not loaded here. Recompile it, or get an intact copy"
                )
            raise TurbineRuntimeError(f"{self.where} {what}")
        if returncode not in (0, _EXIT_ERROR):
            raise TurbineRuntimeError(
                f"{self.where} made the checking child process exit with status {returncode} "
                f"while {self.step} ({(said or ['no output'])[-1][:200]}); it was not loaded here"
            )
        if returncode == _EXIT_ERROR:
            self.outcomes.clear()  # an error while loading: the in-process load reports it


def zero_arguments(sig: FlatSignature, named: dict[str, int], num_devices: int) -> Any:
    """The child's arguments for one call of ``sig`` on zeros, or the reason there is none.

    Each argument is ``{"tensor": [shape], "element_type": int, "device": i}``, ``{"int": 0}``
    or ``{"float": 0.0}``. Shapes come from the recorded call signature when there is one
    (each dynamic dimension at ``max(min, 1)`` of its range, expressions of them evaluated),
    else from the flat ABI (static dimensions only). ``named`` gives device names indices in
    order of appearance, as the in-process load does.
    """
    leaves = sig.call.flat_inputs() if sig.call is not None else None
    sizes: dict[str, int] = {}
    if sig.call is not None:
        for sym, (lo, hi) in sig.call.dims.items():
            sizes[sym] = lo if hi is not None and hi < 1 else max(lo, 1)
    args: list[dict[str, Any]] = []
    total = 0
    for i in range(len(leaves) if leaves is not None else len(sig.inputs)):
        spec = sig.inputs[i] if i < len(sig.inputs) else None
        leaf = leaves[i] if leaves is not None else None
        label = leaf.path if leaf is not None else str(i)
        dtype = spec.dtype if spec is not None else str(leaf.dtype if leaf else "")
        is_tensor = (
            spec.is_tensor if spec is not None else leaf is not None and leaf.kind == "tensor"
        )
        device = affinity_device_index(
            spec.device if spec is not None else (leaf.device if leaf else None), named
        )
        if device >= num_devices:
            return f"argument {label} is placed on device {device}; {num_devices} are loaded"
        if not is_tensor:
            if dtype in ("f16", "bf16", "f32", "f64"):
                args.append({"float": 0.0})
            elif re.fullmatch(r"[su]?i[0-9]+|index", dtype):
                args.append({"int": 0})
            else:
                return f"argument {label} is a {dtype}, which the check cannot make"
            continue
        dims: Sequence[Any] = spec.shape if spec is not None else ()
        if (
            leaf is not None
            and leaf.kind == "tensor"
            and (spec is None or len(leaf.shape) == len(dims))
        ):
            dims = leaf.shape  # symbols and their ranges
        shape = []
        for d in dims:
            size = d if isinstance(d, int) else None
            if isinstance(d, str):
                size = sizes.get(d)
                if size is None:
                    size = eval_expression(d, sizes)
            if size is None or size < 0:
                what = f"{label} ({spec})" if spec is not None else label
                return f"argument {what} has a dynamic dimension without a recorded range"
            shape.append(size)
        element_type = hal_element_type(dtype)
        if element_type is None:
            return f"argument {label} has element type {dtype}, which IREE's runtime cannot hold"
        total += math.prod(shape) * (((element_type & 0xFF) + 7) // 8)
        if total > MAX_CALL_INPUT_BYTES:
            return f"its zero inputs would take more than {MAX_CALL_INPUT_BYTES} bytes"
        args.append({"tensor": shape, "element_type": element_type, "device": device})
    return args


def _parameter_files(parameters: Any) -> dict[str, list[str]]:
    """scope -> parameter file paths, leaving out what lives in memory."""
    if parameters is None:
        return {}
    if isinstance(parameters, (str, os.PathLike)):
        parameters = {"model": parameters}
    if not isinstance(parameters, Mapping):
        return {}
    out: dict[str, list[str]] = {}
    for scope, source in parameters.items():
        sources = (
            [source]
            if isinstance(source, (str, os.PathLike))
            else list(source)
            if isinstance(source, (list, tuple))
            else []
        )
        files = [str(s) for s in sources if isinstance(s, (str, os.PathLike)) and Path(s).is_file()]
        if files:
            out[str(scope)] = files
    return out


def _send(stream: Any, text: str) -> None:
    with contextlib.suppress(OSError, ValueError):  # a child that died reports itself
        stream.write(text)
        stream.flush()


# ----------------------------------------------------------------------------- the child
def _say(**msg: Any) -> None:  # pragma: no cover - runs in the child
    sys.stdout.write(_LINE + json.dumps(msg) + "\n")
    sys.stdout.flush()


def _child_main(config: dict[str, Any]) -> None:  # pragma: no cover - runs in the child
    import iree.runtime as rt

    instance = rt.VmInstance()
    module = rt.VmModule.mmap(instance, config["module"])
    reflections = {}
    # The in-process load's order: the public functions' reflection (an unreadable one is an
    # error there too, before anything runs), then devices, parameters and the context.
    for name in module.function_names:
        if not name.startswith("__") and "$" not in name:
            reflections[name] = dict(module.lookup_function(name).reflection or {})
    _say(functions=reflections)
    uris = config["devices"]
    devices = [rt.get_device(u, cache=u not in uris[:i]) for i, u in enumerate(uris)]
    hal = (
        rt.create_hal_module(instance, devices[0])
        if len(devices) == 1
        else rt.create_hal_module(instance, devices=devices)
    )
    modules = [hal]
    if config["parameters"]:
        providers, keep = [], []
        for scope, files in config["parameters"].items():
            index = rt.ParameterIndex()
            for f in files:
                index.load(f)
            keep.append(index)
            providers.append(index.create_provider(scope=scope))
        modules.append(rt.create_io_parameters_module(instance, *providers))
    context = rt.VmContext(instance, [*modules, module])
    plan = json.loads(sys.stdin.readline() or "{}")
    for name, call in plan.items():
        _say(calling=name)
        try:
            inputs = rt.VmVariantList(len(call["args"]))
            for arg in call["args"]:
                if "int" in arg:
                    inputs.push_int(0)
                elif "float" in arg:
                    inputs.push_float(0.0)
                else:
                    device = devices[arg["device"]]
                    shape = arg["tensor"]
                    nbytes = math.prod(shape) * ((arg["element_type"] & 0xFF) + 7) // 8
                    # 4096-aligned host memory: Vulkan on lavapipe refuses other pointers.
                    raw = np.zeros(max(nbytes, 1) + 4096, np.uint8)
                    start = (-raw.ctypes.data) % 4096
                    buffer = device.allocator.allocate_buffer_copy(
                        memory_type=rt.MemoryType.DEVICE_LOCAL,
                        allowed_usage=rt.BufferUsage.DEFAULT,
                        device=device,
                        buffer=raw[start : start + max(nbytes, 1)],
                    )
                    view = rt.HalBufferView(buffer, shape, arg["element_type"])
                    inputs.push_ref(view.ref)
            outputs = rt.VmVariantList(max(call["results"], 1))
            context.invoke(module.lookup_function(name), inputs, outputs)
        except Exception as e:  # IREE refused the call: an error, not a crash
            _say(failed=name, error=(str(e).strip().splitlines() or [type(e).__name__])[0][:300])
            continue
        _say(called=name)


if __name__ == "__main__":  # pragma: no cover - the child process
    _config = json.loads(sys.argv[1])
    sys.path[:] = _config["sys_path"]
    import iree.runtime  # noqa: F401 - not found: a traceback and status 1, which is no pass

    try:
        _child_main(_config)
    except Exception as e:  # an ordinary error: the in-process load reports it properly
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(_EXIT_ERROR)
