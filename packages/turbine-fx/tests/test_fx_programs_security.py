"""FxPrograms.load on tampered files: it never leaves the descriptor's directory, never executes
anything from the files, and fails with an FxProgramsError naming the file and the field."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from turbine_fx import FxPrograms, FxProgramsBuilder, FxProgramsError


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        return self.proj(x)


def _save_set(directory: Path) -> Path:
    fxb = FxProgramsBuilder(Small())
    fxb.export_program(lambda m, x: m(x), args=(torch.randn(2, 4),), name="main")
    path = directory / "set.json"
    fxb.save(path)
    return path


def _edit(path: Path, edit) -> None:
    descriptor = json.loads(path.read_text())
    edit(descriptor)
    path.write_text(json.dumps(descriptor))


class _Reads:
    """Records every file the process opens (Python's audit events, and safetensors' own opens,
    which happen in Rust) while active."""

    _hook_installed = False
    _current: list[str] | None = None

    def __enter__(self) -> list[str]:
        if not _Reads._hook_installed:
            sys.addaudithook(_Reads._hook)
            _Reads._hook_installed = True
        _Reads._current = []
        import safetensors

        self._real_safe_open = safetensors.safe_open

        def spy(filename, *args, **kwargs):
            assert _Reads._current is not None
            _Reads._current.append(os.path.realpath(filename))
            return self._real_safe_open(filename, *args, **kwargs)

        safetensors.safe_open = spy
        return _Reads._current

    def __exit__(self, *exc) -> None:
        import safetensors

        safetensors.safe_open = self._real_safe_open
        _Reads._current = None

    @staticmethod
    def _hook(event: str, args: tuple) -> None:
        if _Reads._current is not None and event == "open" and isinstance(args[0], (str, Path)):
            _Reads._current.append(os.path.realpath(args[0]))


# -- item 2: every path of a descriptor stays inside the descriptor's directory ------------------


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("file", "../outside/g.ep.json", "'..'"),
        ("data_file", "../outside/t.safetensors", "'..'"),
        ("file", "/etc/passwd", "absolute"),
        ("data_file", "/etc/passwd", "absolute"),
        ("file", "sub/../set.g.ep.json", "'..'"),
        ("file", "sub/g.ep.json", "directory part"),
        ("file", "", "not a file name"),
        ("file", 7, "not a file name"),
        ("data_file", "t\0.safetensors", "NUL"),
    ],
)
def test_load_refuses_a_path_that_leaves_the_directory(tmp_path, field, value, why):
    path = _save_set(tmp_path / "set")
    outside = tmp_path / "outside"
    outside.mkdir()
    descriptor = json.loads(path.read_text())
    # Real copies outside, so a load that follows the path finds valid files there.
    (outside / "g.ep.json").write_bytes(
        (path.parent / descriptor["programs"]["main"]["file"]).read_bytes()
    )
    (outside / "t.safetensors").write_bytes((path.parent / descriptor["data_file"]).read_bytes())

    def edit(d):
        if field == "file":
            d["programs"]["main"]["file"] = value
        else:
            d["data_file"] = value

    _edit(path, edit)
    where = "programs.main.file" if field == "file" else "data_file"
    with _Reads() as reads, pytest.raises(FxProgramsError) as err:
        FxPrograms.load(path)
    message = str(err.value)
    assert str(path) in message and where in message and why in message
    assert not [r for r in reads if not r.startswith(os.path.realpath(path.parent))], reads
    assert os.path.realpath("/etc/passwd") not in reads


@pytest.mark.parametrize("field", ["file", "data_file"])
def test_load_refuses_a_symlink_that_leaves_the_directory(tmp_path, field):
    path = _save_set(tmp_path / "set")
    descriptor = json.loads(path.read_text())
    name = descriptor["programs"]["main"]["file"] if field == "file" else descriptor["data_file"]
    outside = tmp_path / "outside" / name
    outside.parent.mkdir()
    (path.parent / name).rename(outside)
    (path.parent / name).symlink_to(outside)  # the name the descriptor gives, pointing away
    with _Reads() as reads, pytest.raises(FxProgramsError, match="symbolic link") as err:
        FxPrograms.load(path)
    assert ("programs.main.file" if field == "file" else "data_file") in str(err.value)
    assert os.path.realpath(outside) not in reads


def test_a_symlink_that_stays_inside_the_directory_loads(tmp_path):
    path = _save_set(tmp_path)
    descriptor = json.loads(path.read_text())
    name = descriptor["programs"]["main"]["file"]
    (tmp_path / name).rename(tmp_path / "real.ep.json")
    (tmp_path / name).symlink_to("real.ep.json")
    assert list(FxPrograms.load(path).programs) == ["main"]


def test_load_refuses_a_graph_file_that_is_not_a_regular_file(tmp_path):
    """A FIFO in the directory would make a read block forever."""
    path = _save_set(tmp_path)
    descriptor = json.loads(path.read_text())
    name = descriptor["programs"]["main"]["file"]
    (tmp_path / name).unlink()
    os.mkfifo(tmp_path / name)
    with pytest.raises(FxProgramsError, match=r"programs\.main\.file.*not a regular file"):
        FxPrograms.load(path)


def test_etc_passwd_as_graph_is_rejected_before_it_is_read(tmp_path):
    path = _save_set(tmp_path)
    _edit(path, lambda d: d["programs"]["main"].__setitem__("file", "/etc/passwd"))
    with _Reads() as reads, pytest.raises(FxProgramsError, match="absolute path"):
        FxPrograms.load(path)
    assert set(reads) == {os.path.realpath(path)}  # the descriptor only


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("meta", 2, "expected true or false"),
        ("shape", [2**62, 2**62], "larger than any tensor"),
        ("shape", [-1], "integer >= 0"),
        ("dtype", "_dynamo", "torch dtype name"),
        ("dtype", "Tensor", "torch dtype name"),
    ],
)
def test_a_bad_tensor_description_is_an_error_naming_the_field(tmp_path, field, value, message):
    path = _save_set(tmp_path)

    def edit(d):
        d["tensors"]["t0"][field] = value
        d["tensors"]["t0"]["meta"] = d["tensors"]["t0"]["meta"] if field == "meta" else True

    _edit(path, edit)
    with pytest.raises(
        FxProgramsError, match=rf"set\.json: tensors\.t0\.{field}(\[0\])?: .*{message}"
    ):
        FxPrograms.load(path)


# -- item 1: no string of a graph file is ever evaluated ---------------------------------------


class Dynamic(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x, y):
        return self.proj(x[1:]) + y  # x: 2*d + 1 rows, y: 2*d rows (a derived dim)


@pytest.fixture(scope="module")
def dynamic_set(tmp_path_factory) -> Path:
    fxb = FxProgramsBuilder(Dynamic())
    d = torch.export.Dim("d", min=2, max=100)
    fxb.export_program(
        lambda m, x, y: m(x, y),
        args=(torch.randn(9, 4), torch.randn(8, 4)),
        dynamic_shapes={"args": ({0: 2 * d + 1}, {0: 2 * d})},
        name="main",
    )
    path = tmp_path_factory.mktemp("dynamic") / "set.json"
    fxb.save(path)
    return path


def _copy_set(src: Path, directory: Path) -> tuple[Path, Path]:
    """A copy of the saved set in ``directory``: (descriptor, graph file of 'main')."""
    for f in src.parent.iterdir():
        shutil.copy(f, directory / f.name)
    descriptor = json.loads(src.read_text())
    return directory / src.name, directory / descriptor["programs"]["main"]["file"]


def _first_expr(doc) -> dict:
    stack = [doc]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            if isinstance(v.get("expr_str"), str):
                return v
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    raise AssertionError("the dynamic program has no symbolic expression")


def _payload(marker: Path) -> str:
    """The issue's payload: a 'size' that runs a shell command when sympy evaluates it."""
    return (
        f"Symbol.__new__.__globals__['__builtins__']['__import__']('os').system('touch {marker}')"
    )


def _tamper(graph: Path, where: str, payload: str) -> None:
    doc = json.loads(graph.read_text())
    if where == "expr_str":
        _first_expr(doc)["expr_str"] = payload
    elif where == "range_constraints":
        doc["range_constraints"][payload] = {"min_val": 2, "max_val": 100}
    elif where == "guards_code":
        doc["guards_code"].append(payload)
    elif where == "target":
        doc["graph_module"]["graph"]["nodes"][0]["target"] = payload
    graph.write_text(json.dumps(doc))


def _torch_load(graph: Path, path: Path) -> None:
    """What loading did before it checked the graph: torch's deserializer on the file; then
    .module() (which compiles guards_code into a guard function when the program has example
    inputs) and a call."""
    from torch._export.serde.serialize import SerializedArtifact, deserialize

    descriptor = json.loads(path.read_text())
    from turbine_fx._fx_programs import _load_tensors

    tensors = _load_tensors(path.parent / descriptor["data_file"], descriptor["tensors"])
    binding = descriptor["bindings"]["main"]
    state = {k: tensors[v] for k, v in binding["state_dict"].items()}
    example = ((torch.randn(9, 4), torch.randn(8, 4)), {})
    ep = deserialize(SerializedArtifact(graph.read_bytes(), state, {}, example))  # type: ignore[arg-type]
    ep.module()(*example[0])


@pytest.mark.parametrize("where", ["expr_str", "guards_code"])
def test_the_payload_runs_in_torchs_own_deserializer(tmp_path, dynamic_set, where):
    """Proof that the payloads below are live: torch alone runs them (so the next test's
    checks are what keep them from running)."""
    path, graph = _copy_set(dynamic_set, tmp_path)
    marker = tmp_path / "ran"
    payload = (
        _payload(marker)
        if where == "expr_str"
        else f"__import__('os').system('touch {marker}') != 0"
    )
    _tamper(graph, where, payload)
    with pytest.raises(Exception):  # noqa: B017 - torch fails after running the command
        _torch_load(graph, path)
    assert marker.exists()


@pytest.mark.parametrize(
    ("where", "field"),
    [
        ("expr_str", "expr_str"),
        ("guards_code", "guards_code[1]"),
        ("range_constraints", "range_constraints["),
        ("target", "graph_module.graph.nodes[0].target"),
    ],
)
def test_load_refuses_a_code_payload_and_runs_nothing(tmp_path, dynamic_set, where, field):
    path, graph = _copy_set(dynamic_set, tmp_path)
    marker = tmp_path / "ran"
    assert len(json.loads(graph.read_text())["guards_code"]) == 1  # the payload is [1]
    payload = _payload(marker)
    _tamper(graph, where, payload)
    with pytest.raises(FxProgramsError) as err:
        FxPrograms.load(path)
    message = str(err.value)
    assert message.startswith(f"{graph}: ") and field in message, message
    assert "is not one torch writes" in message
    assert not marker.exists()
    # A load that follows it (the same process, torch's caches warm) still runs nothing.
    with pytest.raises(FxProgramsError):
        FxPrograms.load(path)
    assert not marker.exists()


def test_the_untampered_dynamic_set_loads_and_runs(dynamic_set):
    """The checks accept what torch wrote for a program with a derived dim (2*d + 1)."""
    ep = FxPrograms.load(dynamic_set).programs["main"]
    x, y = torch.randn(11, 4), torch.randn(10, 4)
    w, b = ep.state_dict["proj.weight"], ep.state_dict["proj.bias"]
    (out,) = ep.graph_module(w, b, x, y)
    torch.testing.assert_close(out, x[1:] @ w.T + b + y)
    assert sorted((r.lower, r.upper) for r in ep.range_constraints.values()) == [
        (2, 100),
        (4, 200),
        (5, 201),
    ]


class _Scale(nn.Module):
    def forward(self, x):
        return torch.nn.functional.interpolate(x, scale_factor=1.5)  # Float, ToFloat, TruncToInt


class _Unbacked(nn.Module):
    def forward(self, x):
        i = x.max().item()
        torch._check(i % 2 == 0)  # a modulo constraint on an unbacked size
        torch._check(i >= 2)
        return torch.ones(i // 2, max(i, 3))  # FloorDiv, Max


class _Pairs(nn.Module):
    def forward(self, x):
        return x.view(-1, 4) ** 2


@pytest.mark.parametrize(
    ("model", "args", "dynamic_shapes"),
    [
        (_Scale(), (torch.randn(1, 1, 8),), {"x": {2: torch.export.Dim("w", min=2)}}),
        (_Unbacked(), (torch.tensor([4, 2]),), None),
        (_Pairs(), (torch.randn(8, 2),), {"x": {0: 2 * torch.export.Dim("k", min=1)}}),
    ],
    ids=["float-scale", "unbacked-mod", "derived-even"],
)
def test_real_dynamic_exports_pass_the_checks_and_load(tmp_path, model, args, dynamic_shapes):
    """What torch 2.13 writes for programs with float scales, unbacked sizes with modulo
    constraints and derived dims is accepted (the strings the parsers were written against)."""
    from turbine_fx._fx_programs_exprs import check_sym_expr

    fxb = FxProgramsBuilder(model)
    fxb.export_program(
        lambda m, x: m(x),
        args=args,
        dynamic_shapes={"args": (dynamic_shapes["x"],)} if dynamic_shapes else None,
        name="main",
        strict=False,
    )
    fxb.save(tmp_path / "set.json")
    graph = tmp_path / json.loads((tmp_path / "set.json").read_text())["programs"]["main"]["file"]
    doc = json.loads(graph.read_text())
    exprs = [v["expr_str"] for v in _all_dicts(doc) if isinstance(v.get("expr_str"), str)]
    assert exprs, "the program has symbolic values"
    for text in exprs:
        check_sym_expr(text)
    loaded = FxPrograms.load(tmp_path / "set.json").programs["main"]
    assert len(loaded.range_constraints) == len(fxb.programs["main"].range_constraints)
    assert str(loaded.graph_module.code) == str(fxb.programs["main"].graph_module.code)


def _all_dicts(doc):
    stack = [doc]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            yield v
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
