"""Checked loading of untrusted ``.vmfb`` files: load once in a short-lived child process first.

IREE does not verify a module's contents: a corrupted or hostile ``.vmfb`` can make
``VmModule.mmap`` or the module's initializer read out of bounds and kill the process (SIGSEGV,
SIGBUS, SIGILL), with no Python exception to catch. ``load_module(..., verify=True)`` (CLI:
``turbine-aot run --verify``) therefore first runs the same loading steps in a child process
(this file, run as a script: it imports only ``iree.runtime``, not torch) and loads in-process
only when the child survived:

1. map the module and read every function's reflection (the ABI declaration);
2. create the devices and bind the parameter files given as paths;
3. create the VM context, which links the module and runs its initializers.

If the child dies, :func:`check_module_in_child` raises :class:`TurbineRuntimeError` naming the
signal; if it does not finish within ``timeout`` seconds, it is killed and the error says so. A
child that fails with an ordinary error (not a module, missing parameter) passes the check: the
in-process load then reports that error with its usual message. Parameters passed in memory (a
dict of tensors, a ``ParameterIndex``) cannot be handed to the child, which then links the module
without them; the check is weaker there (initializers reading those parameters do not run).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from turbine_aot._errors import TurbineRuntimeError

__all__ = ["DEFAULT_CHECK_TIMEOUT", "check_module_in_child"]

#: Seconds the checking child may take (device creation + mapping + initializers).
DEFAULT_CHECK_TIMEOUT = 300.0

_EXIT_ERROR = 3  # the child raised an ordinary exception: not a crash


def check_module_in_child(
    data: bytes | memoryview | None,
    path: str | os.PathLike | None,
    devices: Sequence[str],
    parameters: Any = None,
    *,
    timeout: float = DEFAULT_CHECK_TIMEOUT,
) -> None:
    """Loads the module (``data``, or the file ``path``) in a child process; raises if it dies.

    Args:
        data: the module's bytes (written to a temporary file for the child), or None.
        path: the module's file when ``data`` is None.
        devices: device URIs, as for ``load_module``.
        parameters: as for ``load_module``; only parameter files are passed to the child.
        timeout: seconds before the child is considered hung.

    Raises:
        TurbineRuntimeError: the child was killed by a signal (the module crashes IREE) or hung.
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
            "sys_path": [p for p in sys.path if p],  # -I drops PYTHONPATH: iree is found anyway
        }
        try:
            proc = subprocess.run(
                [sys.executable, "-I", __file__, json.dumps(config)],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            raise TurbineRuntimeError(
                f"{where} did not finish loading within {timeout:g} s in a checking child "
                "process (it was killed); the module may be corrupted or its initializers "
                "loop: it was not loaded here"
            ) from None
    finally:
        if tmp is not None:
            os.unlink(tmp)
    if proc.returncode < 0:
        try:
            name = signal.Signals(-proc.returncode).name
        except ValueError:
            name = f"signal {-proc.returncode}"
        said = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        detail = f" (it printed: {said[-1].strip()[:200]})" if said else ""
        raise TurbineRuntimeError(
            f"{where} crashed the IREE runtime while loading: a checking child process was "
            f"killed by {name}{detail}. The module is corrupted, or not one this IREE can load; "
            "it was not loaded here. Recompile it, or get an intact copy"
        )
    if proc.returncode not in (0, _EXIT_ERROR):
        raise TurbineRuntimeError(
            f"{where} made the checking child process exit with status {proc.returncode} "
            f"while loading ({(proc.stderr.strip().splitlines() or ['no output'])[-1][:200]}); "
            "it was not loaded here"
        )


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


def _child_main(config: dict[str, Any]) -> None:  # pragma: no cover - runs in the child
    import iree.runtime as rt

    instance = rt.VmInstance()
    module = rt.VmModule.mmap(instance, config["module"])
    for name in module.function_names:
        module.lookup_function(name).reflection  # noqa: B018 - parses the reflection attrs
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
    rt.VmContext(instance, [*modules, module])


if __name__ == "__main__":  # pragma: no cover - the child process
    _config = json.loads(sys.argv[1])
    sys.path[:] = _config["sys_path"]
    import iree.runtime  # noqa: F401 - not found: a traceback and status 1, which is no pass

    try:
        _child_main(_config)
    except Exception as e:  # an ordinary error: the in-process load reports it properly
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(_EXIT_ERROR)
