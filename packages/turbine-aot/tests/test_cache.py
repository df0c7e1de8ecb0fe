"""The compile cache: hits, misses, corruption, size bound, concurrency, off switch."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from turbine_aot import runtime as R

MLIR = """
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %r = arith.addf %x, %x : tensor<4xf32>
  return %r : tensor<4xf32>
}
"""
FLAGS = [
    "--iree-hal-target-device=local",
    "--iree-hal-local-target-device-backends=vmvx",
]


def _run(vmfb: bytes) -> torch.Tensor:
    return R.load_module(vmfb).main(torch.arange(4.0))


def test_miss_then_hit_same_bytes(tmp_path):
    cache = R.CompileCache(tmp_path)
    a = R.compile_mlir(MLIR, FLAGS, cache=cache)
    assert (cache.stats.misses, cache.stats.hits, cache.stats.stores) == (1, 0, 1)
    b = R.compile_mlir(MLIR, FLAGS, cache=cache)
    assert cache.stats.hits == 1 and a == b
    torch.testing.assert_close(_run(b), 2 * torch.arange(4.0))
    assert len(cache.entries()) == 1


def test_key_depends_on_ir_flags_version_target():
    k = R.CompileCache.key(b"ir", ["--a"], target="t", version="1")
    assert k != R.CompileCache.key(b"ir2", ["--a"], target="t", version="1")
    assert k != R.CompileCache.key(b"ir", ["--b"], target="t", version="1")
    assert k != R.CompileCache.key(b"ir", ["--a"], target="u", version="1")
    assert k != R.CompileCache.key(b"ir", ["--a"], target="t", version="2")
    assert k == R.CompileCache.key(b"ir", ["--a"], target="t", version="1")
    assert "3.13" in R.compiler_version()


def test_key_depends_on_the_rewrites_revision(monkeypatch):
    """A module compiled before a rewrite changed (e.g. before the float -> uint8 cast fix,
    when IREE's lowering gave wrong values) is never served after it."""
    from turbine_aot._compiler import rewrites

    old = R.CompileCache.key(b"ir", ["--a"], target="t", version="1")
    monkeypatch.setattr(rewrites, "REVISION", rewrites.REVISION + 1)
    assert R.CompileCache.key(b"ir", ["--a"], target="t", version="1") != old


def test_a_cpu_build_is_not_served_to_another_cpu(tmp_path, monkeypatch):
    """A cache shared by two machines (a home directory on a network disk, a copied container
    image): a module built for one host CPU (``--iree-llvmcpu-target-cpu=host``, the default:
    its AVX-512 / AMX code and the rewrites' host-dependent choices) must be a miss on a CPU
    that differs, and a hit on the same one; GPU builds do not depend on the host CPU."""
    from turbine_aot._compiler import cache as cache_mod
    from turbine_aot._compiler import host

    cpu = [*FLAGS[:1], "--iree-hal-local-target-device-backends=llvm-cpu"]
    cpu.append("--iree-llvmcpu-target-cpu=host")
    gpu = ["--iree-hal-target-device=cuda"]
    flags = {"cpu": cpu, "gpu": gpu}
    keys = {n: R.CompileCache.key(b"ir", f, version="1") for n, f in flags.items()}
    cache = R.CompileCache(tmp_path)
    vmfb = R.compile_mlir(MLIR, FLAGS, cache=cache)
    cache.put(keys["cpu"], vmfb)

    real = host.cpu_vendor()
    other = "AuthenticAMD" if real == "GenuineIntel" else "GenuineIntel"
    monkeypatch.setattr(host, "cpu_vendor", lambda: other)
    assert R.CompileCache.key(b"ir", cpu, version="1") != keys["cpu"]
    assert cache.get(R.CompileCache.key(b"ir", cpu, version="1")) is None  # another CPU: a miss
    assert R.CompileCache.key(b"ir", gpu, version="1") == keys["gpu"]
    monkeypatch.setattr(host, "cpu_vendor", lambda: real)
    assert cache.get(R.CompileCache.key(b"ir", cpu, version="1")) == vmfb  # the same CPU: a hit
    assert not cache_mod._host_tuned(FLAGS)  # vmvx bytecode is the same on every CPU


def test_different_flags_miss(tmp_path):
    cache = R.CompileCache(tmp_path)
    R.compile_mlir(MLIR, FLAGS, cache=cache)
    R.compile_mlir(MLIR, [*FLAGS, "--iree-opt-level=O1"], cache=cache)
    assert cache.stats.misses == 2 and len(cache.entries()) == 2


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty"])
def test_corrupted_entry_is_detected_and_rebuilt(tmp_path, damage):
    cache = R.CompileCache(tmp_path)
    good = R.compile_mlir(MLIR, FLAGS, cache=cache)
    (path, _, _) = cache.entries()[0]
    raw = bytearray(path.read_bytes())
    if damage == "flip":
        raw[len(raw) // 2] ^= 0xFF
    elif damage == "truncate":
        raw = raw[: len(raw) - 100]
    else:
        raw = bytearray()
    path.write_bytes(bytes(raw))
    again = R.compile_mlir(MLIR, FLAGS, cache=cache)
    assert cache.stats.corrupted == 1 and cache.stats.stores == 2
    assert again == good
    torch.testing.assert_close(_run(again), 2 * torch.arange(4.0))
    assert R.CompileCache(tmp_path).get(R.CompileCache.key(b"x", [])) is None


def test_size_bound_evicts_least_recently_used(tmp_path):
    import os
    import time

    cache = R.CompileCache(tmp_path, max_bytes=10**9)
    for i in range(3):
        cache.put(f"{i:02d}" + "a" * 62, bytes(1000 + i))
    entries = sorted(cache.entries(), key=lambda e: e[0].name)
    # Make entry 1 the oldest and touch entry 0 by a hit.
    now = time.time()
    for n, (p, _, _) in enumerate(entries):
        os.utime(p, (now - 100 + n, now - 100 + n))
    assert cache.get("00" + "a" * 62) is not None
    small = R.CompileCache(tmp_path, max_bytes=1500)
    assert small.evict() == 2  # keeps only the most recently used one
    left = [p.name[:2] for p, _, _ in small.entries()]
    assert left == ["00"]


def test_disabled_cache_and_env_switch(tmp_path, monkeypatch):
    off = R.CompileCache(tmp_path, enabled=False)
    R.compile_mlir(MLIR, FLAGS, cache=off)
    assert off.entries() == [] and off.stats.stores == 0
    monkeypatch.setenv("TURBINE_COMPILE_CACHE_DIR", str(tmp_path / "envdir"))
    monkeypatch.setenv("TURBINE_COMPILE_CACHE", "0")
    R.compile_mlir(MLIR, FLAGS)  # default cache, turned off
    assert not (tmp_path / "envdir").exists()
    monkeypatch.setenv("TURBINE_COMPILE_CACHE", "1")
    R.compile_mlir(MLIR, FLAGS)
    assert R.default_compile_cache().directory == tmp_path / "envdir"
    assert len(R.default_compile_cache().entries()) == 1
    R.compile_mlir(MLIR, FLAGS, cache=False)  # per-call off switch


def _worker(args):
    directory, _ = args
    cache = R.CompileCache(directory)
    key = "ab" + "c" * 62
    payload = bytes([7]) * 50_000
    for _ in range(20):
        cache.put(key, payload)
        got = cache.get(key)
        assert got is None or got == payload  # never a torn entry
    return cache.stats.corrupted


def test_concurrent_writers_and_readers(tmp_path):
    # fork: workers start in milliseconds (spawn would re-import torch and IREE in each)
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    with ctx.Pool(2) as pool:
        corrupted = pool.map(_worker, [(str(tmp_path), i) for i in range(4)])
    assert corrupted == [0, 0, 0, 0]
    assert [p.name for p, _, _ in R.CompileCache(tmp_path).entries()] == ["ab" + "c" * 62 + ".vmfb"]
    assert not list(tmp_path.glob("ab/*.tmp"))


def test_compile_error_message():
    with pytest.raises(R.CompileError, match=r"iree-compile failed(.|\n)*undeclared SSA value"):
        R.compile_mlir("func.func @f() -> i32 { return %nope : i32 }", FLAGS, cache=False)


def test_one_compile_error_type_on_every_path():
    """compile_mlir (CLI, load_module of MLIR) and ExportOutput.compile fail with one class, so
    ``except turbine_aot.CompileError`` catches both, with diagnostics and flags attached."""
    import turbine_aot

    assert R.CompileError is turbine_aot.CompileError
    with pytest.raises(turbine_aot.CompileError) as info:
        R.compile_mlir("func.func @f() -> i32 { return %nope : i32 }", FLAGS, cache=False)
    assert any("undeclared SSA value" in d.message for d in info.value.errors)
    assert info.value.flags == list(FLAGS)


def test_unwritable_cache_does_not_fail_the_compile(tmp_path, caplog):
    """The cache only saves time: a cache directory that cannot be created or written (a file in
    its place, a read-only home) must leave a successful compile successful, with a warning."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    cache = R.CompileCache(blocker / "cache")
    mlir = "func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> { return %x : tensor<4xf32> }"
    vmfb = R.compile_mlir(mlir, FLAGS, cache=cache)
    assert cache.stats.stores == 0
    x = torch.arange(4.0)
    torch.testing.assert_close(R.load_module(vmfb).f(x), x)
    assert "not writable" in caplog.text


def test_drivers_of_one_target_share_one_compile(tmp_path, monkeypatch):
    """The key holds what decides the compiled bytes (IR, compiler, flags/targets), not the
    driver that runs them: loading on local-task then local-sync (both llvm-cpu, same flags)
    compiles once, on every path; another target compiles again."""
    import iree.compiler as ic

    import turbine_aot

    model = torch.nn.Linear(4, 3).eval()
    x = torch.randn(2, 4)
    eo = turbine_aot.export(model, args=(x,))
    cache = R.CompileCache(tmp_path / "eo")
    compiles: list = []
    real_compile = type(eo)._compile_planned  # what compile() and the cached compile call

    def counting_compile(self, plan, *args, **kwargs):
        compiles.append(plan.target)
        return real_compile(self, plan, *args, **kwargs)

    monkeypatch.setattr(type(eo), "_compile_planned", counting_compile)
    with torch.no_grad():
        expected = model(x)
    for device in ("local-task", "local-sync"):
        m = R.load_module(eo, device=device, cache=cache)
        torch.testing.assert_close(m.main(x), expected, rtol=1e-4, atol=1e-4)
    assert compiles == ["llvm-cpu"] and cache.stats.hits == 1
    assert len(cache.entries()) == 1

    # compile_mlir (turbine-aot compile / bundle pass the device URIs as the target label).
    cache = R.CompileCache(tmp_path / "mlir")
    calls: list = []
    real_compile_str = ic.compile_str
    monkeypatch.setattr(
        ic, "compile_str", lambda *a, **k: calls.append(1) or real_compile_str(*a, **k)
    )
    flags = {d: R.device_compile_flags([d]) for d in ("local-task", "local-sync")}
    assert flags["local-task"] == flags["local-sync"]
    for device, f in flags.items():
        vmfb = R.compile_mlir(MLIR, f, target=device, cache=cache)
        torch.testing.assert_close(
            R.load_module(vmfb, device=device).main(torch.arange(4.0)), 2 * torch.arange(4.0)
        )
    assert len(calls) == 1 and cache.stats.hits == 1
    R.compile_mlir(MLIR, FLAGS, target="local-task", cache=cache)  # vmvx: other bytes
    assert len(calls) == 2 and len(cache.entries()) == 2
