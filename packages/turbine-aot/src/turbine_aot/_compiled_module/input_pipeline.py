"""The IREE input pipeline: from the imported torch dialect to IREE's input form, in place."""

from __future__ import annotations

import io

from .info import CompiledModuleInstanceInfo

__all__ = [
    "run_iree_input_pipeline",
]


def run_iree_input_pipeline(info: CompiledModuleInstanceInfo) -> None:
    """Runs IREE's input pipeline (``--compile-to=input``) on the module, in place."""
    from .._compiler.session import CapturedInvocation, new_session

    module_op = info.module_op
    if info.session is not None:
        with CapturedInvocation(
            info.session, stage="import to 'full' (IREE input pipeline)"
        ) as inv:
            inv.inv.import_module(module_op)
            inv.run_pipeline(compile_to="input")
        return
    # The module lives in a context we do not own a session for: round trip through a session
    # of our own (bytecode in, text out: text parses from any buffer alignment).
    from iree.compiler.api import Output

    from turbine_ir.ir import Module

    data = io.BytesIO()
    module_op.write_bytecode(data)
    session = new_session()
    with CapturedInvocation(session, stage="import to 'full' (IREE input pipeline)") as inv:
        inv.parse_bytes(data.getvalue())
        inv.run_pipeline(compile_to="input")
        out = Output.open_membuffer()
        inv.inv.output_ir(out)
        result = bytes(out.map_memory()).decode("utf-8")
    with module_op.context:
        new_module = Module.parse(result)
        body = module_op.regions[0].blocks[0]
        for op in list(body.operations):
            op.erase()
        for op in list(new_module.body.operations):
            body.append(op)
