"""``ExportOutput``: an exported program's imported MLIR module in its compiler session — the
IR (print, save, verify, import phases), compiling it to a ``.vmfb``, and loading it."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iree.compiler.api import Output, Session

from .._compiled_module.module import CompiledModule, ImportPhase
from .._compiled_module.module_io import save_module, verify_module
from .._compiler.bf16 import precision_flags
from .._compiler.fallback import compile_with_fallback
from .._compiler.flags import as_list as _as_list
from .._compiler.flags import compile_flags_for
from .._compiler.invoke import compile_module
from .._compiler.refusals import check_program_for_target
from .._compiler.session import session_flags
from .._compiler.traits import program_traits
from .._errors import CompileError
from .._runtime.devices import normalize_devices
from .._runtime.loading import load_module
from .._signatures.abi import FlatSignature, signatures_from_mlir
from .._signatures.recording import compile_record
from .cached_compile import compile_export_output

__all__ = ["CompilePlan", "ExportOutput"]


@dataclass(frozen=True)
class CompilePlan:
    """The flags of one compile of an ``ExportOutput``, computed once: ``flags`` as handed to
    IREE (the compile cache's key), ``user_flags`` the ones the user named (the fallback keeps
    them), ``target`` the target's name for messages."""

    flags: tuple[str, ...]
    user_flags: tuple[str, ...]
    target: str


_log = logging.getLogger("turbine.aot")


class ExportOutput:
    """Wrapper around a CompiledModule produced by :func:`turbine_aot.export`.

    Gives access to the imported MLIR (``mlir_module``, ``print_readable``, ``save_mlir``), moves
    it through the import phases (``import_to``) and compiles it to an IREE VM module
    (``compile``).

    Args:
        session: the ``iree.compiler.api.Session`` whose context holds the module. Flags set on it
            (``session.set_flags(...)``) are honoured by :meth:`compile`.
        compiled_module: the imported :class:`CompiledModule` instance.
        importer_uses_session: kept for API compatibility with the reference.
    """

    def __init__(
        self,
        session: Session,
        compiled_module: CompiledModule,
        *,
        importer_uses_session: bool = False,
    ):
        self.session = session
        self.compiled_module = compiled_module
        self.importer_uses_session = importer_uses_session
        #: The flags the last compile() used (None before one): without the speed-only defaults
        #: when compiling with them failed (_compiler.fallback.compile_with_fallback).
        self._last_compile_flags: list[str] | None = None

    # ---- the IR ---------------------------------------------------------------------------
    @property
    def mlir_module(self) -> Any:
        """Gets the MLIR module (an ``Operation``) resulting from the last import phase."""
        return CompiledModule.get_mlir_module(self.compiled_module)

    def verify(self) -> None:
        """Runs the verifier on the module, raising :class:`ExportError` on failure."""
        verify_module(self.mlir_module, what="the exported module")

    def print_readable(self, large_elements_limit: int = 50) -> None:
        """Prints a human readable version of the current IR (large constants elided)."""
        # Elide both dense constants with more elements and resource blobs (weights) with more
        # bytes than the limit.
        print(
            self.mlir_module.get_asm(
                large_elements_limit=large_elements_limit,
                large_resource_limit=large_elements_limit,
            )
        )

    def save_mlir(self, file_path: str | Path) -> None:
        """Saves the current IR to ``file_path`` (bytecode for ``.mlirbc``, else text), atomically."""
        save_module(self.mlir_module, file_path)

    def import_to(self, import_to: ImportPhase | str) -> None:
        """Moves the module to an import phase (``torch``, ``import``/``custom_op_expansion``,
        ``iree_internal``/``full``). A no-op if already there."""
        CompiledModule.run_import(self.compiled_module, import_to)

    # ---- compilation ---------------------------------------------------------------------------
    def compile(
        self,
        save_to: str | Path | Output | None = None,
        *,
        target_backends: str | Sequence[str] | None = ("llvm-cpu",),
        target_device: str | Sequence[str] | None = None,
        extra_args: Sequence[str] = (),
        host_cpu: bool = True,
        precision: str = "fp32",
    ) -> Output | None:
        """Compiles the exported program to an IREE VM module (``.vmfb``).

        Compilation runs in-process in a fresh compiler session (flags set on :attr:`session`
        are carried over), so the exported IR is left unchanged and can be compiled again for
        another target.

        Args:
            save_to: ``None`` to compile to memory and return the compiler ``Output`` (read it
                with ``output.map_memory()``); a path to write the ``.vmfb`` atomically; or an
                ``Output`` to write into.
            target_backends: a comma separated string or sequence of IREE backends (the legacy
                way to pick a target). ``None`` specifies no target: then set one with
                ``export_output.session.set_flags("--iree-hal-target-device=...")`` or
                ``extra_args``.
            target_device: one target device name (``"llvm-cpu"``, ``"vmvx"``, ``"vulkan"``,
                ``"cuda"``, ``"rocm"``, ...) or several for a multi-device program (arguments
                placed with ``DeviceAffinity(i)`` go to the i-th). Overrides ``target_backends``.
            extra_args: more ``iree-compile`` flags; each replaces a default of the same name
                (e.g. ``"--iree-llvmcpu-target-cpu=generic"``).
            host_cpu: for CPU targets, tune for this machine's CPU (default). ``False`` builds a
                portable module.
            precision: ``"fp32"`` (default) or ``"bf16"``: on llvm-cpu, on a CPU with AMX-BF16,
                the fp32 matmuls run in bf16 on AMX (weights converted once, activations per
                call, f32 accumulation; the exported program stays fp32). Adds the
                ``--turbine-precision=bf16`` flag (docs/performance.md, "bf16 on AMX").

        Returns:
            The compiler ``Output`` when ``save_to`` is ``None``; otherwise ``None``.

        Raises:
            ExportError: the module does not verify (nothing was compiled).
            CompileError: IREE failed; ``.diagnostics`` holds its messages.
            TargetError: the target cannot compile this program correctly (fp16 on IREE's
                default Vulkan target: name one with ``--iree-vulkan-target=...``), or cannot
                give ``precision`` (bf16 on a CPU without AMX-BF16, or another target).
        """
        plan = self._plan_compile(
            target_backends=target_backends,
            target_device=target_device,
            extra_args=extra_args,
            host_cpu=host_cpu,
            precision=precision,
        )
        return self._compile_planned(plan, save_to)

    def _plan_compile(
        self,
        *,
        target_backends: str | Sequence[str] | None = ("llvm-cpu",),
        target_device: str | Sequence[str] | None = None,
        extra_args: Sequence[str] = (),
        host_cpu: bool = True,
        precision: str = "fp32",
    ) -> CompilePlan:
        """The flags :meth:`compile` would use for these arguments, computed once (the session's
        flags, turbine's defaults for the target and the program's traits, then ``extra_args``),
        checked against the program (:class:`TargetError` for what the target cannot compile
        correctly). :meth:`_compile_planned` compiles with them; the compile cache keys on them."""
        user_flags = [*self._session_flags(), *extra_args, *precision_flags(precision)]
        flags = compile_flags_for(
            target_backends=target_backends,
            target_device=target_device,
            host_cpu=host_cpu,
            extra_args=user_flags,
            traits=program_traits(self.mlir_module),
        )
        check_program_for_target(self.mlir_module, flags)
        named = " ".join(_as_list(target_device) or _as_list(target_backends)) or "session flags"
        return CompilePlan(flags=tuple(flags), user_flags=tuple(user_flags), target=named)

    def _compile_planned(
        self, plan: CompilePlan, save_to: str | Path | Output | None = None
    ) -> Output | None:
        """Compiles with a :meth:`_plan_compile`'s flags (``save_to`` as for :meth:`compile`).

        A default that is only a speed-up must not cost a compile: on failure, once more
        without the speed-only defaults (a warning names them)."""
        # Invalid IR would otherwise surface as an obscure bytecode error in the compiler.
        info = CompiledModule.get_info(self.compiled_module)
        if info.current_import_phase is None:  # an instance created with import_to=None
            CompiledModule.run_import(self.compiled_module, ImportPhase.IMPORT)
        self.verify()
        phase = info.current_import_phase
        compile_from = "input" if phase is not None and phase >= ImportPhase.FULL else None
        result, used = compile_with_fallback(
            lambda f: self._compile(f, save_to, compile_from, plan.target),
            list(plan.flags),
            list(plan.user_flags),
            errors=(CompileError,),
            logger=_log,
        )
        self._last_compile_flags = used
        return result

    def _compile(
        self,
        flags: list[str],
        save_to: str | Path | Output | None,
        compile_from: str | None,
        named: str,
    ) -> Output | None:
        # The .vmfb records its flags and compiler version (turbine-aot inspect shows them); the
        # exported IR stays target-neutral: target fixes go to a copy (compile_module).
        with compile_record(self.mlir_module, flags):
            return compile_module(
                self.mlir_module,
                flags,
                save_to,
                compile_from=compile_from,
                stage=f"compile ({named})",
            )

    def load(
        self,
        *,
        device: str | Sequence[str] = "local-task",
        parameters: Any = None,
        compile_flags: Sequence[str] | None = None,
        cache: Any = True,
        runtime_flags: Sequence[str] = (),
        parameter_memory: str | None = None,
    ) -> Any:
        """Compiles for ``device`` (through the compile cache), loads and returns the module.

        The one-call path from export to Python callables taking and returning torch tensors
        (see ``turbine_aot.runtime.load_module`` for the arguments).

        Example::

            compiled = turbine_aot.export(model, args=(x,)).load()
            y = compiled.main(x)
        """
        uris = normalize_devices(device)
        return load_module(
            self._vmfb_for_devices(uris, compile_flags=compile_flags, cache=cache),
            device=uris,
            parameters=parameters,
            runtime_flags=runtime_flags,
            signatures=self._flat_signatures(),
            parameter_memory=parameter_memory,
        )

    # ---- what the runtime reads of an export (``_runtime.loading.LoadableExport``) ---------
    def _vmfb_for_devices(
        self, devices: Sequence[str], *, compile_flags: Sequence[str] | None, cache: Any
    ) -> bytes:
        """The module compiled for these device URIs with turbine's defaults and
        ``compile_flags``, through the compile cache."""
        return compile_export_output(self, device=devices, compile_flags=compile_flags, cache=cache)

    def _flat_signatures(self) -> dict[str, FlatSignature]:
        """Each public function's flat ABI, read from the IR (the runtime's call checks)."""
        return signatures_from_mlir(self.mlir_module)

    def _session_flags(self) -> list[str]:
        # Replayed as set (list options such as --iree-hal-target-device keep one flag per value).
        return [f for f in session_flags(self.session) if not f.startswith("--iree-input-type=")]
