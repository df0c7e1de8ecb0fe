"""Helpers shared by turbine-ir tests."""

from __future__ import annotations

import re

import pytest
from ir_check import check_ir as _check_ir  # tools/ (the root conftest puts it on sys.path)


def _resource_blobs(asm: str) -> dict[str, bytes]:
    """Resource blobs of a printed module: name -> data bytes (alignment header stripped)."""
    out = {}
    for name, hexdata in re.findall(r'^\s*([\w.$-]+): "0x([0-9A-Fa-f]*)"', asm, re.MULTILINE):
        out[name] = bytes.fromhex(hexdata)[4:]
    return out


@pytest.fixture
def ctx():
    from turbine_ir import ir

    with ir.Context() as c, ir.Location.unknown():
        yield c


@pytest.fixture
def mb(ctx):
    from turbine_ir import ModuleBuilder, ir

    return ModuleBuilder(ir.Module.create().operation)


@pytest.fixture
def check_ir():
    """FileCheck-style ordered line matcher: ``check_ir(asm, *regexes)``."""
    return _check_ir


@pytest.fixture
def resource_blobs():
    """Parses the resource blobs of a printed module: ``{name: bytes}``."""
    return _resource_blobs
