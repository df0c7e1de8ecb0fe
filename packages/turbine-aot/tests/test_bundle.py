"""Deployable bundles: save, load with one call, run with iree-run-module, refuse misfits."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from turbine_aot import runtime as R

MLIR = """
module @bundled {
util.global private @w = #flow.parameter.named<"model"::"w"> : tensor<4xf32>
util.global private @s = #flow.parameter.named<"extra"::"s"> : tensor<4xf32>
func.func @main(%x: tensor<?x4xf32>) -> tensor<?x4xf32> {
  %w = util.global.load @w : tensor<4xf32>
  %s = util.global.load @s : tensor<4xf32>
  %c0 = arith.constant 0 : index
  %n = tensor.dim %x, %c0 : tensor<?x4xf32>
  %init = tensor.empty(%n) : tensor<?x4xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (j)>,
                                        affine_map<(i, j) -> (j)>, affine_map<(i, j) -> (i, j)>],
                       iterator_types = ["parallel", "parallel"]}
      ins(%x, %w, %s : tensor<?x4xf32>, tensor<4xf32>, tensor<4xf32>) outs(%init : tensor<?x4xf32>) {
    ^bb0(%a: f32, %b: f32, %c: f32, %o: f32):
      %m = arith.mulf %a, %b : f32
      %t = arith.addf %m, %c : f32
      linalg.yield %t : f32
  } -> tensor<?x4xf32>
  return %r : tensor<?x4xf32>
}
}
"""
W = torch.tensor([1.0, 2.0, 3.0, 4.0])
S = torch.tensor([0.5, 0.5, -1.0, 0.0])


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    import iree.runtime as rt

    d = tmp_path_factory.mktemp("parts")
    rt.save_archive_file({"w": W.numpy()}, str(d / "weights.irpa"))
    rt.save_archive_file({"s": S.numpy()}, str(d / "extra.irpa"))
    flags = R.device_compile_flags(["local-task"])
    vmfb = R.compile_mlir(MLIR, flags, cache=R.CompileCache(d / "cache"))
    return d, vmfb, flags


def _params(d: Path) -> dict:
    return {"model": d / "weights.irpa", "extra": [d / "extra.irpa"]}


def test_round_trip_directory(parts, tmp_path):
    d, vmfb, flags = parts
    b = R.save_bundle(tmp_path / "b", vmfb, parameters=_params(d), compile_flags=flags)
    man = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert man["format"] == "turbine-bundle" and man["module_name"] == "bundled"
    assert man["functions"]["main"]["inputs"] == [{"shape": [None, 4], "dtype": "f32"}]
    assert man["parameters"] == {"model": ["params/model.irpa"], "extra": ["params/extra.irpa"]}
    assert man["devices"][0]["target"] == "llvm-cpu" and man["compile_flags"] == flags
    assert man["versions"]["iree_runtime"].startswith("3.13")
    assert b.functions["main"].outputs[0].shape == (None, 4)
    m = R.load_bundle(tmp_path / "b")
    x = torch.randn(3, 4)
    torch.testing.assert_close(m.main(x), x * W + S)
    # A later device choice of the same kind works.
    torch.testing.assert_close(
        R.load_bundle(tmp_path / "b", device="local-sync").main(x), x * W + S
    )


@pytest.mark.parametrize("name", ["b.tar", "b.tar.gz"])
def test_round_trip_archive(parts, tmp_path, name):
    d, vmfb, _ = parts
    R.save_bundle(tmp_path / name, vmfb, parameters=_params(d))
    assert (tmp_path / name).is_file()
    x = torch.randn(2, 4)
    torch.testing.assert_close(R.load_bundle(tmp_path / name).main(x), x * W + S)


def test_archive_unpacked_copy_is_removed(parts, tmp_path, monkeypatch):
    """Loading a .tar bundle unpacks it to a temporary directory that goes with the module (and
    at once when the archive is refused), never one full copy of the weights per load."""
    import gc
    import tarfile
    import tempfile

    d, vmfb, _ = parts
    R.save_bundle(tmp_path / "b.tar", vmfb, parameters=_params(d))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    m = R.load_bundle(tmp_path / "b.tar")
    x = torch.randn(2, 4)
    torch.testing.assert_close(m.main(x), x * W + S)
    assert len(list(scratch.iterdir())) == 1
    del m
    gc.collect()
    assert list(scratch.iterdir()) == []
    # An archive without a manifest: refused, and nothing is left behind either.
    with tarfile.open(tmp_path / "bad.tar", "w") as tf:
        tf.add(d / "extra.irpa", arcname="extra.irpa")
    for load in (R.load_bundle, R.read_bundle):
        with pytest.raises(R.BundleError, match="not a turbine bundle"):
            load(tmp_path / "bad.tar")
        assert list(scratch.iterdir()) == []


_KILLED_LOADER = r"""
import sys, time
from turbine_aot import runtime as R
m = R.load_bundle(sys.argv[1])
print("loaded", flush=True)
time.sleep(600)
"""


def test_unpacked_copy_of_a_killed_loader_is_removed_by_the_next_load(parts, tmp_path):
    """A process killed (SIGKILL) while it holds a .tar bundle cannot remove the copy it
    unpacked into the temp directory; the next archive load does (owner-named directory)."""
    import os
    import signal
    import stat

    d, vmfb, _ = parts
    R.save_bundle(tmp_path / "b.tar", vmfb, parameters=_params(d))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_LOADER, str(tmp_path / "b.tar")],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout.readline().strip() == "loaded"
    finally:
        proc.kill()
        proc.wait(timeout=60)
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    (left,) = scratch.iterdir()
    assert left.name.startswith(".turbine-bundle.turbine~") and (left / "manifest.json").exists()
    assert stat.S_IMODE(left.stat().st_mode) == 0o700  # private, as mkdtemp's
    loader = subprocess.run(
        [sys.executable, "-c", _KILLED_LOADER.replace("time.sleep(600)", ""), tmp_path / "b.tar"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert loader.returncode == 0, loader.stderr
    assert list(scratch.iterdir()) == []


def test_bundle_has_the_usual_permissions_and_no_leftovers(parts, tmp_path, monkeypatch):
    """A deployed bundle is readable like any file the user writes (umask, not mkdtemp's 0700 /
    mkstemp's 0600), and a failed archive write leaves neither a temp dir nor a temp file."""
    import os
    import tarfile

    d, vmfb, _ = parts
    mask = os.umask(0o022)
    os.umask(mask)
    out = tmp_path / "out"
    R.save_bundle(out / "b", vmfb, parameters=_params(d))
    R.save_bundle(out / "b.tar.gz", vmfb, parameters=_params(d))
    assert (out / "b").stat().st_mode & 0o777 == 0o777 & ~mask
    assert (out / "b.tar.gz").stat().st_mode & 0o777 == 0o666 & ~mask
    assert sorted(p.name for p in out.iterdir()) == ["b", "b.tar.gz"]

    def broken_add(self, *args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(tarfile.TarFile, "add", broken_add)
    with pytest.raises(OSError, match="disk full"):
        R.save_bundle(out / "c.tar", vmfb, parameters=_params(d))
    assert sorted(p.name for p in out.iterdir()) == ["b", "b.tar.gz"]


def test_overwrite_replaces_bundles_only(parts, tmp_path):
    """overwrite=True replaces an earlier bundle (or a file), but never deletes a directory
    that is not a bundle (``-o ~/models --force`` must not wipe ~/models)."""
    d, vmfb, _ = parts
    precious = tmp_path / "models"
    precious.mkdir()
    (precious / "keep.txt").write_text("mine")
    with pytest.raises(R.BundleError, match="not a bundle"):
        R.save_bundle(precious, vmfb, parameters=_params(d), overwrite=True)
    assert (precious / "keep.txt").read_text() == "mine"
    R.save_bundle(tmp_path / "b", vmfb, parameters=_params(d))
    R.save_bundle(tmp_path / "b", vmfb, parameters=_params(d), overwrite=True)
    (tmp_path / "f").write_text("a file")
    R.save_bundle(tmp_path / "f", vmfb, parameters=_params(d), overwrite=True)
    x = torch.randn(2, 4)
    for name in ("b", "f"):
        torch.testing.assert_close(R.load_bundle(tmp_path / name).main(x), x * W + S)


def test_runs_with_iree_run_module(parts, tmp_path):
    d, vmfb, _ = parts
    b = R.save_bundle(tmp_path / "b", vmfb, parameters=_params(d))
    exe = shutil.which("iree-run-module") or str(Path(sys.executable).parent / "iree-run-module")
    if not Path(exe).exists():
        pytest.skip("iree-run-module is not installed (it comes with iree-base-runtime)")
    for args in (
        b.iree_run_module_args(),
        [f"--flagfile={b.manifest['iree_run_module']['flagfile']}"],
    ):
        out = subprocess.run(
            [exe, *args, "--function=main", "--input=2x4xf32=1,1,1,1,2,2,2,2"],
            cwd=b.path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert "2x4xf32=[1.5 2.5 2 4][2.5 4.5 5 8]" in out.stdout.replace("\n", ""), out.stdout


def test_refuses_other_device_and_version(parts, tmp_path):
    d, vmfb, _ = parts
    R.save_bundle(tmp_path / "b", vmfb, parameters=_params(d))
    with pytest.raises(R.BundleError, match=r"built for llvm-cpu .*not for device 'vulkan'"):
        R.load_bundle(tmp_path / "b", device="vulkan")
    with pytest.raises(R.BundleError, match=r"built for 1 device"):
        R.load_bundle(tmp_path / "b", device=["local-task", "local-task"])
    man_path = tmp_path / "b" / "manifest.json"
    man = json.loads(man_path.read_text())
    man["versions"]["iree_compiler"] = "2.9.0"
    man_path.write_text(json.dumps(man))
    with pytest.raises(R.BundleError, match=r"built with IREE 2.9.0 but this runtime is IREE 3.13"):
        R.load_bundle(tmp_path / "b")


def test_refuses_another_runtime_release_unless_told(parts, tmp_path):
    """The rule of docs/running.md: a module loads only under the IREE release that built and
    bundled it; the manifest's runtime version counts too (it was ignored when a compiler
    version was recorded), and check_versions=False overrides."""
    d, vmfb, _ = parts
    R.save_bundle(tmp_path / "b", vmfb, parameters=_params(d))
    man_path = tmp_path / "b" / "manifest.json"
    man = json.loads(man_path.read_text())
    man["versions"]["iree_runtime"] = "2.0.0"
    man_path.write_text(json.dumps(man))
    with pytest.raises(
        R.BundleError,
        match=r"built with IREE 2\.0\.0 but this runtime is IREE 3\.13.*IREE runtime version.*"
        r"check_versions=False \(CLI: --ignore-versions\)",
    ):
        R.load_bundle(tmp_path / "b")
    x = torch.randn(2, 4)
    m = R.load_bundle(tmp_path / "b", check_versions=False)
    torch.testing.assert_close(m.main(x), x * W + S)
    man["versions"]["iree_runtime"] = ["3.13"]
    man_path.write_text(json.dumps(man))
    with pytest.raises(R.BundleError, match=r"versions.iree_runtime is \['3.13'\], not a version"):
        R.load_bundle(tmp_path / "b")


_KILLED_BUNDLER = r"""
import sys, tarfile, time
import turbine_aot._bundle.write as B
vmfb, params, dest = sys.argv[1:4]

def stop(*args):
    print("writing", flush=True)
    time.sleep(600)

if dest.endswith(".tar"):
    tarfile.TarFile.addfile = stop  # the temp .tar is half written
else:
    B._link_or_copy = stop  # the work directory is half filled
B.save_bundle(dest, vmfb, parameters=params)
"""


@pytest.mark.parametrize("name", ["b", "b.tar"])
def test_killed_save_leaves_litter_the_next_save_removes(parts, tmp_path, name):
    """kill -9 in the middle of save_bundle leaves its work directory (and temp archive); they
    are named for their owner, so the next save to the same path removes them."""
    import signal

    d, vmfb, _ = parts
    (tmp_path / "m.vmfb").write_bytes(vmfb)
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _KILLED_BUNDLER,
            tmp_path / "m.vmfb",
            d / "weights.irpa",
            out / name,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "writing"
    finally:
        proc.kill()
        proc.wait(timeout=60)
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    litter = sorted(p.name for p in out.iterdir())
    assert len(litter) == (2 if name == "b.tar" else 1), litter
    assert all(p.startswith(f".{name}.turbine~") for p in litter), litter
    R.save_bundle(out / name, vmfb, parameters=_params(d))
    assert sorted(p.name for p in out.iterdir()) == [name]
    x = torch.randn(2, 4)
    torch.testing.assert_close(R.load_bundle(out / name).main(x), x * W + S)


def test_bundle_errors(parts, tmp_path):
    d, vmfb, _ = parts
    with pytest.raises(R.BundleError, match="does not exist"):
        R.load_bundle(tmp_path / "nope")
    with pytest.raises(R.BundleError, match=r"parameter archive .* does not exist"):
        R.save_bundle(tmp_path / "b", vmfb, parameters=tmp_path / "missing.irpa")
    assert not (tmp_path / "b").exists()  # nothing half-written
    R.save_bundle(tmp_path / "b", vmfb, parameters=_params(d))
    with pytest.raises(R.BundleError, match="already exists"):
        R.save_bundle(tmp_path / "b", vmfb, parameters=_params(d))
    R.save_bundle(tmp_path / "b", vmfb, parameters=_params(d), overwrite=True)
    (tmp_path / "b" / "module.vmfb").write_bytes(vmfb[:-10])
    with pytest.raises(R.BundleError, match="does not match the manifest's sha256"):
        R.load_bundle(tmp_path / "b")
    (tmp_path / "nb").mkdir()
    with pytest.raises(R.BundleError, match="not a turbine bundle"):
        R.load_bundle(tmp_path / "nb")


def test_two_device_bundle(tmp_path):
    sys.path.insert(0, str(Path(__file__).parent))
    from test_runtime_devices import TWO_DEVICE_MLIR

    devices = ["local-task", "local-task"]
    vmfb = R.compile_mlir(TWO_DEVICE_MLIR, R.device_compile_flags(devices), cache=False)
    b = R.save_bundle(tmp_path / "two", vmfb, device=devices)
    assert [d["uri"] for d in b.manifest["devices"]] == devices
    assert b.functions["main"].inputs[1].device == "__device_1"
    m = R.load_bundle(tmp_path / "two")
    x, y = torch.randn(4), torch.randn(4)
    torch.testing.assert_close(m.main(x, y), x * x + 2 * y)
    with pytest.raises(R.BundleError, match=r"built for 2 device"):
        R.load_bundle(tmp_path / "two", device="local-task")
    exe = Path(sys.executable).parent / "iree-run-module"
    if exe.exists():
        out = subprocess.run(
            [
                str(exe),
                "--flagfile=iree-run-module.flags",
                "--function=main",
                "--input=4xf32=1,2,3,4",
                "--input=4xf32=1,1,1,1",
            ],
            cwd=b.path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert "4xf32=3 6 11 18" in out.stdout, out.stdout


def _tar_with(path: Path, good: Path, add) -> None:
    """An archive holding the valid bundle ``good`` plus what ``add(tarfile)`` puts in."""
    import tarfile

    with tarfile.open(path, "w") as tf:
        for p in sorted(good.rglob("*")):
            tf.add(p, arcname=str(p.relative_to(good)), recursive=False)
        add(tf)


def _member(name: str, kind: bytes | None = None, linkname: str = "", data: bytes = b"x"):
    import io
    import tarfile

    info = tarfile.TarInfo(name)
    if kind is None:
        info.size = len(data)
        return info, io.BytesIO(data)
    info.type, info.linkname = kind, linkname
    return info, None


@pytest.mark.parametrize("old_python", [False, True], ids=["data-filter", "no-filter"])
def test_malicious_archives_are_refused_before_anything_is_written(
    parts, tmp_path, monkeypatch, old_python
):
    """A crafted archive (``..``, an absolute path, links leaving the bundle, a device file) is a
    BundleError naming the member, and nothing is unpacked, outside or inside; also on a Python
    without tarfile's extraction filters (< 3.10.12), where our checks are the only guard."""
    import tarfile

    d, vmfb, _ = parts
    good = R.save_bundle(tmp_path / "good", vmfb, parameters=_params(d)).path
    victim = tmp_path / "victim"
    victim.mkdir()
    if old_python:
        monkeypatch.delattr(tarfile, "data_filter")
    cases = {
        "dotdot": (_member("../victim/x"), "'..' component"),
        "nested-dotdot": (_member("params/../../victim/y"), "'..' component"),
        "absolute": (_member(str(victim / "abs")), "absolute path"),
        "symlink-etc": (_member("params/etc", tarfile.SYMTYPE, "/etc"), "symbolic link"),
        "symlink-up": (_member("up", tarfile.SYMTYPE, "../victim"), "symbolic link"),
        "hardlink-passwd": (_member("pw", tarfile.LNKTYPE, "/etc/passwd"), "hard link"),
        "device": (_member("dev", tarfile.CHRTYPE), "device"),
        "fifo": (_member("fifo", tarfile.FIFOTYPE), "FIFO"),
    }
    for case, ((info, data), why) in cases.items():
        archive = tmp_path / f"{case}.tar"
        _tar_with(archive, good, lambda tf, info=info, data=data: tf.addfile(info, data))
        out = tmp_path / f"out-{case}"
        with pytest.raises(R.BundleError, match=rf"unsafe member .*\(.*{why}.*Rebuild it"):
            R.read_bundle(archive, extract_to=out)
        with pytest.raises(R.BundleError, match=f"unsafe member '{info.name}'"):
            R.load_bundle(archive)
        assert not out.exists(), case  # refused before extraction began
        assert list(victim.iterdir()) == [], case
    # A member written through an (inside) symlink to a directory outside is refused too.
    archive = tmp_path / "through.tar"

    def add_through(tf):
        tf.addfile(*_member("lnk", tarfile.SYMTYPE, "params"))
        tf.addfile(*_member("lnk/z"))

    _tar_with(archive, good, add_through)
    with pytest.raises(R.BundleError, match="path through the link 'lnk'"):
        R.read_bundle(archive, extract_to=tmp_path / "out-through")
    assert not (tmp_path / "out-through").exists()


def test_archive_with_inside_links_and_shared_parameter_file_loads(tmp_path):
    """What save_bundle writes for one archive used by two scopes (a hard link inside the tar)
    and a relative symlink that stays inside are accepted."""
    import tarfile

    import iree.runtime as rt

    rt.save_archive_file({"w": W.numpy(), "s": S.numpy()}, str(tmp_path / "both.irpa"))
    vmfb = R.compile_mlir(MLIR, R.device_compile_flags(["local-task"]), cache=False)
    both = tmp_path / "both.irpa"
    R.save_bundle(tmp_path / "b.tar", vmfb, parameters={"model": both, "extra": both})
    with tarfile.open(tmp_path / "b.tar") as tf:
        assert any(m.islnk() for m in tf.getmembers())
    x = torch.randn(2, 4)
    torch.testing.assert_close(R.load_bundle(tmp_path / "b.tar").main(x), x * W + S)
    good = R.read_bundle(tmp_path / "b.tar", extract_to=tmp_path / "x").path
    _tar_with(
        tmp_path / "sym.tar",
        good,
        lambda tf: tf.addfile(*_member("params/alias.irpa", tarfile.SYMTYPE, "model.irpa")),
    )
    b = R.read_bundle(tmp_path / "sym.tar", extract_to=tmp_path / "y")
    assert (b.path / "params" / "alias.irpa").resolve() == (b.path / "params/model.irpa").resolve()


def test_manifest_paths_outside_the_bundle_are_refused(parts, tmp_path):
    d, vmfb, _ = parts
    R.save_bundle(tmp_path / "b", vmfb, parameters=_params(d))
    man_path = tmp_path / "b" / "manifest.json"
    original = json.loads(man_path.read_text())
    (tmp_path / "outside.vmfb").write_bytes(vmfb)
    for edit, what in (
        ({"module": "../outside.vmfb"}, r"module file '\.\./outside\.vmfb' \(a '\.\.' component"),
        ({"parameters": {"model": [str(d / "weights.irpa")]}}, "scope 'model' file .*absolute"),
    ):
        man_path.write_text(json.dumps({**original, **edit}))
        with pytest.raises(R.BundleError, match=what):
            R.load_bundle(tmp_path / "b")


def _replace(path: Path, data: bytes) -> None:
    """Rewrites a bundle file without touching its hard-linked source (a new inode)."""
    path.unlink()
    path.write_bytes(data)


@pytest.mark.parametrize("name", ["b", "b.tar"])
def test_parameter_files_are_hashed_and_checked(parts, tmp_path, name):
    """The manifest records each file's size and SHA-256; a truncated parameter file is refused
    on every load, a same-size corruption by verify=True / Bundle.verify(), naming the file."""
    import hashlib
    import tarfile

    d, vmfb, _ = parts
    b = R.save_bundle(tmp_path / "b", vmfb, parameters=_params(d))
    files = b.manifest["files"]
    assert set(files) == {"module.vmfb", "params/model.irpa", "params/extra.irpa"}
    weights = (d / "weights.irpa").read_bytes()
    assert files["params/model.irpa"] == {
        "size": len(weights),
        "sha256": hashlib.sha256(weights).hexdigest(),
    }
    b.verify()
    x = torch.randn(2, 4)
    torch.testing.assert_close(R.load_bundle(b.path, verify=True).main(x), x * W + S)

    def damaged(data: bytes) -> Path:
        _replace(b.path / "params" / "model.irpa", data)
        if name == "b":
            return b.path
        with tarfile.open(tmp_path / name, "w") as tf:
            for p in sorted(b.path.rglob("*")):
                tf.add(p, arcname=str(p.relative_to(b.path)), recursive=False)
        return tmp_path / name

    src = damaged(weights[:-7])
    with pytest.raises(R.BundleError, match=r"'params/model.irpa' .* is \d+ bytes .*truncated"):
        R.load_bundle(src)
    flipped = bytearray(weights)
    flipped[-1] ^= 0xFF
    src = damaged(bytes(flipped))
    R.read_bundle(src, extract_to=tmp_path / "x")  # sizes match: only hashing can tell
    with pytest.raises(R.BundleError, match=r"'params/model.irpa' .*does not match .*sha256"):
        R.load_bundle(src, verify=True)
    with pytest.raises(R.BundleError, match=r"'params/model.irpa' .*does not match .*sha256"):
        R.read_bundle(src, extract_to=tmp_path / "y").verify()
    assert (d / "weights.irpa").read_bytes() == weights  # the source was never touched


def test_bundle_without_file_hashes_still_loads(parts, tmp_path):
    """A bundle written before per-file hashes loads; verify() says how to get them."""
    d, vmfb, _ = parts
    R.save_bundle(tmp_path / "b", vmfb, parameters=_params(d))
    man_path = tmp_path / "b" / "manifest.json"
    man = json.loads(man_path.read_text())
    del man["files"]
    man_path.write_text(json.dumps(man))
    x = torch.randn(2, 4)
    torch.testing.assert_close(R.load_bundle(tmp_path / "b").main(x), x * W + S)
    with pytest.raises(R.BundleError, match=r"no per-file SHA-256 .*rebuild it"):
        R.read_bundle(tmp_path / "b").verify()
