"""Fixtures of the turbine-trace tests: a module under construction and IR checks."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from turbine_ir import ModuleBuilder, ir
from turbine_trace import ProcedureTrace


class ModuleHarness:
    """A module being built, with helpers to trace procedures into it and check its IR."""

    def __init__(self, context: ir.Context, loc: ir.Location):
        self.context = context
        self.loc = loc
        self.module = ir.Module.create(loc)
        self.mb = ModuleBuilder(self.module.operation)

    def proc(
        self,
        name: str,
        posargs: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        arg_device: dict | None = None,
    ) -> Callable[[Callable[..., Any]], ProcedureTrace]:
        """Decorator: traces the function into ``func.func @name``; returns the trace."""

        def deco(fn: Callable[..., Any]) -> ProcedureTrace:
            trace = ProcedureTrace.define_func(
                self.mb,
                symbol_name=name,
                posargs=posargs,
                kwargs=kwargs or {},
                loc=self.loc,
                arg_device=arg_device,
            )
            trace.trace_py_func(fn)
            return trace

        return deco

    def track(self, globals_def: Any, namespace: str) -> Any:
        return globals_def.track(self.mb, namespace)

    def asm(self) -> str:
        self.mb.finalize_construct()
        return str(self.module)

    def check(self, *patterns: str) -> str:
        """FileCheck-style: each pattern (a regex) matches a later part of the IR than the last."""
        text = self.asm()
        pos = 0
        for pattern in patterns:
            m = re.compile(pattern).search(text, pos)
            if m is None:
                raise AssertionError(
                    f"pattern not found after offset {pos}: {pattern!r}\n--- IR ---\n{text}"
                )
            pos = m.end()
        return text

    def load(self, iree_device: Any, *, parameters: dict | None = None) -> Any:
        """Compiles the module for the test device and loads it."""
        return iree_device.load(iree_device.compile(self.asm()), parameters=parameters)


@pytest.fixture
def harness():
    with ir.Context() as context, ir.Location.unknown(context) as loc:
        yield ModuleHarness(context, loc)
