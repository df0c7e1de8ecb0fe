"""Parameter archives read into huge-page memory on CPU devices (``load_module(...,
parameter_memory=)``, docs/running.md "Parameter memory"): the policy as a pure function, the
mapping really eligible for transparent huge pages, every policy giving eager's results on
``local-sync`` and ``local-task``, and unreadable archives refused with the message of the
memory-mapped load. Real IREE throughout."""

from __future__ import annotations

import ctypes
import os
import re
import sys

import pytest
import torch

import turbine_aot
from turbine_aot import runtime as R
from turbine_aot._runtime import parameter_memory as pm
from turbine_aot._runtime.parameter_memory import HostMemory, resolve_policy, use_huge_pages

MiB = 1 << 20
THP_HOST = HostMemory(linux=True, thp_mode="madvise", mem_available=8 << 30)
CPU_DEVICES = ("local-sync", "local-task")


# --- the policy, a pure function ------------------------------------------------------------
def _auto(size: int = 64 * MiB, devices=("local-task",), host: HostMemory = THP_HOST) -> bool:
    return use_huge_pages("auto", archive_bytes=size, device_uris=list(devices), host=host)


def test_auto_copies_a_large_enough_archive_on_cpu_drivers_with_thp():
    assert _auto()
    assert _auto(devices=("local-sync",))
    assert _auto(devices=("local-task://", "local-sync://"))
    assert _auto(host=HostMemory(linux=True, thp_mode="always", mem_available=8 << 30))
    assert _auto(size=pm.MIN_HUGE_PAGE_ARCHIVE_BYTES)


def test_auto_maps_where_thp_is_off_or_missing():
    assert not _auto(host=HostMemory(linux=True, thp_mode="never", mem_available=8 << 30))
    assert not _auto(host=HostMemory(linux=True, thp_mode=None, mem_available=8 << 30))
    assert not _auto(host=HostMemory(linux=False, thp_mode=None, mem_available=8 << 30))


def test_auto_maps_a_small_archive():
    assert not _auto(size=pm.MIN_HUGE_PAGE_ARCHIVE_BYTES - 1)
    assert not _auto(size=4096)


@pytest.mark.parametrize(
    "devices",
    [("vulkan",), ("cuda",), ("hip://0",), ("local-task", "cuda"), ()],
    ids=["vulkan", "cuda", "hip", "cpu+cuda", "none"],
)
def test_auto_maps_for_non_cpu_devices(devices):
    assert not _auto(devices=devices)


def test_auto_maps_an_archive_above_half_the_available_memory():
    host = HostMemory(linux=True, thp_mode="madvise", mem_available=100 * MiB)
    assert _auto(size=50 * MiB, host=host)
    assert not _auto(size=50 * MiB + 1, host=host)
    assert not _auto(host=HostMemory(linux=True, thp_mode="madvise", mem_available=None))


def test_mmap_never_and_huge_pages_always_copy():
    never = HostMemory(linux=False, thp_mode=None, mem_available=None)
    for host in (THP_HOST, never):
        for devices in (["local-task"], ["vulkan"]):
            for size in (1, 64 * MiB):
                assert not use_huge_pages(
                    "mmap", archive_bytes=size, device_uris=devices, host=host
                )
                assert use_huge_pages(
                    "huge-pages", archive_bytes=size, device_uris=devices, host=host
                )
    # nothing to copy: an empty file is left to IREE's load
    assert not use_huge_pages("huge-pages", archive_bytes=0, device_uris=["local-task"], host=never)


def test_keyword_then_environment_then_auto():
    assert resolve_policy(None, {}) == "auto"
    assert resolve_policy(None, {pm.ENV_VAR: ""}) == "auto"
    assert resolve_policy(None, {pm.ENV_VAR: "mmap"}) == "mmap"
    assert resolve_policy("huge-pages", {pm.ENV_VAR: "mmap"}) == "huge-pages"
    assert resolve_policy("auto", {pm.ENV_VAR: "huge-pages"}) == "auto"


def test_unknown_policy_is_refused_naming_the_valid_ones(monkeypatch):
    valid = r"use one of 'auto', 'mmap', 'huge-pages'"
    with pytest.raises(R.TurbineRuntimeError, match=rf"parameter_memory='hugepages' .*{valid}"):
        resolve_policy("hugepages", {})
    with pytest.raises(
        R.TurbineRuntimeError, match=rf"\$TURBINE_PARAMETER_MEMORY='MMAP' .*{valid}"
    ):
        resolve_policy(None, {pm.ENV_VAR: "MMAP"})
    with pytest.raises(R.TurbineRuntimeError, match=valid):
        use_huge_pages("lazy", archive_bytes=1, device_uris=["local-task"], host=THP_HOST)
    # load_module checks it before reading anything else (these bytes are no module)
    with pytest.raises(R.TurbineRuntimeError, match=rf"parameter_memory='copy' .*{valid}"):
        R.load_module(b"not a module", parameter_memory="copy")
    monkeypatch.setenv(pm.ENV_VAR, "fast")
    with pytest.raises(R.TurbineRuntimeError, match=rf"PARAMETER_MEMORY='fast' .*{valid}"):
        R.load_module(b"not a module")


def test_host_settings_are_parsed():
    assert pm.parse_thp_mode("always [madvise] never\n") == "madvise"
    assert pm.parse_thp_mode("[always] madvise never") == "always"
    assert pm.parse_thp_mode("always madvise [never]") == "never"
    assert pm.parse_thp_mode("") is None
    meminfo = "MemTotal:       32000000 kB\nMemFree: 1 kB\nMemAvailable:   24168404 kB\n"
    assert pm.parse_mem_available(meminfo) == 24168404 * 1024
    assert pm.parse_mem_available("MemTotal: 1 kB\n") is None
    assert pm.thp_unavailable_reason(THP_HOST) is None
    off = HostMemory(linux=True, thp_mode="never", mem_available=None)
    assert "says [never]" in pm.thp_unavailable_reason(off)
    assert "Linux feature" in pm.thp_unavailable_reason(HostMemory(False, None, None))


# --- the mapping ----------------------------------------------------------------------------
def _thp_eligible(address: int) -> str | None:
    """The ``THPeligible:`` value of the mapping of /proc/self/smaps holding ``address``."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
            if head:
                inside = int(head.group(1), 16) <= address < int(head.group(2), 16)
            elif inside and line.startswith("THPeligible:"):
                return line.split()[1]
    return None


def _require_thp() -> None:
    if not sys.platform.startswith("linux"):
        pytest.skip("transparent huge pages are a Linux feature")
    reason = pm.thp_unavailable_reason(pm.host_memory())
    if reason is not None:
        pytest.skip(f"no transparent huge pages on this machine: {reason}")


# --- a small model, its archive, compiled once ----------------------------------------------
class _Mlp(torch.nn.Module):
    """Three 512x512 layers: 3.2 MB of fp32 weights, above the 2 MiB ``"auto"`` threshold."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(512, 512),
            torch.nn.GELU(),
            torch.nn.Linear(512, 512),
            torch.nn.GELU(),
            torch.nn.Linear(512, 512),
        )

    def forward(self, x):
        return self.layers(x)


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    """(model, input, eager result, archive path, compiled module bytes)."""
    model = _Mlp().eval()
    x = torch.randn(4, 512)
    with torch.no_grad():
        expected = model(x)
    turbine_aot.externalize_module_parameters(model)
    archive = tmp_path_factory.mktemp("params") / "mlp.irpa"
    turbine_aot.save_module_parameters(archive, model)
    assert archive.stat().st_size > pm.MIN_HUGE_PAGE_ARCHIVE_BYTES
    eo = turbine_aot.export(model, args=(x,))
    vmfb = bytes(eo.compile(save_to=None).map_memory())
    return model, x, expected, archive, vmfb


def _copies(m: R.LoadedModule) -> list[pm.ArchiveMemory]:
    return [k for k in m._keep_alive if isinstance(k, pm.ArchiveMemory)]


@pytest.mark.parametrize("device", CPU_DEVICES)
def test_every_policy_gives_eager_results(mlp, device):
    _, x, expected, archive, vmfb = mlp
    results = {}
    for policy in pm.POLICIES:
        m = R.load_module(vmfb, device=device, parameters=archive, parameter_memory=policy)
        results[policy] = m.main(x)
        torch.testing.assert_close(results[policy], expected, rtol=1e-4, atol=1e-4)
        # the policy took effect: a copy under huge-pages, IREE's map under mmap, auto as decided
        auto_copies = use_huge_pages(
            "auto",
            archive_bytes=archive.stat().st_size,
            device_uris=[device],
            host=pm.host_memory(),
        )
        wanted = {"mmap": 0, "huge-pages": 1, "auto": int(auto_copies)}[policy]
        assert len(_copies(m)) == wanted, policy
        for copy in _copies(m):
            assert copy.size == archive.stat().st_size
        # state and repeated calls read the same weights
        torch.testing.assert_close(m.main(x), results[policy], rtol=0, atol=0)
    assert torch.equal(results["mmap"], results["huge-pages"])
    assert torch.equal(results["mmap"], results["auto"])


def test_the_copy_is_eligible_for_transparent_huge_pages(mlp):
    _require_thp()
    _, x, expected, archive, vmfb = mlp
    m = R.load_module(vmfb, device="local-sync", parameters=archive, parameter_memory="auto")
    (copy,) = _copies(m)  # auto chose the copy: THP is on and the archive is above 2 MiB
    assert copy.advised
    eligible = _thp_eligible(copy.address)
    if eligible is None:
        pytest.skip("this kernel's /proc/self/smaps has no THPeligible lines (before 5.0)")
    assert eligible == "1"
    assert copy.address % pm.HUGE_PAGE_BYTES == 0  # the bytes start on a huge page
    # the last byte is in the same (huge-page eligible) mapping
    assert _thp_eligible(copy.address + copy.size - 1) == "1"
    torch.testing.assert_close(m.main(x), expected, rtol=1e-4, atol=1e-4)


def test_read_archive_holds_the_file_bytes(mlp):
    _, _, _, archive, _ = mlp
    copy = pm.read_archive(archive)
    try:
        data = archive.read_bytes()
        assert copy.size == len(data)
        assert ctypes.string_at(copy.address, 4096) == data[:4096]
        assert ctypes.string_at(copy.address + copy.size - 4096, 4096) == data[-4096:]
    finally:
        copy.close()
    assert copy.handle is None


def test_environment_variable_chooses_and_keyword_wins(mlp, monkeypatch):
    _, x, expected, archive, vmfb = mlp
    monkeypatch.setenv(pm.ENV_VAR, "huge-pages")
    m = R.load_module(vmfb, device="local-task", parameters=archive)
    assert len(_copies(m)) == 1
    torch.testing.assert_close(m.main(x), expected, rtol=1e-4, atol=1e-4)
    m = R.load_module(vmfb, device="local-task", parameters=archive, parameter_memory="mmap")
    assert not _copies(m)
    monkeypatch.setenv(pm.ENV_VAR, "mmap")
    m = R.load_module(vmfb, device="local-task", parameters={"model": [archive]})
    assert not _copies(m)


def test_huge_pages_without_thp_warns_and_auto_maps(mlp, monkeypatch, tmp_path):
    _, x, expected, archive, vmfb = mlp
    if not sys.platform.startswith("linux"):
        pytest.skip("the THP setting is read from Linux's sysfs")
    never = tmp_path / "enabled"
    never.write_text("always madvise [never]\n")
    monkeypatch.setattr(pm, "THP_ENABLED", never)
    with pytest.warns(RuntimeWarning, match=r"huge-pages'.*transparent huge pages are off"):
        m = R.load_module(vmfb, parameters=archive, parameter_memory="huge-pages")
    assert len(_copies(m)) == 1
    torch.testing.assert_close(m.main(x), expected, rtol=1e-4, atol=1e-4)
    m = R.load_module(vmfb, parameters=archive, parameter_memory="auto")
    assert not _copies(m)


# --- unreadable archives: the message of the memory-mapped load -----------------------------
def _load_error(vmfb: bytes, archive, policy: str) -> str:
    with pytest.raises(R.TurbineRuntimeError, match="could not read parameter archive") as e:
        R.load_module(vmfb, device="local-task", parameters=archive, parameter_memory=policy)
    return str(e.value)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "garbage.safetensors", "wrong-suffix"])
def test_a_damaged_archive_fails_as_under_mmap(mlp, tmp_path, damage):
    _, _, _, archive, vmfb = mlp
    data = archive.read_bytes()
    if damage == "truncated":
        bad = tmp_path / "w.irpa"
        bad.write_bytes(data[: len(data) // 2])
    elif damage == "wrong-suffix":
        bad = tmp_path / "w.bin"
        bad.write_bytes(data)
    else:
        bad = tmp_path / ("w.safetensors" if damage.endswith("safetensors") else "w.irpa")
        bad.write_bytes(os.urandom(3 * MiB))
    mmapped = _load_error(vmfb, bad, "mmap")
    assert _load_error(vmfb, bad, "huge-pages") == mmapped
    assert _load_error(vmfb, bad, "auto") == mmapped


def test_an_archive_that_shrinks_while_read_is_refused(mlp, monkeypatch):
    """The size is taken before reading; a file shorter than that when read (another process
    truncating it) is an unreadable archive, not a half-read one."""
    _, _, _, archive, vmfb = mlp
    real_fstat = os.fstat

    def grown_fstat(fd):  # the size the file had before "another process" truncated it
        st = real_fstat(fd)
        fields = list(st)
        fields[6] = st.st_size + 8192
        return os.stat_result(fields)

    monkeypatch.setattr(pm.os, "fstat", grown_fstat)
    message = _load_error(vmfb, archive, "huge-pages")
    assert "the file shrank while it was read" in message
    assert f"({archive.stat().st_size} of {archive.stat().st_size + 8192} bytes)" in message


# --- the loaders above load_module pass the policy through ----------------------------------
def test_load_bundle_and_export_load_take_the_policy(mlp, tmp_path):
    model, x, expected, archive, vmfb = mlp
    R.save_bundle(tmp_path / "b", vmfb, parameters=archive, device="local-task")
    for policy, copies in (("huge-pages", 1), ("mmap", 0)):
        m = R.load_bundle(tmp_path / "b", parameter_memory=policy)
        assert len(_copies(m)) == copies, policy
        torch.testing.assert_close(m.main(x), expected, rtol=1e-4, atol=1e-4)
    eo = turbine_aot.export(model, args=(x,))
    cache = R.CompileCache(tmp_path / "cc")  # not the user's cache
    for policy, copies in (("huge-pages", 1), ("mmap", 0)):
        m = eo.load(parameters=archive, parameter_memory=policy, cache=cache)
        assert len(_copies(m)) == copies, policy
        torch.testing.assert_close(m.main(x), expected, rtol=1e-4, atol=1e-4)


def test_llm_load_takes_the_policy(tmp_path):
    transformers = pytest.importorskip("transformers", reason="transformers is a test dependency")
    from turbine_aot import llm

    cfg = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    eo = llm.export_causal_lm(model, max_seq_len=32)
    eo.save_parameters(tmp_path / "w.irpa")
    prompt = torch.tensor([3, 1, 4, 1, 5])
    ids = {}
    for policy, copies in (("huge-pages", 1), ("mmap", 0)):
        lm = llm.load(eo, parameters=tmp_path / "w.irpa", parameter_memory=policy)
        assert len(_copies(lm.module)) == copies, policy
        ids[policy] = lm.generate(prompt, 8)
    from_memory = llm.load(eo).generate(prompt, 8)  # the export's in-memory weights
    assert torch.equal(ids["huge-pages"], ids["mmap"])
    assert torch.equal(ids["mmap"], from_memory)


def test_auto_counts_the_archives_a_load_already_copied(mlp, monkeypatch, tmp_path):
    """Each archive is judged against the memory the load's earlier copies left: with
    MemAvailable 2.5 archives, the first is copied (1 <= 1.25), the second mapped (1 > 0.75)."""
    _require_thp()
    _, x, expected, archive, vmfb = mlp
    size = archive.stat().st_size
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal: {size // 256} kB\nMemAvailable: {size * 5 // 2 // 1024} kB\n")
    monkeypatch.setattr(pm, "MEMINFO", meminfo)
    params = {"model": archive, "spare": archive}  # the second scope is bound, never read
    m = R.load_module(vmfb, device="local-task", parameters=params, parameter_memory="auto")
    assert len(_copies(m)) == 1
    torch.testing.assert_close(m.main(x), expected, rtol=1e-4, atol=1e-4)
    monkeypatch.setattr(pm, "MEMINFO", tmp_path / "missing")  # MemAvailable unknown: mmap
    m = R.load_module(vmfb, device="local-task", parameters=params, parameter_memory="auto")
    assert not _copies(m)
