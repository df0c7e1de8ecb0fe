"""Fuzzing bundles: tampered manifests and damaged archives either load or raise BundleError
(a TurbineRuntimeError), never another exception, a crash or a file written outside.

Bounded by a fixed number of examples; no per-example deadline (CI machines are loaded).
"""

from __future__ import annotations

import contextlib
import copy
import json
import shutil
import tarfile
from pathlib import Path

import pytest
import torch

from turbine_aot import runtime as R

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

MLIR = """
module @fuzzed {
util.global private @w = #flow.parameter.named<"model"::"w"> : tensor<4xf32>
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %w = util.global.load @w : tensor<4xf32>
  %init = tensor.empty() : tensor<4xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> (i)>,
                                        affine_map<(i) -> (i)>],
                       iterator_types = ["parallel"]}
      ins(%x, %w : tensor<4xf32>, tensor<4xf32>) outs(%init : tensor<4xf32>) {
    ^bb0(%a: f32, %b: f32, %o: f32):
      %m = arith.mulf %a, %b : f32
      linalg.yield %m : f32
  } -> tensor<4xf32>
  return %r : tensor<4xf32>
}
}
"""
W = torch.tensor([1.0, 2.0, 3.0, 4.0])
_TRIED = {"tampered manifests": 0, "damaged archives": 0, "loaded": 0}


@pytest.fixture(scope="module", autouse=True)
def _report_count():
    yield
    print(f"\nbundle fuzz: inputs tried: {_TRIED}")


@pytest.fixture(scope="module")
def seed(tmp_path_factory) -> tuple[Path, Path, dict]:
    import iree.runtime as rt

    d = tmp_path_factory.mktemp("seed")
    rt.save_archive_file({"w": W.numpy()}, str(d / "w.irpa"))
    vmfb = R.compile_mlir(MLIR, R.device_compile_flags(["local-task"]), cache=False)
    b = R.save_bundle(d / "b", vmfb, parameters=d / "w.irpa")
    R.save_bundle(d / "b.tar", vmfb, parameters=d / "w.irpa")
    return b.path, d / "b.tar", b.manifest


def _try_load(path: Path, extract_to: Path | None = None) -> None:
    try:
        m = R.load_bundle(path)
    except R.TurbineRuntimeError:
        return
    _TRIED["loaded"] += 1
    x = torch.ones(4)
    with contextlib.suppress(R.TurbineRuntimeError):
        m.main(x)


_json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.sampled_from(
            [
                "",
                "module.vmfb",
                "params/model.irpa",
                "../outside",
                "/etc/passwd",
                "params/../../x",
                "2.0.0",
                "3.13.0",
                "local",
                "local-task",
                "vulkan",
                "tensor<4xf32>",
            ]
        ),
        st.text(max_size=8),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=6,
)


def _paths(obj, prefix=()):
    """Every (path to a value) of a JSON document."""
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, (*prefix, i))


def _set(doc, path, value, delete: bool):
    if not path:
        return value
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return doc


@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    edits=st.lists(
        st.tuples(st.integers(0, 10**6), _json_values, st.booleans()), min_size=1, max_size=3
    ),
)
def test_tampered_manifests_load_or_raise_bundle_error(seed, tmp_path_factory, edits):
    good, _, manifest = seed
    doc = copy.deepcopy(manifest)
    for pick, value, delete in edits:
        paths = list(_paths(doc))
        path = paths[pick % len(paths)]
        doc = _set(doc, path, value, delete and bool(path))
    work = tmp_path_factory.mktemp("m") / "b"
    shutil.copytree(good, work)
    (work / "manifest.json").write_text(json.dumps(doc))
    _TRIED["tampered manifests"] += 1
    _try_load(work)
    assert sorted(p.name for p in work.parent.iterdir()) == ["b"]  # nothing written beside it


@settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    flips=st.lists(st.tuples(st.integers(0, 10**9), st.integers(1, 255)), max_size=6),
    truncate=st.one_of(st.none(), st.integers(0, 10**9)),
)
def test_damaged_archives_load_or_raise_bundle_error(seed, tmp_path_factory, flips, truncate):
    _, tar, _ = seed
    data = bytearray(tar.read_bytes())
    for pos, x in flips:
        data[pos % len(data)] ^= x
    if truncate is not None:
        del data[truncate % (len(data) + 1) :]
    work = tmp_path_factory.mktemp("t")
    (work / "b.tar").write_bytes(bytes(data))
    _TRIED["damaged archives"] += 1
    _try_load(work / "b.tar")
    assert sorted(p.name for p in work.iterdir()) == ["b.tar"]


def test_same_size_module_corruption_is_refused_before_iree_sees_it(seed, tmp_path, monkeypatch):
    """The module's SHA-256 (manifest) is checked on every load, before the module is mapped:
    IREE does not verify modules, and a flipped byte can crash it."""
    good, _, _ = seed
    work = tmp_path / "b"
    shutil.copytree(good, work)
    mod = work / "module.vmfb"
    data = bytearray(mod.read_bytes())
    data[len(data) // 2] ^= 0x40
    mod.unlink()
    mod.write_bytes(bytes(data))
    import turbine_aot._bundle.load as B

    def never(*args, **kwargs):
        raise AssertionError("the module reached load_module")

    monkeypatch.setattr(B, "load_module", never)
    with pytest.raises(R.BundleError, match=r"module.vmfb' does not match the manifest's sha256"):
        R.load_bundle(work)


def test_seed_bundles_load(seed):
    good, tar, _ = seed
    x = torch.randn(4)
    for path in (good, tar):
        torch.testing.assert_close(R.load_bundle(path).main(x), x * W)
    assert tarfile.is_tarfile(tar)


def test_a_manifest_without_parameters_loads_as_a_bundle_without_parameters(seed, tmp_path):
    """Found by the fuzz test above: a manifest with no "parameters" key passed the manifest
    check (it is optional) and then raised KeyError in Bundle.parameters()."""
    src, _, manifest = seed
    work = tmp_path / "b"
    shutil.copytree(src, work)
    doc = dict(manifest)
    del doc["parameters"]
    (work / "manifest.json").write_text(json.dumps(doc))
    from turbine_aot._bundle.read import read_bundle

    assert read_bundle(work).parameters() == {}
